"""The sample's shards and plain files: Object Detection API Examples, raw pixel arrays,
SequenceExample clips and a GZIP shard of tabular Examples, each record from its own seeded
``random.Random``; ``write_sample`` writes them all under a folder, and ``main`` is
``python -m tfrfs.sample DEST``."""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from PIL import Image, ImageDraw

from tfrfs.format import proto
from tfrfs.format.tfrecord import GZIP, NONE, StreamWriter
from tfrfs.sample.draw import CLASS_ID, CLASSES, DRAWERS, Box, draw_background, draw_digit, draw_scene, encode, place_object

SEED = 1729

OD_WIDTH, OD_HEIGHT = 160, 120
OD_SPLITS: tuple[tuple[str, int, int], ...] = (("train", 2, 12), ("val", 1, 6))  # split, shards, records per shard
RGB_WIDTH, RGB_HEIGHT = 32, 24
CLIP_WIDTH, CLIP_HEIGHT = 64, 48


# --- feature helpers -------------------------------------------------------

def _set_bytes(features: Any, key: str, values: Iterable[bytes | str]) -> None:
    lst = features.feature[key].bytes_list
    lst.SetInParent()  # so an empty list still has its kind set
    lst.value.extend(v.encode() if isinstance(v, str) else v for v in values)


def _set_floats(features: Any, key: str, values: Iterable[float]) -> None:
    lst = features.feature[key].float_list
    lst.SetInParent()
    lst.value.extend(values)


def _set_ints(features: Any, key: str, values: Iterable[int]) -> None:
    lst = features.feature[key].int64_list
    lst.SetInParent()
    lst.value.extend(values)


def _write_shard(path: Path, records: Iterable[bytes], compression: str = NONE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        writer = StreamWriter(f, compression)
        for data in records:
            writer.write(data)
        writer.close()
    return path


def _rng(*parts: object) -> random.Random:
    # A string seed is hashed with SHA-512 by ``random``, so it is stable across runs and
    # platforms, unlike ``hash()`` of a tuple, which is salted per process for strings.
    return random.Random(":".join(str(p) for p in (SEED, *parts)))


# --- Object Detection API shards ---------------------------------------------

def _od_example(img: Image.Image, boxes: Sequence[Box], fmt: str, filename: str, source_id: str) -> Any:
    encoded = encode(img, fmt)
    ex = proto.Example()
    f = ex.features
    _set_bytes(f, "image/encoded", [encoded])
    _set_bytes(f, "image/format", [fmt])
    _set_bytes(f, "image/filename", [filename])
    _set_bytes(f, "image/source_id", [source_id])
    _set_bytes(f, "image/key/sha256", [hashlib.sha256(encoded).hexdigest()])
    _set_ints(f, "image/height", [img.height])
    _set_ints(f, "image/width", [img.width])
    norm = [b.normalised(img.width, img.height) for b in boxes]
    _set_floats(f, "image/object/bbox/xmin", [n[0] for n in norm])
    _set_floats(f, "image/object/bbox/ymin", [n[1] for n in norm])
    _set_floats(f, "image/object/bbox/xmax", [n[2] for n in norm])
    _set_floats(f, "image/object/bbox/ymax", [n[3] for n in norm])
    _set_bytes(f, "image/object/class/text", [b.cls for b in boxes])
    _set_ints(f, "image/object/class/label", [CLASS_ID[b.cls] for b in boxes])
    return ex


def _od_records(split_name: str, shard: int, count: int, first_id: int) -> list[bytes]:
    records = []
    for i in range(count):
        image_id = first_id + i
        rng = _rng("od", split_name, shard, i)
        if i == 0:
            n = rng.randint(2, 4)  # the first record of every shard shows several objects
        elif split_name == "val" and i == count - 1:
            n = 0  # a background-only image: empty box and class lists, as real datasets have
        else:
            n = rng.choice((1, 2, 2, 3, 3, 4))
        img, boxes = draw_scene(rng, OD_WIDTH, OD_HEIGHT, n)
        fmt = "png" if image_id % 7 == 3 else "jpeg"
        ext = "png" if fmt == "png" else "jpg"
        filename = "Zoë.jpg" if (split_name, shard, i) == ("train", 0, 4) else f"{split_name}_{image_id:05d}.{ext}"
        ex = _od_example(img, boxes, fmt, filename, str(image_id))
        records.append(ex.SerializeToString(deterministic=True))
    return records


def _label_map() -> str:
    lines = ["# Label map for the tfrfs sample, in the TF Object Detection API text format."]
    for cid, name, display in CLASSES:
        lines += ["item {", f"  id: {cid}", f'  name: "{name}"', f'  display_name: "{display}"', "}"]
    return "\n".join(lines) + "\n"


# --- raw pixel arrays --------------------------------------------------------

def _mnist_records(count: int = 20) -> list[bytes]:
    records = []
    for i in range(count):
        label = i % 10
        img = draw_digit(_rng("mnist", i), label)
        ex = proto.Example()
        f = ex.features
        # The layout of TensorFlow's old MNIST tutorial (convert_to_records.py).
        _set_ints(f, "height", [img.height])
        _set_ints(f, "width", [img.width])
        _set_ints(f, "depth", [1])
        _set_ints(f, "label", [label])
        _set_bytes(f, "image_raw", [img.tobytes()])
        records.append(ex.SerializeToString(deterministic=True))
    return records


def _raw_rgb_records(count: int = 8) -> list[bytes]:
    records = []
    names = [name for _, name, _ in CLASSES]
    for i in range(count):
        cls = names[i % len(names)]
        rng = _rng("rgb", i)
        big, _ = draw_scene(rng, OD_WIDTH, OD_HEIGHT, 1, [cls])
        img = big.resize((RGB_WIDTH, RGB_HEIGHT), Image.Resampling.BOX)
        ex = proto.Example()
        f = ex.features
        # Raw pixels under image/encoded: a real-world trap (the key says "encoded", the bytes are not).
        _set_bytes(f, "image/encoded", [img.tobytes()])
        _set_ints(f, "image/height", [RGB_HEIGHT])
        _set_ints(f, "image/width", [RGB_WIDTH])
        _set_ints(f, "image/channels", [3])
        _set_ints(f, "image/class/label", [CLASS_ID[cls]])
        _set_bytes(f, "image/class/text", [cls])
        records.append(ex.SerializeToString(deterministic=True))
    return records


# --- SequenceExample clips ---------------------------------------------------

def _clip_records(count: int = 4) -> list[bytes]:
    records = []
    names = [name for _, name, _ in CLASSES]
    for i in range(count):
        rng = _rng("clip", i)
        cls = names[i % len(names)]
        steps = 4 + i % 3
        background, horizon = draw_background(rng, CLIP_WIDTH, CLIP_HEIGHT)
        start = place_object(rng, cls, CLIP_WIDTH, CLIP_HEIGHT, horizon)
        w, h = start.x1 - start.x0, start.y1 - start.y0
        # One object walks across the frame and pauses once; the walk stays inside the frame.
        pause = rng.randint(1, steps - 1)
        step = rng.randint(3, 5)
        moves = [0 if t in (0, pause) else step for t in range(steps)]
        direction = rng.choice((-1, 1))
        travel = sum(moves)
        lo, hi = (0, CLIP_WIDTH - w - travel) if direction > 0 else (travel, CLIP_WIDTH - w)
        x = rng.randint(lo, max(lo, hi))
        look = Image.new("RGBA", (w, h), (0, 0, 0, 0))
        DRAWERS[cls](ImageDraw.Draw(look), rng, 0, 0, w, h)
        if direction < 0:
            look = look.transpose(Image.Transpose.FLIP_LEFT_RIGHT)

        seq = proto.SequenceExample()
        _set_bytes(seq.context, "video/id", [f"clip-{i + 1:04d}"])
        _set_ints(seq.context, "video/label", [CLASS_ID[cls]])
        _set_ints(seq.context, "video/num_frames", [steps])
        _set_floats(seq.context, "video/frame_rate", [12.5])
        lists = seq.feature_lists.feature_list
        boxes, tags, jpegs = lists["frames/boxes"], lists["frames/tags"], lists["frames/jpeg"]
        for t, move in enumerate(moves):
            x += direction * move
            box = Box(cls, x, start.y0, x + w, start.y1)
            frame = background.copy()
            frame.paste(look, (box.x0, box.y0), look)
            boxes.feature.add().float_list.value.extend(box.normalised(CLIP_WIDTH, CLIP_HEIGHT))
            # Steps hold one or two tags, so the per-step arrays differ in length.
            tag_values = [cls] if t == 0 else [cls, "moving" if move else "still"]
            tags.feature.add().bytes_list.value.extend(v.encode() for v in tag_values)
            jpegs.feature.add().bytes_list.value.append(encode(frame, "jpeg"))
        records.append(seq.SerializeToString(deterministic=True))
    return records


# --- tabular ---------------------------------------------------------------

_CITIES = ("Austin", "Zürich", "São Paulo", "Kraków", "Lagos", "Tokyo", "Montréal", "Oslo")
_PLANS = ("free", "pro", "team")
_TAGS = ("mobile", "newsletter", "referral", "trial")
_NOTES = ("asked for an invoice", "prefers email", "moved from the free plan", "reported a bug in the app")


def _tabular_records(count: int = 50) -> list[bytes]:
    records = []
    for i in range(count):
        rng = _rng("tab", i)
        plan = rng.choices(_PLANS, weights=(5, 3, 2))[0]
        spend = {"free": 0.0, "pro": 9.99, "team": 29.0}[plan] + round(rng.uniform(0, 40), 2) * (plan != "free")
        satisfaction = round(rng.betavariate(5, 2), 3)
        ex = proto.Example()
        f = ex.features
        _set_ints(f, "customer_id", [10_000 + i])
        _set_ints(f, "age", [rng.randint(18, 79)])
        _set_bytes(f, "city", [rng.choice(_CITIES)])
        _set_bytes(f, "plan", [plan])
        _set_floats(f, "monthly_spend", [round(spend, 2)])
        _set_floats(f, "satisfaction", [satisfaction])
        _set_ints(f, "visits", [rng.randint(0, 30) for _ in range(3)])  # the last three months
        _set_bytes(f, "tags", sorted(rng.sample(_TAGS, rng.choice((0, 1, 1, 2, 3)))))
        if rng.random() < 0.2:  # an optional column: most records lack it
            _set_bytes(f, "notes", [rng.choice(_NOTES)])
        _set_ints(f, "churned", [int(satisfaction < 0.55 and rng.random() < 0.7)])
        records.append(ex.SerializeToString(deterministic=True))
    return records


# --- the whole sample --------------------------------------------------------

def write_sample(dest: Path) -> list[Path]:
    """Write the sample dataset under ``dest`` (created if missing); returns the files written.

    Files already there with the same names are overwritten; nothing else is touched.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    shards: dict[str, dict[str, Any]] = {}

    def shard(rel: str, records: list[bytes], kind: str, compression: str = NONE) -> None:
        written.append(_write_shard(dest / rel, records, compression))
        shards[rel] = {"records": len(records), "kind": kind, "compression": compression}

    first_id = 1
    for split, n_shards, per_shard in OD_SPLITS:
        for s in range(n_shards):
            shard(f"{split}/{split}-{s:05d}-of-{n_shards:05d}.tfrecord",
                  _od_records(split, s, per_shard, first_id), "example")
            first_id += per_shard
    shard("mnist_raw.tfrecord", _mnist_records(), "example")
    shard("raw_rgb.tfrecord", _raw_rgb_records(), "example")
    shard("clips.tfrecord", _clip_records(), "sequence")
    shard("tabular.tfrecord.gz", _tabular_records(), "example", GZIP)

    label_map = dest / "label_map.pbtxt"
    label_map.write_text(_label_map(), encoding="utf-8")
    written.append(label_map)

    info = {
        "name": "tfrfs_sample",
        "version": "1.0.0",
        "description": "A small synthetic dataset drawn with Pillow by tfrfs.sample: object detection "
                       "scenes, raw pixel arrays, video clips and a tabular table.",
        "label_map": "label_map.pbtxt",
        "shards": shards,
        "conventions": {
            "image/object/bbox/*": "normalised to [0, 1] by image width and height",
            "frames/boxes": "per frame [xmin, ymin, xmax, ymax], normalised",
            "image_raw": "uint8 gray, height x width x depth",
            "raw_rgb image/encoded": "raw uint8 RGB pixels, height x width x channels (not an encoded image)",
        },
    }
    info_path = dest / "dataset_info.json"
    info_path.write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    written.append(info_path)
    return sorted(written)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfrfs.sample",
                                     description="Write tfrfs's built-in sample dataset to DEST.")
    parser.add_argument("dest", metavar="DEST", type=Path, help="a new or empty folder")
    args = parser.parse_args(argv)
    dest: Path = args.dest
    if dest.exists() and not dest.is_dir():
        print(f"tfrfs.sample: {dest} exists and is not a folder", file=sys.stderr)
        return 2
    if dest.is_dir() and any(dest.iterdir()):
        print(f"tfrfs.sample: {dest} is not empty; refusing to overwrite it (give a new or empty folder)",
              file=sys.stderr)
        return 2
    try:
        files = write_sample(dest)
    except OSError as exc:
        print(f"tfrfs.sample: cannot write {dest}: {exc}", file=sys.stderr)
        return 2
    total = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{p.stat().st_size:>9,}  {p.relative_to(dest)}")
    print(f"wrote {len(files)} files, {total:,} bytes, to {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
