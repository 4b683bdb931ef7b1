"""A Hypothesis state machine: random edits to a ``--rw`` mount and to a plain in-memory model.

The dataset is two small example shards whose records hold an int64 key ``n``, a float key
``x`` and a text key ``t`` (drawn by Hypothesis). Rules edit the mount the way a user would (open,
write, close; mkdir; rm -r; mv; ``tfrfs commit``) and apply the same change to ``Model``, a dict
per record of key -> ``codec.Value``, following SPEC 7 (kinds kept for keys the dataset has,
inferred for new ones; invalid content refused with EINVAL and nothing changed; names stable
until a commit, renumbered after). After every step the mount's visible tree — names in order,
file names and bytes — must be what the model renders; after every commit, the shard files
themselves (read with ``tfrfs.tfrecord`` and ``tfrfs.proto``) must hold the model's records.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tfrfs import codec, names, proto, tfrecord

from conftest import force_unmount, is_mounted, run_tfrfs

pytestmark = [pytest.mark.mount]

SHARDS = ("a.tfrecord", "b.tfrecord")
INT_KEYS = ("n", "m")          # n is in the dataset; m is new to it
FLOAT_KEYS = ("x", "y")        # x is in the dataset; y is new
TEXT_KEYS = ("t", "note")      # t is in the dataset; note is new
NEW_RECORD_NAMES = ("new", "rec-b", "zz")

ints = st.integers(-(2 ** 63), 2 ** 63 - 1)
f32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
texts = st.text(alphabet="abcxyz é-", max_size=8)
int_lists = st.lists(ints, min_size=1, max_size=3)
float_lists = st.lists(f32s, min_size=1, max_size=3)


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def float_json(values: list[float], ints_ok: bool) -> str:
    """How a user might write floats: integral ones as integers when the key's kind is kept anyway."""
    parts = []
    for v in values:
        if math.isnan(v):
            parts.append("NaN")
        elif math.isinf(v):
            parts.append("Infinity" if v > 0 else "-Infinity")
        elif ints_ok and v == int(v) and not (v == 0 and math.copysign(1, v) < 0):
            parts.append(str(int(v)))
        else:
            parts.append(repr(v))
    return "[" + ",".join(parts) + "]"


Record = dict[str, codec.Value]


class Model:
    """Per shard: the visible records, in listing order, as (name, features)."""

    def __init__(self, shards: dict[str, list[Record]]) -> None:
        self.shards = {s: [(f"{i:06d}", dict(r)) for i, r in enumerate(recs)] for s, recs in shards.items()}
        self.added: dict[str, set[str]] = {s: set() for s in shards}   # names of records added since the commit
        self.known = self._keys()

    def _keys(self) -> dict[str, str]:
        """Kinds of the keys the committed dataset holds (what .tfrfs/schema.json knows)."""
        out: dict[str, str] = {}
        for recs in self.shards.values():
            for _, feats in recs:
                for k, v in feats.items():
                    out.setdefault(k, v.kind)
        return out

    def names(self, shard: str) -> list[str]:
        return [n for n, _ in self.shards[shard]]

    def record(self, shard: str, name: str) -> Record:
        return next(f for n, f in self.shards[shard] if n == name)

    def add(self, shard: str, name: str, feats: Record) -> None:
        # Added records come after the originals, in the order of their names.
        recs = self.shards[shard]
        originals = [r for r in recs if r[0] not in self.added[shard]]
        added = sorted([r for r in recs if r[0] in self.added[shard]] + [(name, feats)])
        self.shards[shard] = originals + added
        self.added[shard].add(name)

    def remove(self, shard: str, name: str) -> Record:
        feats = self.record(shard, name)
        self.shards[shard] = [r for r in self.shards[shard] if r[0] != name]
        self.added[shard].discard(name)
        return feats

    def reparsed(self, key: str, value: codec.Value) -> codec.Value:
        """The value a feature's file gives when it is written again (copied, or renamed) as ``key``:
        the dataset's kind if it knows the key, else inferred, so "[]" is an empty bytes_list (SPEC 7)."""
        if key not in self.known and value.kind in ("int64_list", "float_list") and not value.values:
            return codec.Value("bytes_list", ())
        return value

    def commit(self) -> None:
        self.shards = {s: [(f"{i:06d}", f) for i, (_, f) in enumerate(recs)] for s, recs in self.shards.items()}
        self.added = {s: set() for s in self.shards}
        self.known = self._keys()

    @staticmethod
    def render(feats: Record) -> dict[str, bytes]:
        views = {k: codec.render(v) for k, v in feats.items()}
        paths = names.layout([(k, v.suffix) for k, v in views.items()])
        out = {}
        for k, view in views.items():
            assert isinstance(view, codec.FileView)
            out["/".join(paths[k])] = view.data
        return out

    @staticmethod
    def message(feats: Record) -> bytes:
        ex = proto.Example()
        for k, v in feats.items():
            codec.value_to_proto(v, ex.features.feature[k])
        return ex.SerializeToString(deterministic=True)


def canon(data: bytes) -> dict:
    ex = proto.Example.FromString(data)
    out = {}
    for k, f in ex.features.feature.items():
        v = codec.value_from_proto(f)
        vals = tuple(struct.pack("<f", x) for x in v.values) if v.kind == "float_list" else v.values
        out[k] = (v.kind, vals)
    return out


def read_tree(folder: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(folder))] = p.read_bytes()
    return out


class WritableMount(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="tfrfs-model-"))
        self.src = self.tmp / "src"
        self.mnt = self.tmp / "mnt"
        self.log = self.tmp / "daemon.log"
        self.model: Model | None = None

    @initialize(data=st.lists(st.tuples(int_lists, float_lists, texts), min_size=6, max_size=6))
    def mount(self, data: list) -> None:
        self.src.mkdir()
        self.mnt.mkdir()
        shards: dict[str, list[Record]] = {}
        for s, shard in enumerate(SHARDS):
            recs: list[Record] = []
            for n, x, t in data[3 * s: 3 * s + 3]:
                recs.append({"n": codec.Value("int64_list", tuple(n)),
                             "x": codec.Value("float_list", tuple(_f32(v) for v in x)),
                             "t": codec.Value("bytes_list", (t.encode(),))})
            shards[shard] = recs
            with open(self.src / shard, "wb") as f:
                w = tfrecord.StreamWriter(f)
                for r in recs:
                    w.write(Model.message(r))
                w.close()
        self.model = Model(shards)
        proc = run_tfrfs("mount", str(self.src), str(self.mnt), "--rw", "--cache-dir", str(self.tmp / "cache"),
                         "--log", str(self.log))
        assert proc.returncode == 0, proc.stderr

    def teardown(self) -> None:
        try:
            if is_mounted(self.mnt):
                run_tfrfs("umount", str(self.mnt))
            force_unmount(self.mnt)
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            assert "Traceback" not in log, log[-4000:]
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------------

    def _pick_record(self, data: st.DataObject) -> tuple[str, str] | None:
        assert self.model is not None
        choices = [(s, n) for s in SHARDS for n in self.model.names(s)]
        return data.draw(st.sampled_from(choices)) if choices else None

    def _write(self, shard: str, name: str, rel: str, content: str) -> None:
        with open(self.mnt / shard / name / rel, "w", encoding="utf-8") as f:
            f.write(content)

    def _set(self, shard: str, name: str, key: str, value: codec.Value, content: str) -> None:
        """Write a feature file (int and float keys as .json, text keys as .txt) and the model."""
        assert self.model is not None
        feats = self.model.record(shard, name)
        self._write(shard, name, key + ".json" if value.kind != "bytes_list" or key not in TEXT_KEYS
                    else key + ".txt", content)
        feats[key] = value

    # -- rules ---------------------------------------------------------------------------------

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), key=st.sampled_from(INT_KEYS), values=st.lists(ints, max_size=3))
    def set_int(self, data: st.DataObject, key: str, values: list[int]) -> None:
        assert self.model is not None
        where = self._pick_record(data)
        if where is None:
            return
        feats = self.model.record(*where)
        if key in feats and feats[key].kind != "int64_list":
            return
        known = self.model.known.get(key)
        if known not in (None, "int64_list") or (not values and known is None):
            return   # [] for a key new to the dataset means bytes_list (SPEC 7): kept out of int keys
        self._set(*where, key, codec.Value("int64_list", tuple(values)), json.dumps(values))

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), key=st.sampled_from(FLOAT_KEYS), values=st.lists(f32s, max_size=3))
    def set_float(self, data: st.DataObject, key: str, values: list[float]) -> None:
        assert self.model is not None
        where = self._pick_record(data)
        if where is None:
            return
        feats = self.model.record(*where)
        if key in feats and feats[key].kind != "float_list":
            return
        known = self.model.known.get(key)
        present = key in feats
        if known not in (None, "float_list") or (not values and known is None and not present):
            return
        # A known float key (or one the record holds) keeps its kind: integers may be written.
        text = float_json(values, ints_ok=known == "float_list" or present)
        # "NaN" in JSON carries no sign or payload: what is written is the plain quiet NaN.
        written = tuple(math.nan if math.isnan(v) else v for v in values)
        self._set(*where, key, codec.Value("float_list", tuple(_f32(v) for v in written)), text)

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), key=st.sampled_from(TEXT_KEYS), text=texts)
    def set_text(self, data: st.DataObject, key: str, text: str) -> None:
        assert self.model is not None
        where = self._pick_record(data)
        if where is None:
            return
        feats = self.model.record(*where)
        if key in feats and codec.render(feats[key]).suffix != ".txt":
            return
        if self.model.known.get(key) not in (None, "bytes_list"):
            return
        self._set(*where, key, codec.Value("bytes_list", (text.encode(),)), text)

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data())
    def delete_feature(self, data: st.DataObject) -> None:
        assert self.model is not None
        where = self._pick_record(data)
        if where is None:
            return
        feats = self.model.record(*where)
        if not feats:
            return
        key = data.draw(st.sampled_from(sorted(feats)))
        os.unlink(self.mnt / where[0] / where[1] / (key + codec.render(feats[key]).suffix))
        del feats[key]

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), shard=st.sampled_from(SHARDS), name=st.sampled_from(NEW_RECORD_NAMES),
          n=st.none() | int_lists, t=st.none() | texts)
    def add_record(self, data: st.DataObject, shard: str, name: str, n: list[int] | None, t: str | None) -> None:
        assert self.model is not None
        if name in self.model.names(shard):
            return
        os.mkdir(self.mnt / shard / name)
        feats: Record = {}
        self.model.add(shard, name, feats)
        if n is not None and self.model.known.get("n") in (None, "int64_list"):
            self._set(shard, name, "n", codec.Value("int64_list", tuple(n)), json.dumps(n))
        if t is not None and self.model.known.get("t") in (None, "bytes_list"):
            self._set(shard, name, "t", codec.Value("bytes_list", (t.encode(),)), t)

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data())
    def delete_record(self, data: st.DataObject) -> None:
        assert self.model is not None
        where = self._pick_record(data)
        if where is None:
            return
        subprocess.run(["rm", "-r", str(self.mnt / where[0] / where[1])], check=True)
        self.model.remove(*where)

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), name=st.sampled_from(NEW_RECORD_NAMES))
    def move_record(self, data: st.DataObject, name: str) -> None:
        assert self.model is not None
        where = self._pick_record(data)
        if where is None:
            return
        dest = SHARDS[1 - SHARDS.index(where[0])]
        if name in self.model.names(dest):
            return
        os.rename(self.mnt / where[0] / where[1], self.mnt / dest / name)
        self.model.add(dest, name, self.model.remove(*where))

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), name=st.sampled_from(NEW_RECORD_NAMES), shard=st.sampled_from(SHARDS))
    def copy_record(self, data: st.DataObject, name: str, shard: str) -> None:
        """shutil.copytree: cp -a, file by file, xattrs included."""
        assert self.model is not None
        where = self._pick_record(data)
        if where is None or name in self.model.names(shard):
            return
        shutil.copytree(self.mnt / where[0] / where[1], self.mnt / shard / name)
        feats = self.model.record(*where)
        self.model.add(shard, name, {k: self.model.reparsed(k, v) for k, v in feats.items()})

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), pair=st.sampled_from([INT_KEYS, INT_KEYS[::-1], TEXT_KEYS, TEXT_KEYS[::-1],
                                                FLOAT_KEYS, FLOAT_KEYS[::-1]]))
    def rename_feature(self, data: st.DataObject, pair: tuple[str, str]) -> None:
        """mv of a feature file within its record, onto a free name or over another feature."""
        assert self.model is not None
        old, new = pair
        where = self._pick_record(data)
        if where is None:
            return
        feats = self.model.record(*where)
        if old not in feats:
            return
        value = self.model.reparsed(new, feats[old])
        if self.model.known.get(new, value.kind) != value.kind:
            return
        suffix = codec.render(feats[old]).suffix
        folder = self.mnt / where[0] / where[1]
        if new in feats and codec.render(feats[new]).suffix != suffix:
            return   # mv would leave the other file of that key: two files for one key
        os.rename(folder / (old + suffix), folder / (new + suffix))
        del feats[old]
        feats[new] = value

    @precondition(lambda self: self.model is not None)
    @rule(data=st.data(), bad=st.sampled_from([
        ("int64_list", "[1.5]"), ("int64_list", '["a"]'), ("int64_list", "[9223372036854775808]"),
        ("int64_list", "nonsense"), ("float_list", "[1e39]"), ("float_list", '[1, "a"]'), ("float_list", "{}"),
        ("int64_list", "null")]))
    def invalid_write(self, data: st.DataObject, bad: tuple[str, str]) -> None:
        assert self.model is not None
        kind, content = bad
        where = self._pick_record(data)
        if where is None:
            return
        feats = self.model.record(*where)
        keys = sorted(k for k, v in feats.items() if v.kind == kind)
        if not keys:
            return
        key = data.draw(st.sampled_from(keys))
        with pytest.raises(OSError) as info:
            self._write(*where, key + ".json", content)
        assert info.value.errno == errno.EINVAL
        # The model does not change: the invariants check the old value is still shown.

    @precondition(lambda self: self.model is not None)
    @rule()
    def commit(self) -> None:
        assert self.model is not None
        run_tfrfs("commit", str(self.mnt), check=True)
        self.model.commit()
        for shard in SHARDS:
            got = [canon(r) for r in tfrecord.iter_records(self.src / shard)]
            want = [canon(Model.message(f)) for _, f in self.model.shards[shard]]
            assert got == want, f"{shard} after commit"

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def tree_matches_model(self) -> None:
        if self.model is None:
            return
        for shard in SHARDS:
            assert os.listdir(self.mnt / shard) == self.model.names(shard), shard
            for name, feats in self.model.shards[shard]:
                assert read_tree(self.mnt / shard / name) == Model.render(feats), f"{shard}/{name}"


# Each example mounts and unmounts (~0.5 s); TFRFS_MODEL_EXAMPLES=150 searches harder (~2.5 min).
WritableMount.TestCase.settings = settings(max_examples=int(os.environ.get("TFRFS_MODEL_EXAMPLES", 20)),
                                           stateful_step_count=20, deadline=None,
                                           suppress_health_check=list(HealthCheck))


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse")
def test_writable_mount_matches_model() -> None:
    WritableMount.TestCase().runTest()
