"""Writable mounts edited with ordinary tools, committed, and read back by REAL TensorFlow.

Every case works on a fresh copy of the built-in sample (``tfrfs.sample``): mount ``--rw``, edit
with the tool (``cp``, ``cp -a``, ``cp -r``, ``mv``, ``rm -r``, ``rsync -a``, ``truncate``, shell
redirection, ``sed -i``, ``vim -es``), commit, then read every shard of the dataset with
``tf.data.TFRecordDataset`` and ``tf.train.Example``/``SequenceExample`` and compare with what the
edits must give (SPEC 7): exactly the expected records, in order; records no edit touched
byte-identical to the originals; shards no edit touched not rewritten at all.

TensorFlow is imported once, by one worker subprocess per module (``TFReader``) that answers
requests on stdin: importing TensorFlow takes seconds, and a request takes milliseconds.
"""

from __future__ import annotations

import base64
import errno
import importlib.util
import inspect
import json
import os
import shutil
import struct
import subprocess
import textwrap
from pathlib import Path
from typing import Any, Union

import pytest
from PIL import Image

from tfrfs.format import codec
from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.sample import write_sample

from conftest import daemon_pids, is_mounted, run_tfrfs, wait_ended
from support.tfworker import TfWorker
from support import reference

pytestmark = [pytest.mark.mount]

# The sample's shards and their record kinds.
SHARDS = {
    "train/train-00000-of-00002.tfrecord": "example",
    "train/train-00001-of-00002.tfrecord": "example",
    "val/val-00000-of-00001.tfrecord": "example",
    "mnist_raw.tfrecord": "example",
    "raw_rgb.tfrecord": "example",
    "clips.tfrecord": "sequence",
    "tabular.tfrecord.gz": "example",
}
TRAIN0, TRAIN1, VAL = "train/train-00000-of-00002.tfrecord", "train/train-00001-of-00002.tfrecord", \
    "val/val-00000-of-00001.tfrecord"
TAB, MNIST, RGB, CLIPS = "tabular.tfrecord.gz", "mnist_raw.tfrecord", "raw_rgb.tfrecord", "clips.tfrecord"


# --- one canonical form of a record, computed with whichever message classes are given ----------

def canon(data: bytes, kind: str, example_cls: Any, sequence_cls: Any) -> dict:
    """A record as plain JSON: every feature's kind and values, floats as their float32 bits."""
    import struct as _struct

    def feature(f: Any) -> list:
        k = f.WhichOneof("kind")
        if k == "int64_list":
            return [k, list(f.int64_list.value)]
        if k == "float_list":
            return [k, [_struct.pack("<f", v).hex() for v in f.float_list.value]]
        if k == "bytes_list":
            return [k, [v.hex() for v in f.bytes_list.value]]
        return [k, []]

    if kind == "sequence":
        m = sequence_cls.FromString(data)
        return {"context": {k: feature(v) for k, v in sorted(m.context.feature.items())},
                "feature_lists": {k: [feature(s) for s in fl.feature]
                                  for k, fl in sorted(m.feature_lists.feature_list.items())}}
    m = example_cls.FromString(data)
    return {"features": {k: feature(v) for k, v in sorted(m.features.feature.items())}}


def write_tf_dataset(dest: str) -> dict:
    """Write shards with TensorFlow's own writer and message classes (runs in the TF worker)."""
    import tensorflow as tf

    def ints(*v: int) -> Any:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))

    def floats(*v: float) -> Any:
        return tf.train.Feature(float_list=tf.train.FloatList(value=list(v)))

    def texts(*v: bytes) -> Any:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))

    made = {}
    for name, options in (("plain.tfrecord", None), ("packed.tfrecord.gz", tf.io.TFRecordOptions("GZIP"))):
        path = os.path.join(dest, name)
        with tf.io.TFRecordWriter(path, options) as w:
            for i in range(5):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "id": ints(i, -(2 ** 63), 2 ** 63 - 1),
                    "score": floats(0.1 * i, float("nan"), float("-inf"), 1e-40, 3.4028234663852886e38),
                    "name": texts(f"item-{i}".encode()),
                    "tags": texts(b"a", "Zoë".encode(), b""),
                    "blob": texts(bytes(range(256))),
                    "empty_f": floats(),
                    "sub/key": ints(i * 10),
                }))
                w.write(ex.SerializeToString())
        made[name] = 5
    return made


WORKER = textwrap.dedent("""
    import base64, json, os, sys
    from typing import Any
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf
    {canon}
    {write}
    print("READY", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "dump":
                out = {{}}
                for s in req["shards"]:
                    try:
                        ds = tf.data.TFRecordDataset(s["path"], compression_type=s["compression"])
                        raws = [r.numpy() for r in ds]
                        out[s["path"]] = {{
                            "raw": [base64.b64encode(r).decode() for r in raws],
                            "parsed": [canon(r, s["kind"], tf.train.Example, tf.train.SequenceExample)
                                       for r in raws]}}
                    except Exception as exc:
                        out[s["path"]] = {{"error": repr(exc)}}
            else:
                out = write_tf_dataset(req["dest"])
            print("OK " + json.dumps(out), flush=True)
        except Exception as exc:
            print("ERR " + repr(exc), flush=True)
""").format(canon=inspect.getsource(canon), write=inspect.getsource(write_tf_dataset))


class TFReader(TfWorker):
    """A TensorFlow subprocess that reads shards (and writes a TF dataset) on request."""

    def __init__(self) -> None:
        super().__init__(WORKER)

    def _ask(self, req: dict) -> Any:
        return self.request(req)

    def dump(self, shards: list[tuple[Path, str]]) -> dict[str, dict]:
        """Path -> {"raw": [bytes], "parsed": [canon]} as TensorFlow reads each shard."""
        req = [{"path": str(p), "kind": kind, "compression": "GZIP" if str(p).endswith(".gz") else ""}
               for p, kind in shards]
        out = self._ask({"op": "dump", "shards": req})
        for p, d in out.items():
            assert "error" not in d, f"TensorFlow cannot read {p}: {d['error']}"
            d["raw"] = [base64.b64decode(r) for r in d["raw"]]
        return out

    def write_dataset(self, dest: Path) -> dict:
        return self._ask({"op": "write", "dest": str(dest)})


@pytest.fixture(scope="module")
def tf() -> Any:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    reader = TFReader()
    yield reader
    reader.close()


@pytest.fixture(autouse=True)
def _need_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("sample") / "data"
    write_sample(dest)
    return dest


@pytest.fixture(scope="module")
def orig(template: Path, tf: TFReader) -> dict[str, list[bytes]]:
    """The sample's records before any edit, as TensorFlow reads them."""
    got = tf.dump([(template / rel, kind) for rel, kind in SHARDS.items()])
    out = {rel: got[str(template / rel)]["raw"] for rel in SHARDS}
    assert out == {rel: reference.written_records(template / rel) for rel in SHARDS}
    return out


@pytest.fixture
def data(template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the sample for one test."""
    dest = tmp_path / "data"
    shutil.copytree(template, dest)
    return dest


# --- expected records ---------------------------------------------------------------------------

Expected = Union[bytes, Any]   # bytes: must come back byte-identical; a message: must parse equal


def msg(data: bytes, kind: str = "example") -> Any:
    return (proto.SequenceExample if kind == "sequence" else proto.Example).FromString(data)


def setf(m: Any, key: str, kind: str, *values: Any, section: str = "") -> Any:
    feats = m.context.feature if section == "context" else m.features.feature
    codec.value_to_proto(codec.Value(kind, tuple(values)), feats[key])
    return m


def delf(m: Any, *keys: str) -> Any:
    for key in keys:
        del m.features.feature[key]
    return m


def values(m: Any, key: str) -> tuple:
    return codec.value_from_proto(m.features.feature[key]).values


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_dataset(tf: TFReader, data: Path, template: Path, orig: dict[str, list[bytes]],
                  changed: dict[str, list[Expected] | None], *, extra_kinds: dict[str, str] | None = None) -> None:
    """Read every shard of ``data`` with TensorFlow and compare with what the edits must give.

    ``changed`` maps a shard to its expected records (None: the shard is gone); every other shard
    of the sample must be the very file it was (not rewritten), and read back byte for byte.
    """
    kinds = dict(SHARDS, **(extra_kinds or {}))
    expected: dict[str, list[Expected]] = {}
    for rel in SHARDS:
        if rel not in changed:
            assert (data / rel).read_bytes() == (template / rel).read_bytes(), f"{rel} was rewritten"
            expected[rel] = list(orig[rel])
    for rel, exp in changed.items():
        if exp is None:
            assert not (data / rel).exists(), f"{rel} should be deleted"
        else:
            expected[rel] = exp
    # Exactly these shard files, and no commit leftovers.
    present = sorted(str(p.relative_to(data)) for p in data.rglob("*")
                     if p.is_file() and ".tfrfs-staging" not in p.parts
                     and p.name not in ("label_map.pbtxt", "dataset_info.json"))
    assert present == sorted(expected), "shard files after commit"
    got = tf.dump([(data / rel, kinds[rel]) for rel in expected])
    for rel, exp in expected.items():
        g = got[str(data / rel)]
        assert len(g["raw"]) == len(exp), f"{rel}: TensorFlow reads {len(g['raw'])} records, expected {len(exp)}"
        for i, (raw, parsed, e) in enumerate(zip(g["raw"], g["parsed"], exp)):
            if isinstance(e, bytes):
                assert raw == e, f"{rel} record {i}: an unchanged record is not byte-identical"
            else:
                want = canon(e.SerializeToString(), kinds[rel], proto.Example, proto.SequenceExample)
                assert parsed == want, f"{rel} record {i} differs"
            # TensorFlow's parse and ours agree on every record.
            assert parsed == canon(raw, kinds[rel], proto.Example, proto.SequenceExample)


# --- running tools ------------------------------------------------------------------------------

def sh(cmd: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=60)
    if ok:
        assert proc.returncode == 0, f"{cmd!r} exited {proc.returncode}: {proc.stderr}"
    return proc


def commit(mnt: Path) -> None:
    run_tfrfs("commit", str(mnt), check=True)
    status = json.loads((mnt / ".tfrfs" / "status").read_text())
    assert status["pending"] == [], status


def errors_of(mnt: Path) -> list[dict]:
    return [json.loads(line) for line in (mnt / ".tfrfs" / "errors").read_text().splitlines()]


def wait_for_log(mounts: Any, mnt: Path, text: str, timeout: float = 60) -> None:
    """Wait for the daemon to log ``text``: a wait for work done in the background (a commit at
    unmount, which fsyncs), generous because CI runs two suites at once on two cores; on failure
    the log's end says how far the daemon got."""
    import time
    deadline = time.monotonic() + timeout
    while text not in (log := mounts.log_text(mnt)):
        tail = "\n".join(log.splitlines()[-25:])
        assert time.monotonic() < deadline, f"the daemon log never showed {text!r}; it ends:\n{tail}"
        time.sleep(0.05)


def write_file(path: Path, content: bytes | str) -> None:
    """open/write/close; close() is where a writable mount judges the content."""
    with open(path, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)


def expect_einval(path: Path, content: bytes | str) -> None:
    with pytest.raises(OSError) as info:
        write_file(path, content)
    assert info.value.errno == errno.EINVAL, f"{path}: {info.value}"


def render(kind: str, *vals: Any) -> bytes:
    view = codec.render(codec.Value(kind, tuple(vals)))
    assert isinstance(view, codec.FileView)
    return view.data


# --- the tools ----------------------------------------------------------------------------------

@pytest.mark.tf
def test_shell_redirection(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    t = mnt / TAB
    sh("echo '[33]' > 000000/age.json && printf 'Zoë' > 000000/city.txt && echo '[1.5, 2]' > 000000/score.json"
       " && echo '[7, -8]' > 000000/count.json && echo '[\"a\", \"b\"]' > 000000/labels.json"
       " && echo '[]' > 000000/nothing.json && echo '[]' > 000001/visits.json"
       " && echo '[3, 4]' > 000001/monthly_spend.json && printf '!' >> 000001/plan.txt && : > 000003/city.txt",
       cwd=t)
    # The shell ignores close()'s EINVAL; the reason is in .tfrfs/errors and the log, the old value stays.
    assert sh("echo 'abc' > 000002/age.json", cwd=t, ok=False).returncode == 0
    old_age = (t / "000002" / "age.json").read_bytes()
    assert old_age == render("int64_list", *values(msg(orig[TAB][2]), "age"))
    assert any(e["path"] == "age.json" and e["record"] == "2" and "JSON" in e["reason"] for e in errors_of(mnt))
    assert "age.json: not valid JSON" in tfrfs_mount.log_text(mnt)
    # What the mount shows now: canonical renderings, kinds kept for known keys.
    assert (t / "000000" / "age.json").read_bytes() == b"[33]\n"
    assert (t / "000000" / "score.json").read_bytes() == b"[1.5, 2.0]\n"
    assert (t / "000001" / "monthly_spend.json").read_bytes() == b"[3.0, 4.0]\n"
    assert (t / "000001" / "visits.json").read_bytes() == b"[]\n"
    assert os.getxattr(t / "000001" / "visits.json", "user.tfrfs.kind") == b"int64_list"
    assert os.getxattr(t / "000000" / "nothing.json", "user.tfrfs.kind") == b"bytes_list"
    assert (t / "000003" / "city.txt").read_bytes() == b""
    commit(mnt)

    exp: list[Expected] = list(orig[TAB])
    r0 = setf(msg(orig[TAB][0]), "age", "int64_list", 33)
    setf(r0, "city", "bytes_list", "Zoë".encode())
    setf(r0, "score", "float_list", 1.5, 2.0)
    setf(r0, "count", "int64_list", 7, -8)
    setf(r0, "labels", "bytes_list", b"a", b"b")
    setf(r0, "nothing", "bytes_list")        # SPEC 7: [] for a new key is bytes_list
    r1 = setf(msg(orig[TAB][1]), "visits", "int64_list")
    setf(r1, "monthly_spend", "float_list", 3.0, 4.0)
    setf(r1, "plan", "bytes_list", values(r1, "plan")[0] + b"!")
    r3 = setf(msg(orig[TAB][3]), "city", "bytes_list", b"")
    exp[0], exp[1], exp[3] = r0, r1, r3
    check_dataset(tf, data, template, orig, {TAB: exp})


@pytest.mark.tf
def test_cp(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader, tmp_path: Path) -> None:
    mnt = tfrfs_mount(data, "--rw")
    src = tmp_path / "src"
    src.mkdir()
    (src / "label.json").write_text("[4, 1]\n")
    (src / "bad.json").write_text("[1.5]\n")
    other_jpg = values(msg(orig[VAL][1]), "image/encoded")[0]
    (src / "photo.jpg").write_bytes(other_jpg)
    thumb = _png(Image.new("RGB", (3, 2), (1, 2, 3)))
    (src / "thumb.png").write_bytes(thumb)
    r = mnt / TRAIN0
    sh(f"cp {src}/label.json 000000/image/object/class/label.json && cp {src}/photo.jpg 000000/image/encoded.jpg"
       f" && cp {src}/thumb.png 000001/thumb.png && cp /dev/null 000002/image/filename.txt", cwd=r)
    # cp reports close()'s EINVAL, and the old value stays.
    proc = sh(f"cp {src}/bad.json 000001/image/height.json", cwd=r, ok=False)
    assert proc.returncode != 0 and "Invalid argument" in proc.stderr
    assert (r / "000001" / "image" / "height.json").read_bytes() == b"[120]\n"
    assert any(e["path"] == "image/height.json" and "1.5 is not an integer" in e["reason"] for e in errors_of(mnt))
    assert "image/height.json: 1.5 is not an integer" in tfrfs_mount.log_text(mnt)
    assert (r / "000000" / "image" / "encoded.jpg").read_bytes() == other_jpg
    commit(mnt)

    exp: list[Expected] = list(orig[TRAIN0])
    exp[0] = setf(setf(msg(orig[TRAIN0][0]), "image/object/class/label", "int64_list", 4, 1),
                  "image/encoded", "bytes_list", other_jpg)
    exp[1] = setf(msg(orig[TRAIN0][1]), "thumb", "bytes_list", thumb)
    exp[2] = setf(msg(orig[TRAIN0][2]), "image/filename", "bytes_list", b"")
    check_dataset(tf, data, template, orig, {TRAIN0: exp})


@pytest.mark.tf
def test_cp_a(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader, tmp_path: Path) -> None:
    mnt = tfrfs_mount(data, "--rw")
    out = tmp_path / "out"
    out.mkdir()
    # Out of the mount and back in, and within the mount; cp -a copies modes, times and xattrs too.
    sh(f"cp -a {TRAIN1}/000003 {out}/rec && cp -a {TRAIN0}/000001 {TRAIN0}/copy_a"
       f" && cp -a {out}/rec {TRAIN1}/imported"
       f" && cp -a {TRAIN1}/000005/image/filename.txt {TRAIN1}/000006/image/filename.txt", cwd=mnt)
    assert sorted(os.listdir(mnt / TRAIN0))[-1] == "copy_a"
    assert sh(f"diff -r {TRAIN1}/000003 {TRAIN1}/imported", cwd=mnt).returncode == 0
    commit(mnt)
    assert sorted(os.listdir(mnt / TRAIN0)) == [f"{i:06d}" for i in range(13)]   # renumbered

    fname5 = values(msg(orig[TRAIN1][5]), "image/filename")[0]
    exp1: list[Expected] = list(orig[TRAIN1])
    exp1[6] = setf(msg(orig[TRAIN1][6]), "image/filename", "bytes_list", fname5)
    check_dataset(tf, data, template, orig, {
        TRAIN0: [*orig[TRAIN0], msg(orig[TRAIN0][1])],
        TRAIN1: [*exp1, msg(orig[TRAIN1][3])],
    })


@pytest.mark.tf
def test_cp_r_sequence_record(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    sh(f"cp -r {CLIPS}/000002 {CLIPS}/seq_copy", cwd=mnt)
    commit(mnt)
    check_dataset(tf, data, template, orig, {CLIPS: [*orig[CLIPS], msg(orig[CLIPS][2], "sequence")]})


@pytest.mark.tf
def test_cp_r(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader, tmp_path: Path) -> None:
    mnt = tfrfs_mount(data, "--rw")
    folder = tmp_path / "records"
    folder.mkdir()
    # A record into another shard; a folder of record folders into the mount makes a new shard
    # (uncompressed, or GZIP for a .gz name), records in the order of their names.
    sh(f"cp -r {VAL}/000002 {TRAIN0}/from_val && cp -r {VAL}/000004 {folder}/b && cp -r {VAL}/000000 {folder}/a"
       f" && cp -r {folder} new.tfrecord && cp -r {folder} val/more.tfrecord.gz", cwd=mnt)
    assert os.listdir(mnt / "new.tfrecord") == ["a", "b"]
    assert os.getxattr(mnt / "val" / "more.tfrecord.gz", "user.tfrfs.compression") == b"GZIP"
    commit(mnt)
    assert os.listdir(mnt / "new.tfrecord") == ["000000", "000001"]
    with open(data / "val" / "more.tfrecord.gz", "rb") as f:
        assert f.read(2) == b"\x1f\x8b"
    pair = [msg(orig[VAL][0]), msg(orig[VAL][4])]
    check_dataset(tf, data, template, orig, {
        TRAIN0: [*orig[TRAIN0], msg(orig[VAL][2])],
        "new.tfrecord": pair,
        "val/more.tfrecord.gz": pair,
    }, extra_kinds={"new.tfrecord": "example", "val/more.tfrecord.gz": "example"})


@pytest.mark.tf
def test_mv(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader, tmp_path: Path) -> None:
    mnt = tfrfs_mount(data, "--rw")
    (tmp_path / "note.txt").write_text("from outside")
    sh(f"mv {TRAIN0}/000004 {TRAIN1}/moved"                                                    # record -> shard
       f" && mv {TRAIN0}/000005/image/filename.txt {TRAIN0}/000005/image/name.txt"             # rename a key
       f" && mv {TRAIN0}/000006/image/source_id.txt {TRAIN0}/000007/image/sid.txt"            # across records
       f" && mv {tmp_path}/note.txt {TRAIN0}/000008/note.txt", cwd=mnt)                       # from outside
    assert not (tmp_path / "note.txt").exists()
    # Names stay stable until the commit; the moved record is appended after the others.
    assert os.listdir(mnt / TRAIN0) == [f"{i:06d}" for i in range(12) if i != 4]
    assert os.listdir(mnt / TRAIN1) == [f"{i:06d}" for i in range(12)] + ["moved"]
    assert (mnt / TRAIN0 / "000008" / "note.txt").read_text() == "from outside"
    run_tfrfs("umount", str(mnt), check=True)   # tfrfs umount commits
    assert not is_mounted(mnt)

    o = orig[TRAIN0]
    r5 = msg(o[5])
    setf(delf(r5, "image/filename"), "image/name", "bytes_list", values(msg(o[5]), "image/filename")[0])
    r6 = delf(msg(o[6]), "image/source_id")
    r7 = setf(msg(o[7]), "image/sid", "bytes_list", values(msg(o[6]), "image/source_id")[0])
    r8 = setf(msg(o[8]), "note", "bytes_list", b"from outside")
    check_dataset(tf, data, template, orig, {
        TRAIN0: [o[0], o[1], o[2], o[3], r5, r6, r7, r8, o[9], o[10], o[11]],
        TRAIN1: [*orig[TRAIN1], msg(o[4])],
    })


RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def renameat2(old: Path, new: Path, flags: int) -> int:
    """renameat2(2) as mv -n and others call it: 0, or the errno."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    rc = libc.renameat2(at_fdcwd, os.fsencode(old), at_fdcwd, os.fsencode(new), flags)
    return 0 if rc == 0 else ctypes.get_errno()


@pytest.mark.tf
def test_rename_flags(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    """RENAME_NOREPLACE refuses a name that exists and changes nothing; RENAME_EXCHANGE is not
    supported; a no-replace rename to a free name is a plain rename."""
    mnt = tfrfs_mount(data, "--rw")
    img = mnt / TRAIN0 / "000002" / "image"
    assert renameat2(img / "filename.txt", img / "source_id.txt", RENAME_NOREPLACE) == errno.EEXIST
    assert renameat2(img / "filename.txt", img / "source_id.txt", RENAME_EXCHANGE) == errno.EINVAL
    assert renameat2(img / "filename.txt", img / "name.txt", RENAME_NOREPLACE) == 0
    run_tfrfs("umount", str(mnt), check=True)
    o = orig[TRAIN0]
    r2 = setf(delf(msg(o[2]), "image/filename"), "image/name", "bytes_list", values(msg(o[2]), "image/filename")[0])
    check_dataset(tf, data, template, orig, {TRAIN0: [o[0], o[1], r2, *o[3:]]})


@pytest.mark.tf
def test_rm_r(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    sh(f"rm -r {TRAIN0}/000003 {TRAIN0}/000007 && rm {TRAIN1}/000000/image/key/sha256.txt"
       f" && rm -r {TRAIN1}/000001/image/object && rm -r {VAL}", cwd=mnt)
    assert os.listdir(mnt / TRAIN0) == [f"{i:06d}" for i in range(12) if i not in (3, 7)]   # stable names
    assert os.listdir(mnt / "val") == []
    assert os.listdir(mnt / TRAIN1 / "000000" / "image" / "key") == []   # the folder stays until rmdir
    # fusermount3 -u commits too.
    daemons = daemon_pids(mnt)
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    assert not is_mounted(mnt)
    # fusermount3 returns when the kernel lets go; the daemon commits after that, then exits.
    wait_for_log(tfrfs_mount, mnt, "committed val/val-00000-of-00001.tfrecord")
    for pid in daemons:   # after its last shard it still clears the staged edits: let it end
        wait_ended(pid)
    o = orig[TRAIN0]
    r1 = msg(orig[TRAIN1][1])
    delf(r1, *[k for k in r1.features.feature if k.startswith("image/object/")])
    exp1: list[Expected] = list(orig[TRAIN1])
    exp1[0] = delf(msg(orig[TRAIN1][0]), "image/key/sha256")
    exp1[1] = r1
    check_dataset(tf, data, template, orig, {
        TRAIN0: [r for i, r in enumerate(o) if i not in (3, 7)],
        TRAIN1: exp1,
        VAL: None,
    })


@pytest.mark.tf
@pytest.mark.parametrize("shard", [CLIPS, MNIST])
def test_rm_r_record_whose_names_depend_on_each_other(shard: str, data: Path, template: Path, orig: dict,
                                                       tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    sh(f"rm -r {shard}/000001", cwd=mnt)
    commit(mnt)
    check_dataset(tf, data, template, orig, {shard: [r for i, r in enumerate(orig[shard]) if i != 1]})


def steps_of(m: Any, key: str) -> list[codec.Value]:
    return [codec.value_from_proto(f) for f in m.feature_lists.feature_list[key].feature]


def set_steps(m: Any, key: str, steps: list[codec.Value]) -> Any:
    flist = m.feature_lists.feature_list[key]
    del flist.feature[:]
    for step in steps:
        codec.value_to_proto(step, flist.feature.add())
    return m


@pytest.mark.tf
def test_removed_step_renames_no_other_step(data: Path, template: Path, orig: dict, tfrfs_mount,
                                            tf: TFReader) -> None:
    """SPEC 7: until a commit, names stay stable. Step 1 is still 1.jpg after step 0 went; a new
    step goes among the others by its number; the commit writes the steps in that order."""
    mnt = tfrfs_mount(data, "--rw")
    folder = mnt / CLIPS / "000000" / "feature_lists" / "frames" / "jpeg.steps"
    jpegs = [s.values[0] for s in steps_of(msg(orig[CLIPS][0], "sequence"), "frames/jpeg")]
    assert sorted(os.listdir(folder)) == ["0.jpg", "1.jpg", "2.jpg", "3.jpg"]
    os.unlink(folder / "0.jpg")
    assert sorted(os.listdir(folder)) == ["1.jpg", "2.jpg", "3.jpg"]
    assert (folder / "1.jpg").read_bytes() == jpegs[1]
    os.unlink(folder / "2.jpg")
    assert [(n, (folder / n).read_bytes()) for n in sorted(os.listdir(folder))] == \
        [("1.jpg", jpegs[1]), ("3.jpg", jpegs[3])]
    write_file(folder / "2.jpg", jpegs[0])          # a free number: between 1 and 3
    write_file(folder / "3.jpg", jpegs[2])          # an existing number: that step
    assert [(n, (folder / n).read_bytes()) for n in sorted(os.listdir(folder))] == \
        [("1.jpg", jpegs[1]), ("2.jpg", jpegs[0]), ("3.jpg", jpegs[2])]
    commit(mnt)
    assert sorted(os.listdir(folder)) == ["0.jpg", "1.jpg", "2.jpg"]   # renumbered by the commit
    exp: list[Expected] = list(orig[CLIPS])
    exp[0] = set_steps(msg(orig[CLIPS][0], "sequence"), "frames/jpeg",
                       [codec.Value("bytes_list", (j,)) for j in (jpegs[1], jpegs[0], jpegs[2])])
    check_dataset(tf, data, template, orig, {CLIPS: exp})


@pytest.mark.tf
def test_emptied_steps_folder_stays_until_rmdir(data: Path, template: Path, orig: dict, tfrfs_mount,
                                                tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    lists = mnt / CLIPS / "000001" / "feature_lists" / "frames"
    folder = lists / "jpeg.steps"
    names = sorted(os.listdir(folder))
    assert len(names) == 5
    for name in names:
        os.unlink(folder / name)
        # No step left is renamed, and one step left is still a folder.
        assert sorted(os.listdir(folder)) == names[names.index(name) + 1:]
    assert folder.is_dir() and sorted(os.listdir(lists)) == ["boxes.json", "jpeg.steps", "tags.json"]
    os.rmdir(folder)
    assert sorted(os.listdir(lists)) == ["boxes.json", "tags.json"]
    commit(mnt)
    exp: list[Expected] = list(orig[CLIPS])
    m1 = msg(orig[CLIPS][1], "sequence")
    del m1.feature_lists.feature_list["frames/jpeg"]
    exp[1] = m1
    check_dataset(tf, data, template, orig, {CLIPS: exp})


@pytest.mark.tf
def test_raw_pixels_stay_png_when_height_goes(data: Path, template: Path, orig: dict, tfrfs_mount,
                                              tf: TFReader) -> None:
    """image_raw.png of a record whose height.json was removed is still the PNG it was until the
    commit; the pixels themselves never change. After the commit the rules show it as .bin."""
    mnt = tfrfs_mount(data, "--rw")
    rec = mnt / MNIST / "000002"
    png = (rec / "image_raw.png").read_bytes()
    os.unlink(rec / "height.json")
    assert sorted(os.listdir(rec)) == ["depth.json", "image_raw.png", "label.json", "width.json"]
    assert (rec / "image_raw.png").read_bytes() == png
    assert os.stat(rec / "image_raw.png").st_size == len(png)
    os.unlink(rec / "width.json")
    write_file(rec / "depth.json", "[3]")            # no shape fits any more: still the same PNG
    assert (rec / "image_raw.png").read_bytes() == png
    with Image.open(rec / "image_raw.png") as img:
        pixels = img.tobytes()
    assert pixels == values(msg(orig[MNIST][2]), "image_raw")[0]
    commit(mnt)
    assert sorted(os.listdir(rec)) == ["depth.json", "image_raw.bin", "label.json"]
    exp: list[Expected] = list(orig[MNIST])
    exp[2] = setf(delf(msg(orig[MNIST][2]), "height", "width"), "depth", "int64_list", 3)
    check_dataset(tf, data, template, orig, {MNIST: exp})


def _list_dataset(src: Path) -> list[bytes]:
    """A shard whose records hold several-value bytes features, shown as KEY.list/ folders."""
    import io
    buf = io.BytesIO()
    Image.new("RGB", (4, 3), (9, 99, 199)).save(buf, format="JPEG")
    jpg = buf.getvalue()
    frames = [jpg if i % 3 == 0 else bytes([i, 0, 255]) for i in range(12)]   # 00.jpg, 01.bin ... 11.bin
    records = [setf(setf(proto.Example(), "frames", "bytes_list", *frames), "label", "int64_list", 7),
               setf(setf(proto.Example(), "pair", "bytes_list", jpg, b"a note"), "label", "int64_list", 8)]
    with open(src / "lists.tfrecord", "wb") as f:
        w = tfrecord.StreamWriter(f)
        for r in records:
            w.write(r.SerializeToString(deterministic=True))
        w.close()
    return [r.SerializeToString(deterministic=True) for r in records]


@pytest.mark.tf
def test_removed_list_item_renames_no_other_item(tmp_path: Path, tfrfs_mount, tf: TFReader) -> None:
    src = tmp_path / "src"
    src.mkdir()
    records = _list_dataset(src)
    frames = values(msg(records[0]), "frames")
    mnt = tfrfs_mount(src, "--rw")
    folder = mnt / "lists.tfrecord" / "000000" / "frames.list"
    names = sorted(os.listdir(folder))
    assert names[:3] == ["00.jpg", "01.bin", "02.bin"] and names[-1] == "11.bin"
    os.unlink(folder / "00.jpg")
    assert sorted(os.listdir(folder)) == names[1:]      # not renumbered 0..10
    assert (folder / "01.bin").read_bytes() == frames[1]
    assert (folder / "11.bin").read_bytes() == frames[11]
    for name in names[1:-2]:
        os.unlink(folder / name)
    assert sorted(os.listdir(folder)) == ["10.bin", "11.bin"]
    write_file(folder / "10.bin", b"\x00changed")       # an item written keeps its name
    assert (folder / "10.bin").read_bytes() == b"\x00changed"
    # A list left with one text value is still a folder (the rules would show pair.txt).
    pair = mnt / "lists.tfrecord" / "000001" / "pair.list"
    os.unlink(pair / "0.jpg")
    assert sorted(os.listdir(pair.parent)) == ["label.json", "pair.list"]
    assert os.listdir(pair) == ["1.txt"] and (pair / "1.txt").read_bytes() == b"a note"
    commit(mnt)
    assert sorted(os.listdir(pair.parent)) == ["label.json", "pair.txt"]
    got = tf.dump([(src / "lists.tfrecord", "example")])[str(src / "lists.tfrecord")]
    want = [setf(msg(records[0]), "frames", "bytes_list", b"\x00changed", frames[11]),
            setf(msg(records[1]), "pair", "bytes_list", b"a note")]
    assert got["parsed"] == [canon(m.SerializeToString(), "example", proto.Example, proto.SequenceExample)
                             for m in want]


@pytest.mark.tf
def test_rsync_a(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader, tmp_path: Path) -> None:
    mnt = tfrfs_mount(data, "--rw")
    out = tmp_path / "out"
    sh(f"rsync -a {VAL}/000001/ {TRAIN0}/rsynced/ && rsync -a {CLIPS}/000003/ {CLIPS}/rsynced/"
       f" && cp -r {TRAIN1}/000002 {out}", cwd=mnt)
    # Edit the copy outside and rsync it back: rsync writes dot-named temp files (scratch) and
    # renames them over the features; --delete removes what the copy no longer has.
    (out / "image" / "object" / "class" / "label.json").write_text("[2, 2]")
    (out / "image" / "filename.txt").write_text("renamed.jpg")
    (out / "image" / "key" / "sha256.txt").unlink()
    (out / "image" / "extra.json").write_text("[0.25]")
    sh(f"rsync -a --delete {out}/ {TRAIN1}/000002/", cwd=mnt)
    assert sh(f"diff -r {VAL}/000001 {TRAIN0}/rsynced", cwd=mnt).returncode == 0
    names = sorted(p.name for p in (mnt / TRAIN1 / "000002" / "image").iterdir())
    assert names == ["encoded.jpg", "extra.json", "filename.txt", "format.txt", "height.json", "key", "object",
                     "source_id.txt", "width.json"]
    commit(mnt)
    r2 = msg(orig[TRAIN1][2])
    setf(r2, "image/object/class/label", "int64_list", 2, 2)
    setf(r2, "image/filename", "bytes_list", b"renamed.jpg")
    setf(r2, "image/extra", "float_list", 0.25)
    delf(r2, "image/key/sha256")
    exp1: list[Expected] = list(orig[TRAIN1])
    exp1[2] = r2
    check_dataset(tf, data, template, orig, {TRAIN0: [*orig[TRAIN0], msg(orig[VAL][1])], TRAIN1: exp1,
                                             CLIPS: [*orig[CLIPS], msg(orig[CLIPS][3], "sequence")]})


@pytest.mark.tf
def test_truncate(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    t = mnt / TAB
    plan = [values(msg(r), "plan")[0] for r in orig[TAB]]
    sh("truncate -s 0 000000/city.txt && truncate -s 2 000001/plan.txt && truncate -s 12 000004/plan.txt", cwd=t)
    # A .json cut short is refused when the file is closed: truncate reports it.
    proc = sh("truncate -s 2 000002/age.json", cwd=t, ok=False)
    assert proc.returncode != 0 and "Invalid argument" in proc.stderr
    # truncate(2) by path has no close to wait for: refused at once.
    with pytest.raises(OSError) as info:
        os.truncate(t / "000003" / "age.json", 0)
    assert info.value.errno == errno.EINVAL
    # A truncate to zero and nothing written is judged only at the last close (it is also how
    # `> file` starts), which cannot fail any more: the reason is in .tfrfs/errors, the value stays.
    sh("truncate -s 0 000005/age.json", cwd=t)
    for i in (2, 3, 5):
        assert (t / f"{i:06d}" / "age.json").read_bytes() == render("int64_list", *values(msg(orig[TAB][i]), "age"))
    reasons = [e for e in errors_of(mnt) if e["path"] == "age.json"]
    assert {e["record"] for e in reasons} == {"2", "3", "5"}
    # Padding with NUL makes the value binary: it is shown as .bin now.
    assert (t / "000004" / "plan.bin").read_bytes() == plan[4] + b"\0" * (12 - len(plan[4]))
    commit(mnt)
    exp: list[Expected] = list(orig[TAB])
    exp[0] = setf(msg(orig[TAB][0]), "city", "bytes_list", b"")
    exp[1] = setf(msg(orig[TAB][1]), "plan", "bytes_list", plan[1][:2])
    exp[4] = setf(msg(orig[TAB][4]), "plan", "bytes_list", plan[4] + b"\0" * (12 - len(plan[4])))
    check_dataset(tf, data, template, orig, {TAB: exp})


@pytest.mark.tf
def test_sed_i(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    r = mnt / TRAIN0 / "000001" / "image"
    labels = values(msg(orig[TRAIN0][1]), "image/object/class/label")
    fname = values(msg(orig[TRAIN0][1]), "image/filename")[0]
    sh("sed -i 's/\\[/[3, /' object/class/label.json && sed -i 's/train/TRAIN/' filename.txt"
       " && sed -i 's/\\]/, 0.5]/' object/bbox/xmin.json", cwd=r)
    # sed writes a sedXXXXXX scratch file and renames it over the feature: the rename is refused.
    proc = sh("sed -i 's/1/x/' height.json", cwd=r, ok=False)
    assert proc.returncode != 0 and "Invalid argument" in proc.stderr
    assert (r / "height.json").read_bytes() == b"[120]\n"
    assert not [n for n in os.listdir(r) if n.startswith("sed")]
    commit(mnt)
    m = msg(orig[TRAIN0][1])
    setf(m, "image/object/class/label", "int64_list", 3, *labels)
    setf(m, "image/filename", "bytes_list", fname.replace(b"train", b"TRAIN"))
    setf(m, "image/object/bbox/xmin", "float_list", *values(m, "image/object/bbox/xmin"), 0.5)
    exp: list[Expected] = list(orig[TRAIN0])
    exp[1] = m
    check_dataset(tf, data, template, orig, {TRAIN0: exp})


@pytest.mark.tf
def test_vim(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    if shutil.which("vim") is None:
        pytest.skip("vim is not installed")
    mnt = tfrfs_mount(data, "--rw")
    r = mnt / TRAIN0 / "000002" / "image"
    names = sorted(os.listdir(r))
    vim = "vim -u NONE -i NONE -es"
    sh(f"{vim} -c '%s/\\[\\(.*\\)\\]/[\\1, 4]/' -c wq object/class/label.json </dev/null"
       f" && {vim} -c 'set nofixendofline' -c 's/train/vim/' -c wq filename.txt </dev/null"
       f" && {vim} -c 'set backupcopy=no' -c 's/120/90/' -c wq height.json </dev/null", cwd=r)
    # A save that does not fit: vim reports the failed write; the old value stays.
    proc = sh(f"{vim} -c 's/160/wide/' -c wq width.json </dev/null", cwd=r, ok=False)
    assert proc.returncode != 0
    assert (r / "width.json").read_bytes() == b"[160]\n"
    # No swap or backup files are left, and none became a feature.
    assert sorted(os.listdir(r)) == names
    commit(mnt)
    m = msg(orig[TRAIN0][2])
    setf(m, "image/object/class/label", "int64_list", *values(m, "image/object/class/label"), 4)
    setf(m, "image/filename", "bytes_list", values(m, "image/filename")[0].replace(b"train", b"vim"))
    setf(m, "image/height", "int64_list", 90)
    exp: list[Expected] = list(orig[TRAIN0])
    exp[2] = m
    check_dataset(tf, data, template, orig, {TRAIN0: exp})


@pytest.mark.tf
def test_editor_save_keeps_the_kind_of_a_key_made_in_the_mount(data: Path, template: Path, orig: dict, tfrfs_mount,
                                                               tf: TFReader) -> None:
    """SPEC 7: an editor that saves by renaming the old file away and writing a new one ends with the
    same key and kind, also for a key new to the dataset that was made in this mount: the kinds of
    the staged records are the dataset's too, also once the value that had the kind is gone."""
    if shutil.which("vim") is None:
        pytest.skip("vim is not installed")
    mnt = tfrfs_mount(data, "--rw")
    r = mnt / TRAIN0 / "000003"
    sh("echo '[1.5]' > newf.json && echo '[0.5]' > newg.json && echo '[1.5]' > newh.json"
       " && printf 'hello' > note.txt", cwd=r)
    # vim renames newf.json to newf.json~, writes a new newf.json, removes the backup (backupskip=:
    # its default skips /tmp, where the test runs, and would write in place instead). Its text
    # gets vim's newline at the end, which the value it stands for never had (SPEC 7 "Text").
    vim = "vim -u NONE -i NONE -es -c 'set writebackup backupcopy=no backupskip='"
    sh(f"{vim} -c 's/1.5/2/' -c wq newf.json </dev/null && {vim} -c 's/hello/hi/' -c wq note.txt </dev/null",
       cwd=r)
    # The same by hand (mv away, write anew), and rm then write: the key keeps the kind it had.
    sh("mv newg.json newg.json~ && echo '[3]' > newg.json && rm newg.json~", cwd=r)
    sh("rm newh.json && echo '[4]' > newh.json", cwd=r)
    assert [(r / f"{k}.json").read_bytes() for k in ("newf", "newg", "newh")] == [b"[2.0]\n", b"[3.0]\n", b"[4.0]\n"]
    assert os.getxattr(r / "newf.json", "user.tfrfs.kind") == b"float_list"
    assert (r / "note.txt").read_bytes() == b"hi"
    assert not any(name.endswith("~") for name in os.listdir(r))
    commit(mnt)
    m = msg(orig[TRAIN0][3])
    setf(m, "newf", "float_list", 2.0)
    setf(m, "newg", "float_list", 3.0)
    setf(m, "newh", "float_list", 4.0)
    setf(m, "note", "bytes_list", b"hi")
    exp: list[Expected] = list(orig[TRAIN0])
    exp[3] = m
    check_dataset(tf, data, template, orig, {TRAIN0: exp})


# --- validation on close, adding features, raw pixels ------------------------------------------

@pytest.mark.tf
def test_invalid_content_fails_close(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    t = mnt / TAB / "000006"
    before = {p.name: p.read_bytes() for p in t.iterdir()}
    tags = codec.value_from_proto(msg(orig[TAB][6]).features.feature["tags"])
    bad = [("age.json", "[1.5]"), ("age.json", "[9223372036854775808]"), ("age.json", '["x"]'),
           ("age.json", "null"), ("age.json", "[true]"), ("age.json", "{}"), ("age.json", " \n"),
           ("monthly_spend.json", "[1e39]"), ("monthly_spend.json", '["x"]'), ("monthly_spend.json", "[1, \"x\"]"),
           ("age.txt", "12")]
    if tags.values and len(tags.values) != 1:
        bad.append(("tags.json", "[1]"))
    for name, content in bad:
        expect_einval(t / name, content)
    assert {p.name: p.read_bytes() for p in t.iterdir()} == before   # nothing changed, age.txt not made
    reasons = [e for e in errors_of(mnt) if e["record"] == "6"]
    assert len(reasons) == len(bad) and all(e["reason"].endswith("the old value stays") for e in reasons)
    log = tfrfs_mount.log_text(mnt)
    assert all(e["reason"] in log for e in reasons)
    # Emptied and closed with nothing written: the same close as `> file`'s first, which must wait
    # (SPEC 7), so the refusal comes at the last close, which cannot fail: logged, and the value stays.
    write_file(t / "age.json", "")
    assert {p.name: p.read_bytes() for p in t.iterdir()} == before
    assert any(e["record"] == "6" and "the .json file is empty" in e["reason"] for e in errors_of(mnt))
    # A raw pixel key takes PNGs only.
    jpg = values(msg(orig[TRAIN0][0]), "image/encoded")[0]
    expect_einval(mnt / MNIST / "000000" / "image_raw.png", jpg)
    # A file name without a feature suffix cannot be made in a record folder.
    with pytest.raises(OSError) as info:
        open(t / "README", "w").close()
    assert info.value.errno == errno.EINVAL
    # One valid edit, so the shard is rewritten: every other record stays byte-identical.
    write_file(t / "age.json", "40")
    commit(mnt)
    exp: list[Expected] = list(orig[TAB])
    exp[6] = setf(msg(orig[TAB][6]), "age", "int64_list", 40)
    check_dataset(tf, data, template, orig, {TAB: exp})


@pytest.mark.tf
def test_add_features(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    t = mnt / TAB
    no_notes = next(i for i, r in enumerate(orig[TAB]) if "notes" not in msg(r).features.feature)
    rec = t / f"{no_notes:06d}"
    # Known keys keep the dataset's kind.
    write_file(rec / "notes.txt", "added")
    os.unlink(rec / "monthly_spend.json")
    write_file(rec / "monthly_spend.json", "[1, 2]")
    os.unlink(rec / "age.json")
    write_file(rec / "age.json", "[]")
    assert os.getxattr(rec / "monthly_spend.json", "user.tfrfs.kind") == b"float_list"
    assert os.getxattr(rec / "age.json", "user.tfrfs.kind") == b"int64_list"
    # New keys take their kind from suffix and content.
    write_file(rec / "n.json", "[1, -2]")
    write_file(rec / "scalar.json", "5")
    write_file(rec / "f.json", "[1e3, 2]")
    write_file(rec / "nan.json", "[NaN, -Infinity, 0.1]")
    write_file(rec / "s.json", '["x", "Zoë"]')
    write_file(rec / "e.json", "[]")
    write_file(rec / "z.json", "null")
    write_file(rec / "b.bin", b"\x00\x01\xff")
    os.makedirs(rec / "sub" / "deep")
    write_file(rec / "sub" / "deep" / "k.txt", "nested")
    os.mkdir(rec / "blob.list")
    write_file(rec / "blob.list" / "1.txt", "second")    # cp -r may copy a later value first
    write_file(rec / "blob.list" / "0.bin", b"\x00first")
    assert (rec / "nan.json").read_bytes() == b"[NaN, -Infinity, 0.1]\n"
    assert (rec / "z.json").read_bytes() == b"null\n"
    assert sorted(os.listdir(rec / "blob.list")) == ["0.bin", "1.txt"]
    commit(mnt)
    m = msg(orig[TAB][no_notes])
    setf(m, "notes", "bytes_list", b"added")
    setf(m, "monthly_spend", "float_list", 1.0, 2.0)
    setf(m, "age", "int64_list")
    setf(m, "n", "int64_list", 1, -2)
    setf(m, "scalar", "int64_list", 5)
    setf(m, "f", "float_list", 1000.0, 2.0)
    setf(m, "nan", "float_list", float("nan"), float("-inf"), f32(0.1))
    setf(m, "s", "bytes_list", b"x", "Zoë".encode())
    setf(m, "e", "bytes_list")
    m.features.feature["z"].Clear()          # a Feature with no kind
    setf(m, "b", "bytes_list", b"\x00\x01\xff")
    setf(m, "sub/deep/k", "bytes_list", b"nested")
    setf(m, "blob", "bytes_list", b"\x00first", b"second")
    exp: list[Expected] = list(orig[TAB])
    exp[no_notes] = m
    check_dataset(tf, data, template, orig, {TAB: exp})


def _png(img: Image.Image) -> bytes:
    import io
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.tf
def test_raw_png_write_back(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader,
                            tmp_path: Path) -> None:
    mnt = tfrfs_mount(data, "--rw")
    rgba = Image.new("RGBA", (10, 7), (200, 10, 10, 128))
    gray = Image.new("L", (5, 4), 77)
    rgb = Image.new("RGB", (6, 3), (0, 128, 255))
    for name, img in (("rgba.png", rgba), ("gray.png", gray), ("rgb.png", rgb)):
        (tmp_path / name).write_bytes(_png(img))
    # A record copied in file by file: height and channels are there, width is not (yet).
    os.makedirs(mnt / RGB / "partial" / "image")
    write_file(mnt / RGB / "partial" / "image" / "height.json", "[24]")
    write_file(mnt / RGB / "partial" / "image" / "channels.json", "[3]")
    sh(f"cp {tmp_path}/rgba.png {RGB}/000000/image/encoded.png && cp {tmp_path}/gray.png {MNIST}/000001/image_raw.png"
       f" && cp {tmp_path}/rgb.png {RGB}/partial/image/encoded.png", cwd=mnt)
    r0 = mnt / RGB / "000000" / "image"
    assert [(r0 / f"{k}.json").read_bytes() for k in ("height", "width", "channels")] == [b"[7]\n", b"[10]\n", b"[4]\n"]
    with Image.open(r0 / "encoded.png") as shown:
        assert shown.mode == "RGBA" and shown.tobytes() == rgba.tobytes()
    # Decoded to pixels; without width they are no raw pixel array (3.3) yet, so shown as their bytes.
    assert (mnt / RGB / "partial" / "image" / "encoded.bin").read_bytes() == rgb.tobytes()
    assert (mnt / RGB / "partial" / "image" / "height.json").read_bytes() == b"[3]\n"
    commit(mnt)
    m0 = msg(orig[RGB][0])
    setf(m0, "image/encoded", "bytes_list", rgba.tobytes())
    setf(m0, "image/height", "int64_list", 7)
    setf(m0, "image/width", "int64_list", 10)
    setf(m0, "image/channels", "int64_list", 4)
    m2 = proto.Example()
    setf(m2, "image/height", "int64_list", 3)
    setf(m2, "image/channels", "int64_list", 3)
    setf(m2, "image/encoded", "bytes_list", rgb.tobytes())   # width is not made (SPEC 7)
    mn = msg(orig[MNIST][1])
    setf(mn, "image_raw", "bytes_list", gray.tobytes())
    setf(mn, "height", "int64_list", 4)
    setf(mn, "width", "int64_list", 5)
    setf(mn, "depth", "int64_list", 1)
    exp_rgb: list[Expected] = [m0, *orig[RGB][1:], m2]
    exp_mn: list[Expected] = list(orig[MNIST])
    exp_mn[1] = mn
    check_dataset(tf, data, template, orig, {RGB: exp_rgb, MNIST: exp_mn})


@pytest.mark.tf
def test_records_and_shards(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader) -> None:
    mnt = tfrfs_mount(data, "--rw")
    # mkdir in a shard folder adds a record; in a sequence shard it starts empty, and context/ and
    # feature_lists/ appear when made (SPEC 4).
    os.mkdir(mnt / TRAIN1 / "new")
    write_file(mnt / TRAIN1 / "new" / "label.json", "[9]")
    os.mkdir(mnt / CLIPS / "new")
    assert os.listdir(mnt / CLIPS / "new") == []
    os.mkdir(mnt / CLIPS / "new" / "context")
    os.mkdir(mnt / CLIPS / "new" / "feature_lists")
    assert sorted(os.listdir(mnt / CLIPS / "new")) == ["context", "feature_lists"]
    os.mkdir(mnt / CLIPS / "new" / "context" / "video")
    write_file(mnt / CLIPS / "new" / "context" / "video" / "id.txt", "clip-new")
    os.mkdir(mnt / CLIPS / "new" / "feature_lists" / "frames")
    write_file(mnt / CLIPS / "new" / "feature_lists" / "frames" / "boxes.json", "[[0.5, 1], []]")
    # mkdir in a source folder adds a shard (.gz: GZIP); an empty one is committed with no records.
    os.mkdir(mnt / "val" / "extra.tfrecord.gz")
    os.mkdir(mnt / "val" / "extra.tfrecord.gz" / "r")
    write_file(mnt / "val" / "extra.tfrecord.gz" / "r" / "x.json", "[0.5]")
    os.mkdir(mnt / "empty.tfrecord")
    # A shard made and removed again leaves nothing; rm -r of a source shard deletes it.
    os.mkdir(mnt / "gone.tfrecord")
    os.rmdir(mnt / "gone.tfrecord")
    sh(f"rm -r {TAB}", cwd=mnt)
    assert "gone.tfrecord" not in os.listdir(mnt) and TAB not in os.listdir(mnt)
    # Plain files stay read-only; no new plain file outside a record folder.
    with pytest.raises(OSError):
        write_file(mnt / "label_map.pbtxt", "x")
    with pytest.raises(OSError):
        write_file(mnt / "val" / "notes.txt", "x")
    commit(mnt)
    assert os.listdir(mnt / TRAIN1)[-1] == "000012"
    seq = proto.SequenceExample()
    seq.context.SetInParent()
    seq.feature_lists.SetInParent()
    setf(seq, "video/id", "bytes_list", b"clip-new", section="context")
    boxes = seq.feature_lists.feature_list["frames/boxes"]
    codec.value_to_proto(codec.Value("float_list", (0.5, 1.0)), boxes.feature.add())
    codec.value_to_proto(codec.Value("float_list", ()), boxes.feature.add())
    extra = setf(proto.Example(), "x", "float_list", 0.5)
    check_dataset(tf, data, template, orig, {
        TRAIN1: [*orig[TRAIN1], setf(proto.Example(), "label", "int64_list", 9)],
        CLIPS: [*orig[CLIPS], seq],
        "val/extra.tfrecord.gz": [extra],
        "empty.tfrecord": [],
        TAB: None,
    }, extra_kinds={"val/extra.tfrecord.gz": "example", "empty.tfrecord": "example"})


# --- the cp -r round trip -----------------------------------------------------------------------

@pytest.mark.tf
def test_cp_r_round_trip(data: Path, template: Path, orig: dict, tfrfs_mount, tf: TFReader,
                         tmp_path: Path) -> None:
    """Every record of the sample, copied out with cp -r and back in as a new shard, comes back equal:
    keys, kinds (empty lists included: every key is known to the dataset) and float bits."""
    out = tmp_path / "out"
    out.mkdir()
    # The SequenceExample shard goes back into a source of sequence shards, where a new shard is one.
    seq_src = tmp_path / "seq"
    seq_src.mkdir()
    shutil.copy2(data / CLIPS, seq_src / CLIPS)
    mnt = tfrfs_mount(data, "--rw")
    mnt2 = tfrfs_mount(seq_src, "--rw")
    flat = {rel: rel.replace("/", "_") for rel in SHARDS}
    for rel, name in flat.items():
        sh(f"cp -r {mnt / rel} {out / name}", cwd=tmp_path)
    for rel, name in flat.items():
        if rel == CLIPS:
            # rsync, which looks before it makes a folder (cp -r: test_cp_r_sequence_record).
            os.mkdir(mnt2 / "back.tfrecord")
            sh(f"rsync -r {out / name}/ {mnt2}/back.tfrecord/", cwd=tmp_path)
        else:
            back = mnt / os.path.dirname(rel) / f"back-{name}"   # a new shard beside the original
            os.mkdir(back)                                        # mkdir, then the records into it
            sh(f"cp -r {out / name}/. {back}/", cwd=tmp_path)
    commit(mnt)
    commit(mnt2)
    new = {os.path.join(os.path.dirname(rel), f"back-{name}"): [msg(r) for r in orig[rel]]
           for rel, name in flat.items() if rel != CLIPS}
    check_dataset(tf, data, template, orig, new, extra_kinds={k: "example" for k in new})
    got = tf.dump([(seq_src / "back.tfrecord", "sequence")])[str(seq_src / "back.tfrecord")]
    assert got["parsed"] == [canon(r, "sequence", proto.Example, proto.SequenceExample) for r in orig[CLIPS]]


# --- shards written by TensorFlow ---------------------------------------------------------------

@pytest.mark.tf
def test_tf_written_shards_keep_unchanged_records(tmp_path: Path, tfrfs_mount, tf: TFReader) -> None:
    src = tmp_path / "tfdata"
    src.mkdir()
    made = tf.write_dataset(src)
    shards = [(src / name, "example") for name in sorted(made)]
    before = {Path(p).name: d["raw"] for p, d in tf.dump(shards).items()}
    mnt = tfrfs_mount(src, "--rw")
    sh("sed -i 's/item-1/edited/' plain.tfrecord/000001/name.txt && rm -r packed.tfrecord.gz/000003"
       " && cp -r plain.tfrecord/000000 packed.tfrecord.gz/zz && echo '[1, 2]' > packed.tfrecord.gz/000000/score.json",
       cwd=mnt)
    # Floats as TF wrote them come back bit for bit: NaN, -inf, a subnormal, float32's largest.
    shown = (mnt / "plain.tfrecord" / "000002" / "score.json").read_bytes()
    assert shown == b"[0.2, NaN, -Infinity, 1e-40, 3.4028235e+38]\n"
    commit(mnt)
    after = {Path(p).name: d for p, d in tf.dump(shards).items()}
    plain, packed = before["plain.tfrecord"], before["packed.tfrecord.gz"]
    p = after["plain.tfrecord"]
    assert len(p["raw"]) == 5
    assert [p["raw"][i] for i in (0, 2, 3, 4)] == [plain[i] for i in (0, 2, 3, 4)]
    m1 = setf(msg(plain[1]), "name", "bytes_list", b"edited")
    assert p["parsed"][1] == canon(m1.SerializeToString(), "example", proto.Example, proto.SequenceExample)
    g = after["packed.tfrecord.gz"]
    assert len(g["raw"]) == 5
    assert [g["raw"][i] for i in (1, 2, 3)] == [packed[i] for i in (1, 2, 4)]
    m0 = setf(msg(packed[0]), "score", "float_list", 1.0, 2.0)
    assert g["parsed"][0] == canon(m0.SerializeToString(), "example", proto.Example, proto.SequenceExample)
    assert g["parsed"][4] == canon(plain[0], "example", proto.Example, proto.SequenceExample)


@pytest.mark.tf
def test_cp_r_into_a_dataset_without_those_keys(data: Path, orig: dict, tfrfs_mount, tf: TFReader,
                                                tmp_path: Path) -> None:
    """SPEC 7's one exception to the round trip: for a key NEW to the dataset, an empty int64 or
    float list comes back as an empty bytes_list ("[]" carries no kind); every other value keeps its kind."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "empty.tfrecord").write_bytes(b"")
    background = len(orig[VAL]) - 1      # the sample's background-only image: empty box and class lists
    m = msg(orig[VAL][background])
    assert values(m, "image/object/bbox/xmin") == () and values(m, "image/object/class/label") == ()
    src = tfrfs_mount(data)    # read-only: the records are copied from here
    mnt = tfrfs_mount(other, "--rw")
    os.mkdir(mnt / "copied.tfrecord")
    sh(f"cp -r {src / VAL / f'{background:06d}'} {mnt}/copied.tfrecord/a"
       f" && cp -r {src / TAB / '000000'} {mnt}/copied.tfrecord/b", cwd=tmp_path)
    commit(mnt)
    for key, f in m.features.feature.items():
        if f.WhichOneof("kind") in ("int64_list", "float_list") and not values(m, key):
            setf(m, key, "bytes_list")
    got = tf.dump([(other / "copied.tfrecord", "example")])[str(other / "copied.tfrecord")]
    assert got["parsed"] == [canon(m.SerializeToString(), "example", proto.Example, proto.SequenceExample),
                             canon(orig[TAB][0], "example", proto.Example, proto.SequenceExample)]


@pytest.mark.tf
@pytest.mark.parametrize("tool", ["cp -r", "cp -a"])
def test_records_copied_into_a_new_dataset_whose_first_holds_empty_lists(tool: str, tmp_path: Path, tfrfs_mount,
                                                                          tf: TFReader) -> None:
    """SPEC 7: "[]" tells no kind. Shards copied record by record into an empty dataset, the first
    record holding empty int64 and float lists: the keys take their kinds from the next records
    (cp -r), or from the user.tfrfs.kind xattr cp -a copies (then also a key that never gets
    another value); TensorFlow parses every record equal to the original. Only with cp -r may an
    empty list whose key never gets a value differ, in kind only."""
    def ex(**feats: tuple[str, tuple]) -> bytes:
        m = proto.Example()
        for key, (kind, vals) in feats.items():
            codec.value_to_proto(codec.Value(kind, vals), m.features.feature[key])
        return m.SerializeToString()

    i64 = (0, -1, 1, 2 ** 63 - 1, -(2 ** 63))
    shards = {
        "first.tfrecord": [
            ex(ids=("int64_list", ()), scores=("float_list", ()), never=("float_list", ()), name=("bytes_list", (b"a",))),
            ex(ids=("int64_list", i64), scores=("float_list", (0.5, -2.0, float("inf"))), name=("bytes_list", (b"b",))),
            ex(ids=("int64_list", ()), scores=("float_list", ()), tags=("bytes_list", ()))],
        "second.tfrecord": [
            ex(ids=("int64_list", ()), scores=("float_list", (1.0,)), tags=("bytes_list", (b"x", b"y")))],
    }
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    for name, records in shards.items():
        (src / name).write_bytes(b"".join(tfrecord.frame(r) for r in records))
    ro = tfrfs_mount(src)
    mnt = tfrfs_mount(dest, "--rw")
    for name, records in shards.items():
        os.mkdir(mnt / name)
        for i in range(len(records)):
            sh(f"{tool} {ro / name / f'{i:06d}'} {mnt / name / f'{i:06d}'}", cwd=tmp_path)
    commit(mnt)
    want = tf.dump([(src / name, "example") for name in shards])
    got = tf.dump([(dest / name, "example") for name in shards])
    for name in shards:
        expected = want[str(src / name)]["parsed"]
        if tool == "cp -r":
            # "never" gets no value in the new dataset: its empty list is bytes_list (SPEC 7).
            for rec in expected:
                if "never" in rec["features"]:
                    rec["features"]["never"] = ["bytes_list", []]
        assert got[str(dest / name)]["parsed"] == expected, name


@pytest.mark.tf
def test_cp_r_round_trip_of_shortened_names(tmp_path: Path, tfrfs_mount, tf: TFReader) -> None:
    """SPEC 3.1: a shortened name stands for the dataset key it was made from. A record whose keys
    are over 255 bytes, copied out with cp -r (no xattrs) and back in, into its own shard and into
    another, has its original keys, not the shortened names as keys; so do its nested folders
    and its .list/ folder, and a SequenceExample record's."""
    long_key, folder, listed, ctx = "k" * 300, "d" * 300, "L" * 300, "c" * 300
    ex = proto.Example()
    setf(ex, long_key, "bytes_list", b"hello")
    setf(ex, f"{folder}/leaf", "int64_list", 1, 2)
    setf(ex, f"{folder}/x", "float_list", 0.5)
    setf(ex, listed, "bytes_list", b"text", b"\0binary")
    setf(ex, "short", "int64_list", 3)
    other = proto.Example()
    setf(other, "n", "int64_list", 0)
    seq = proto.SequenceExample()
    setf(seq, ctx, "bytes_list", b"ctx", section="context")
    steps = seq.feature_lists.feature_list[f"{folder}/steps"]
    steps.feature.add().int64_list.value.append(7)
    src = tmp_path / "src"
    src.mkdir()
    for name, records in (("a.tfrecord", [ex]), ("b.tfrecord", [other]), ("s.tfrecord", [seq, seq])):
        with open(src / name, "wb") as f:
            for m in records:
                f.write(tfrecord.frame(m.SerializeToString()))
    mnt = tfrfs_mount(src, "--rw")
    shown = [n for n in os.listdir(mnt / "a.tfrecord" / "000000") if "~" in n]
    assert len(shown) == 3 and all(len(n.encode()) <= 255 for n in shown)
    out = tmp_path / "out"
    out.mkdir()
    sh(f"cp -r a.tfrecord/000000 {out}/rec && cp -r s.tfrecord/000000 {out}/seq"
       f" && cp -r {out}/rec a.tfrecord/again && cp -r {out}/rec b.tfrecord/copy"
       f" && cp -r {out}/seq s.tfrecord/copy", cwd=mnt)
    assert not any(n.startswith("user.") for n in os.listxattr(out / "rec" / shown[0]))   # cp -r keeps none
    assert sorted(os.listdir(mnt / "b.tfrecord" / "copy")) == sorted(os.listdir(mnt / "a.tfrecord" / "000000"))
    made = mnt / "b.tfrecord" / "copy"
    assert {os.getxattr(made / n, "user.tfrfs.key").decode() for n in os.listdir(made)} == \
        {long_key, folder, listed, "short"}
    commit(mnt)
    got = tf.dump([(src / n, "sequence" if n == "s.tfrecord" else "example")
                   for n in ("a.tfrecord", "b.tfrecord", "s.tfrecord")])
    want_ex = canon(ex.SerializeToString(), "example", proto.Example, proto.SequenceExample)
    want_seq = canon(seq.SerializeToString(), "sequence", proto.Example, proto.SequenceExample)
    assert got[str(src / "a.tfrecord")]["parsed"] == [want_ex, want_ex]
    assert got[str(src / "b.tfrecord")]["parsed"][1] == want_ex
    assert got[str(src / "s.tfrecord")]["parsed"] == [want_seq] * 3


def test_commit_keeps_shard_file_mode(data: Path, tfrfs_mount) -> None:
    shard = data / TRAIN0
    os.chmod(shard, 0o644)
    mnt = tfrfs_mount(data, "--rw")
    write_file(mnt / TRAIN0 / "000000" / "image" / "height.json", "[121]")
    os.mkdir(mnt / "made.tfrecord")
    commit(mnt)
    umask = os.umask(0)
    os.umask(umask)
    assert (os.stat(shard).st_mode & 0o777, os.stat(data / "made.tfrecord").st_mode & 0o777) == \
        (0o644, 0o666 & ~umask)
