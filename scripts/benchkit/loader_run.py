"""The child side of ``scripts/bench --loader`` (loader.py): each run is a process of its own, so
that TensorFlow and PyTorch never share one and nothing read stays in a process from one run to
the next.

    python loader_run.py build OUT RECORDS SHARDS     write the dataset with TensorFlow
    python loader_run.py measure SPEC_JSON            two passes of one loader; JSON on stdout

``measure`` times two passes over every record: the first from making the dataset object (listing
the record folders, opening the shards) to the last batch, the second (warm) through the same
dataset object again. Each pass counts the records and sums their labels, which loader.py checks
against what ``build`` wrote.
"""

from __future__ import annotations

import bisect
import glob
import io
import itertools
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SIDE = 224          # every image is SIDE x SIDE RGB: the default collate stacks a batch
BASES = 400         # distinct scenes; each record is a shifted, tinted, noisy crop of one


# --- the dataset, written by TensorFlow -------------------------------------------------

def build(out: str, records: int, shards: int) -> None:
    """``shards`` files ``train-NNNNN-of-NNNNN.tfrecord`` in ``out``, ``records`` in all, each a
    ``tf.train.Example`` of ``image`` (a JPEG encoded by ``tf.io.encode_jpeg``) and ``label``
    (int64, 0..999); written by ``tf.io.TFRecordWriter``. Prints a JSON summary."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(20260601)
    pad = 32
    big = SIDE + pad
    yy, xx = np.mgrid[0:big, 0:big]

    def scene() -> Any:
        # A smooth colour field with discs and boxes over it.
        grid = rng.uniform(0, 255, (int(rng.integers(3, 9)), int(rng.integers(3, 9)), 3)).astype(np.float32)
        img = tf.image.resize(grid[None], (big, big), method="bicubic")[0].numpy()
        for _ in range(int(rng.integers(3, 9))):
            cy, cx, r = rng.uniform(0, big), rng.uniform(0, big), rng.uniform(8, 60)
            if rng.random() < 0.5:
                m = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
            else:
                m = (abs(yy - cy) < r) & (abs(xx - cx) < r * rng.uniform(0.3, 1.5))
            img[m] = img[m] * 0.3 + rng.uniform(0, 255, 3) * 0.7
        return img

    scenes = [scene() for _ in range(BASES)]
    grain = [rng.normal(0, 6, (SIDE, SIDE, 3)).astype(np.float32) for _ in range(16)]
    per, spare = divmod(records, shards)
    os.makedirs(out, exist_ok=True)
    label_sum = jpeg_bytes = 0
    i = 0
    for s in range(shards):
        path = os.path.join(out, f"train-{s:05d}-of-{shards:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(per + (s < spare)):
                y, x = rng.integers(0, pad + 1, 2)
                img = scenes[int(rng.integers(BASES))][y:y + SIDE, x:x + SIDE] * rng.uniform(0.8, 1.2, 3)
                img = img + grain[i % len(grain)]
                if rng.random() < 0.5:
                    img = img[:, ::-1]
                jpeg = tf.io.encode_jpeg(np.clip(img, 0, 255).astype(np.uint8),
                                         quality=int(rng.integers(75, 91))).numpy()
                label = int(rng.integers(1000))
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }))
                writer.write(ex.SerializeToString())
                label_sum += label
                jpeg_bytes += len(jpeg)
                i += 1
    print(json.dumps({"records": i, "label_sum": label_sum, "jpeg_mean_bytes": round(jpeg_bytes / i),
                      "side": SIDE, "tensorflow": tf.__version__}))


# --- the map-style Datasets (the ones README's "Training from a tfrfs dataset" shows) ----

def read(path: str) -> bytes:
    # buffering=0: a buffered open() asks the file whether it is a terminal (an ioctl), which
    # on a FUSE mount is a round trip to the daemon on every open, even with every byte cached
    with open(path, "rb", buffering=0) as f:
        return f.read()


class RecordFolders:
    """Records of a mounted dataset (or a copy of its tree): item i is (image, label), the image
    an RGB array decoded from the record folder's ``image.jpg``, the label from ``label.json``."""

    def __init__(self, root: str) -> None:
        self.records = sorted(glob.glob(os.path.join(root, "*.tfrecord", "*")))

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        from PIL import Image
        folder = self.records[i]
        with Image.open(io.BytesIO(read(os.path.join(folder, "image.jpg")))) as im:
            image = np.array(im.convert("RGB"))
        label = json.loads(read(os.path.join(folder, "label.json")))[0]
        return image, label


class RecordFoldersByPath(RecordFolders):
    """The same, with the files opened as most code opens them: ``Image.open(path)`` and a
    buffered ``open`` (each asks the file whether it is a terminal)."""

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        from PIL import Image
        folder = self.records[i]
        with Image.open(os.path.join(folder, "image.jpg")) as im:
            image = np.array(im.convert("RGB"))
        with open(os.path.join(folder, "label.json")) as f:
            label = json.load(f)[0]
        return image, label


class TfrfsRecords:
    """The same items read with ``tfrfs.open``, no mount: each process (every DataLoader worker)
    opens the dataset itself, the first time it asks for an item."""

    def __init__(self, source: str, **options: Any) -> None:
        import tfrfs
        self.source, self.options = source, options
        with tfrfs.open(source, **options) as ds:
            self.shards = [s.path for s in ds.shards]
            self.ends = list(itertools.accumulate(s.records for s in ds.shards))
        self._ds: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getstate__(self) -> dict:           # workers started by spawn open their own
        return {**self.__dict__, "_ds": None, "_pid": -1}

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        import tfrfs
        from PIL import Image
        if self._pid != os.getpid():
            self._ds, self._pid = tfrfs.open(self.source, **self.options), os.getpid()
        n = bisect.bisect_right(self.ends, i)
        example = self._ds.example(self.shards[n], i - (self.ends[n - 1] if n else 0))
        with Image.open(io.BytesIO(example["image"][0])) as im:
            image = np.array(im.convert("RGB"))
        return image, example["label"][0]


# --- the runs ---------------------------------------------------------------------

def _consume(batches: Any) -> tuple[int, int]:
    records = label_sum = 0
    for _images, labels in batches:
        records += len(labels)
        label_sum += int(labels.sum())
    return records, label_sum


def _cpu(daemon: int | None) -> float:
    """CPU seconds of this process, of its children that ended (DataLoader workers are joined at
    the end of each pass) and of the mount's daemon."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    if daemon:
        with open(f"/proc/{daemon}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _two_passes(make: Any, passes: Any, daemon: int | None) -> dict[str, Any]:
    c0, t0 = _cpu(daemon), time.perf_counter()
    obj = make()
    made = time.perf_counter()
    cold = _consume(passes(obj))
    c1, t1 = _cpu(daemon), time.perf_counter()
    warm = _consume(passes(obj))
    c2, t2 = _cpu(daemon), time.perf_counter()
    return {"cold_s": t1 - t0, "warm_s": t2 - t1, "make_s": made - t0, "cold": cold, "warm": warm,
            "cold_cpu_s": c1 - c0, "warm_cpu_s": c2 - c1}


def run_torch(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    kind, workers, batch = spec["kind"], spec["workers"], spec["batch"]

    def loader(ds: Any) -> Any:
        if kind == "tfrecord":   # an IterableDataset: it splits the shards among the workers itself
            return DataLoader(ds, batch_size=batch, num_workers=workers)
        return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                          generator=torch.Generator().manual_seed(spec["seed"]))

    if kind == "folders":
        make = lambda: loader(RecordFolders(spec["root"]))  # noqa: E731
    elif kind == "folders-path":
        make = lambda: loader(RecordFoldersByPath(spec["root"]))  # noqa: E731
    elif kind == "library":
        make = lambda: loader(TfrfsRecords(spec["root"], cache_dir=spec["cache_dir"]))  # noqa: E731
    elif kind == "tfrecord":
        from PIL import Image
        import numpy as np
        from tfrecord.torch.dataset import MultiTFRecordDataset

        def decode(features: dict) -> tuple[Any, int]:
            with Image.open(io.BytesIO(features["image"])) as im:
                image = np.array(im.convert("RGB"))
            return image, int(features["label"][0])

        def make() -> Any:
            names = sorted(n[:-len(".tfrecord")] for n in os.listdir(spec["root"]) if n.endswith(".tfrecord"))
            ds = MultiTFRecordDataset(os.path.join(spec["root"], "{}.tfrecord"),
                                      os.path.join(spec["index_dir"], "{}.idx"), {n: 1.0 for n in names},
                                      description={"image": "byte", "label": "int"}, transform=decode,
                                      infinite=False)
            return loader(ds)
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    return _two_passes(make, lambda dl: iter(dl), spec.get("daemon_pid"))


def run_tf(spec: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf

    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record: Any) -> Any:
        ex = tf.io.parse_single_example(record, features)
        return tf.io.decode_jpeg(ex["image"], channels=3), ex["label"]

    def make() -> Any:
        files = sorted(os.path.join(spec["root"], n) for n in os.listdir(spec["root"]) if n.endswith(".tfrecord"))
        return (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
                .map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(spec["batch"]).prefetch(tf.data.AUTOTUNE))

    return _two_passes(make, lambda ds: ((i, l.numpy()) for i, l in ds), spec.get("daemon_pid"))


def main(argv: list[str]) -> None:
    if argv[:1] == ["build"] and len(argv) == 4:
        build(argv[1], int(argv[2]), int(argv[3]))
        return
    if argv[:1] == ["measure"] and len(argv) == 2:
        spec = json.loads(argv[1])
        out = run_tf(spec) if spec["kind"] == "tf" else run_torch(spec)
        print(json.dumps(out))
        return
    raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
