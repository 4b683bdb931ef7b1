"""TensorFlow interop: shards written by real TensorFlow, mounted, compared with TF's own view.

``tests/tf_fixtures.py`` writes the shards with TensorFlow; ``tests/tf_oracle.py`` reads them the
way TensorFlow does and computes the tree SPEC.md says the mount must show. Both run once per
session as subprocesses (importing TensorFlow is slow). Every test here then mounts with the real
command line and compares what ``os`` sees with that oracle: paths, kinds, bytes, ``stat`` sizes,
xattrs, modes, damaged-record behaviour, ``.tfrfs/errors``, ``verify``, ``inspect``, and a
``cp -r`` export.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_tfrfs

pytestmark = [pytest.mark.tf, pytest.mark.mount]

TESTS = Path(__file__).resolve().parent
PY = sys.executable


def _need_tf_and_fuse() -> None:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")


def run_tf_script(*args: str, timeout: float = 300) -> str:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
    proc = subprocess.run([PY, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def run_oracle(*sources: str | Path, sample: int | None = None) -> dict:
    args = [str(TESTS / "tf_oracle.py")]
    if sample is not None:
        args += ["--sample", str(sample)]
    out = run_tf_script(*args, *map(str, sources))
    return json.loads(out)["sources"]


@pytest.fixture(scope="session")
def tfdata(tmp_path_factory) -> dict:
    """Fixtures written by TensorFlow, and the oracle's view of them (one TF process each)."""
    _need_tf_and_fuse()
    out = tmp_path_factory.mktemp("tf_fixtures")
    run_tf_script(str(TESTS / "tf_fixtures.py"), str(out))
    clean, damaged = out / "clean", out / "damaged"
    single = clean / "gz_shard.tfrecord.gz"
    oracle = run_oracle(clean, damaged, single)
    return {"root": out, "clean": clean, "damaged": damaged, "single": single,
            "fixtures": json.loads((out / "fixtures.json").read_text()),
            "o_clean": oracle[str(clean)], "o_damaged": oracle[str(damaged)], "o_single": oracle[str(single)]}


# --- walking a tree --------------------------------------------------------------------------

class Node:
    __slots__ = ("path", "is_dir", "st", "data", "err", "list_err", "children", "stat_err")

    def __init__(self, path: str, is_dir: bool, st) -> None:
        self.path, self.is_dir, self.st = path, is_dir, st
        self.data: bytes | None = None
        self.err: int | None = None          # errno of reading the file
        self.list_err: int | None = None     # errno of listing the folder
        self.children: list[str] | None = None
        self.stat_err: int | None = None     # errno of lstat on a name the listing gave


def walk(root: Path, *, only: dict[str, set[str] | None] | None = None, skip_top=(".tfrfs",),
         read: bool = True) -> dict[str, Node]:
    """Every path under ``root`` (relative, '/'-joined) -> Node, contents read.

    ``only`` maps a shard folder's relative path to the record entry names to descend into
    (None: all); the folder itself is always listed in full.
    """
    nodes: dict[str, Node] = {}

    def visit(rel: str, full: str) -> None:
        try:
            names = sorted(os.listdir(full))
        except OSError as exc:
            nodes[rel].list_err = exc.errno
            return
        if rel in nodes:
            nodes[rel].children = names
        keep = only.get(rel) if only is not None and rel in only else None
        for name in names:
            if rel == "" and name in skip_top:
                continue
            crel = name if rel == "" else f"{rel}/{name}"
            cfull = os.path.join(full, name)
            try:
                st = os.lstat(cfull)
            except OSError as exc:
                n = Node(crel, False, None)
                n.err = n.stat_err = exc.errno
                nodes[crel] = n
                continue
            n = Node(crel, stat.S_ISDIR(st.st_mode), st)
            nodes[crel] = n
            if n.is_dir:
                if keep is not None and name not in keep:
                    continue
                visit(crel, cfull)
            elif read:
                if keep is not None and name not in keep:
                    continue
                try:
                    with open(cfull, "rb") as f:
                        n.data = f.read()
                except OSError as exc:
                    n.err = exc.errno

    nodes[""] = Node("", True, os.lstat(root))
    visit("", str(root))
    del nodes[""]
    return nodes


def png_pixels(data: bytes) -> tuple[str, int, int, str] | str:
    from PIL import Image
    try:
        img = Image.open(io.BytesIO(data))
        if img.format != "PNG":
            return f"not a PNG but {img.format}"
        img.load()
    except Exception as exc:  # noqa: BLE001 - any decode failure is a mismatch
        return f"does not decode: {exc!r}"
    return img.mode, img.width, img.height, hashlib.sha256(img.tobytes()).hexdigest()


def _under(path: str, prefixes: set[str]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def compare(actual: dict[str, Node], oracle: dict, *, prefix_map=None, check_stat_size: bool = True,
            scope: set[str] | None = None) -> list[str]:
    """Mismatches between a walked tree and the oracle tree, each one line, path first.

    ``prefix_map`` rewrites oracle paths (old top component -> new); ``scope`` limits the
    comparison to oracle paths under those top-level entries.
    """
    expected: dict[str, dict] = {}
    for p, e in oracle["tree"].items():
        if prefix_map is not None:
            top, _, rest = p.partition("/")
            if top not in prefix_map:
                continue
            p = prefix_map[top] + ("/" + rest if rest else "")
        if scope is not None and not _under(p, scope):
            continue
        expected[p] = e
    if scope is not None:
        actual = {p: n for p, n in actual.items() if _under(p, scope)}
    problems: list[str] = []

    # Records whose data checksum fails (SPEC 6): listed; reading them, or their files, is EIO.
    damaged_seen: set[str] = set()
    for p, e in expected.items():
        if e["t"] != "damaged":
            continue
        parent = p.rsplit("/", 1)[0]
        present = [f"{parent}/{alt}" for alt in e["names"] if f"{parent}/{alt}" in actual]
        if not present:
            problems.append(f"{p!r}: damaged record not listed (expected one of {e['names']})")
            continue
        for ap in present:
            damaged_seen.add(ap)
            n = actual[ap]
            if not n.is_dir:
                if n.err != errno.EIO:
                    problems.append(f"{ap!r}: damaged record read gave {n.data[:40] if n.data is not None else None!r} "
                                    f"(errno {n.err}), expected EIO")
                continue
            if n.list_err is not None:
                if n.list_err != errno.EIO:
                    problems.append(f"{ap!r}: listing damaged record failed with errno {n.list_err}, expected EIO")
                continue
            files = [q for q, m in actual.items() if q.startswith(ap + "/") and not m.is_dir]
            if not files:
                problems.append(f"{ap!r}: damaged record folder lists no files (SPEC 6: reading its files fails with EIO)")
            for q in files:
                if actual[q].err != errno.EIO:
                    problems.append(f"{q!r}: file of a damaged record read with errno {actual[q].err}, expected EIO")
    actual = {p: n for p, n in actual.items() if not _under(p, damaged_seen)}
    expected = {p: e for p, e in expected.items() if e["t"] != "damaged"}

    for p in sorted(set(expected) - set(actual)):
        problems.append(f"{p!r}: missing (expected {expected[p]['t']})")
    for p in sorted(set(actual) - set(expected)):
        n = actual[p]
        if n.stat_err is not None:
            problems.append(f"{p!r}: unexpected name in the listing, and lstat of it fails with "
                            f"{errno.errorcode.get(n.stat_err, n.stat_err)}")
            continue
        problems.append(f"{p!r}: unexpected {'folder' if n.is_dir else 'file'}"
                        + ("" if n.is_dir or n.data is None else f" ({len(n.data)} bytes: {n.data[:60]!r})"))
    for p in sorted(set(expected) & set(actual)):
        e, n = expected[p], actual[p]
        if n.stat_err is not None:
            problems.append(f"{p!r}: listed, but lstat fails with {errno.errorcode.get(n.stat_err, n.stat_err)}")
            continue
        if e["t"] == "dir":
            if not n.is_dir:
                problems.append(f"{p!r}: expected a folder, got a file")
            elif n.list_err is not None:
                problems.append(f"{p!r}: listing failed with errno {n.list_err}")
            continue
        if n.is_dir:
            problems.append(f"{p!r}: expected a file, got a folder")
            continue
        if n.err is not None:
            problems.append(f"{p!r}: reading failed with errno {n.err}")
            continue
        if n.data is None:
            continue  # not read (outside the sampled records)
        if check_stat_size and n.st is not None and n.st.st_size != len(n.data):
            problems.append(f"{p!r}: stat size {n.st.st_size} != {len(n.data)} bytes read")
        if e["t"] == "png":
            got = png_pixels(n.data)
            want = (e["mode"], e["width"], e["height"], e["pixels_sha256"])
            if got != want:
                problems.append(f"{p!r}: PNG pixels: expected mode/size {want[:3]}, got "
                                f"{got[:3] if isinstance(got, tuple) else got}"
                                + ("" if not isinstance(got, tuple) or got[:3] != want[:3] else " (pixel bytes differ)"))
        else:
            if hashlib.sha256(n.data).hexdigest() != e["sha256"] or len(n.data) != e["size"]:
                problems.append(f"{p!r}: content differs: {len(n.data)} bytes {n.data[:80]!r} "
                                f"(expected {e['size']} bytes, sha256 {e['sha256'][:12]})")
    return problems


def get_xattr(path: str, name: str) -> str | None:
    try:
        return os.getxattr(path, name, follow_symlinks=False).decode("utf-8", "surrogateescape")
    except OSError as exc:
        return f"<errno {exc.errno}>"


def check_metadata(mnt: Path, actual: dict[str, Node], oracle: dict, *, check_shard_xattr: bool = True,
                   prefix_map=None) -> list[str]:
    """xattrs (SPEC 3.1, 3.2, 5), modes 0444/0555, owner, and shard mtimes."""
    problems: list[str] = []
    tree = oracle["tree"]
    shard_mtime = {rel: s["mtime"] for rel, s in oracle["shards"].items()}

    def mapped(p: str) -> str | None:
        if prefix_map is None:
            return p
        top, _, rest = p.partition("/")
        return None if top not in prefix_map else prefix_map[top] + ("/" + rest if rest else "")

    for p, e in tree.items():
        mp = mapped(p)
        if mp is None or mp not in actual or e["t"] == "damaged":
            continue
        for name, want in e.get("x", {}).items():
            if name == "user.tfrfs.shard" and not check_shard_xattr:
                continue
            got = get_xattr(os.path.join(mnt, mp), name)
            if got != want:
                problems.append(f"{mp!r}: xattr {name}: expected {want!r}, got {got!r}")
    for p, e in tree.items():      # damaged records keep their record xattrs
        mp = mapped(p)
        if mp is None or e["t"] != "damaged":
            continue
        for alt in e["names"]:
            ap = mp.rsplit("/", 1)[0] + "/" + alt
            if ap in actual and actual[ap].is_dir:
                for name, want in e.get("x", {}).items():
                    if name == "user.tfrfs.shard" and not check_shard_xattr:
                        continue
                    got = get_xattr(os.path.join(mnt, ap), name)
                    if got != want:
                        problems.append(f"{ap!r}: xattr {name}: expected {want!r}, got {got!r}")
    uid = os.getuid()
    inv = {}
    for rel in shard_mtime:
        m = mapped(rel)
        if m is not None:
            inv[m] = rel
    for p, n in actual.items():
        if n.st is None:
            continue
        mode = stat.S_IMODE(n.st.st_mode)
        want = 0o555 if n.is_dir else 0o444
        if mode != want:
            problems.append(f"{p!r}: mode {mode:o}, expected {want:o}")
        if n.st.st_uid != uid:
            problems.append(f"{p!r}: owner {n.st.st_uid}, expected {uid}")
        # SPEC 5: times are the shard file's mtime (shard folder and everything in it)
        top = next((s for s in inv if p == s or p.startswith(s + "/")), None)
        if top is not None and abs(n.st.st_mtime - shard_mtime[inv[top]]) >= 1.0:
            problems.append(f"{p!r}: mtime {n.st.st_mtime}, expected the shard's {shard_mtime[inv[top]]}")
    return problems


def read_errors(mnt: Path) -> tuple[list[dict], list[str]]:
    text = (mnt / ".tfrfs" / "errors").read_text()
    lines, bad = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad.append(line)
            continue
        if not isinstance(obj, dict):
            bad.append(line)
        else:
            lines.append(obj)
    return lines, bad


def check_error_lines(lines: list[dict], oracle: dict, shard_key=lambda rel: rel) -> list[str]:
    """SPEC 6: each problem of each shard has a line with shard, index, offset, reason."""
    problems = []
    for obj in lines:
        missing = {"shard", "index", "offset", "reason"} - set(obj)
        if missing:
            problems.append(f".tfrfs/errors line {obj!r} lacks {sorted(missing)}")
    for rel, s in oracle["shards"].items():
        mine = [o for o in lines if o.get("shard") == shard_key(rel)]
        for pr in s["problems"]:
            t = pr["type"]
            if t in ("data_crc", "parse"):
                ok = any(o.get("index") == pr["index"] and o.get("offset") == pr["offset"] for o in mine)
                want = f"index {pr['index']}, offset {pr['offset']}"
            elif t in ("length_crc", "truncated", "trailing"):
                ok = any(o.get("offset") == pr["offset"] and o.get("index") in (pr["index"], None) for o in mine)
                want = f"offset {pr['offset']}, index {pr['index']} or null"
            else:
                ok = bool(mine)
                want = "any line"
            if not ok:
                problems.append(f"{rel!r}: no .tfrfs/errors line for {t} ({want}); lines for it: {mine!r}")
    return problems


def report(problems: list[str], limit: int = 80) -> str:
    head = problems[:limit]
    more = f"\n... and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{len(problems)} mismatch(es) with the TensorFlow oracle:\n  " + "\n  ".join(head) + more


# --- the tests -------------------------------------------------------------------------------

def test_oracle_is_consistent_with_tensorflow(tfdata):
    """The oracle's own framing reader agrees with tf.data, and the naming module with SPEC 3.1."""
    for key in ("o_clean", "o_damaged", "o_single"):
        o = tfdata[key]
        assert o["oracle_problems"] == [], o["oracle_problems"]
        assert o["name_problems"] == [], o["name_problems"]
    shards = tfdata["o_clean"]["shards"]
    # TensorFlow read every record of every clean shard; the kinds are what the fixtures meant.
    assert all(s["tf_error"] is None and s["tf_count"] == s["count"] for s in shards.values())
    assert shards["raw.tfrecord"]["kind"] == "raw"
    assert shards["kind16.tfrecord"]["kind"] == "raw"      # index 17 is the 16th non-empty record
    assert shards["seq.tfrecord"]["kind"] == "sequence"
    assert shards["gz_shard.tfrecord.gz"]["compression"] == "GZIP"
    assert shards["zlib_shard.zz"]["compression"] == "ZLIB"
    assert shards["gzmagic.tfrecord"]["compression"] == "NONE"
    assert shards["x.tfrecord"]["count"] == 0
    assert "notes.tfrecord" in tfdata["o_clean"]["plain"]
    dmg = tfdata["o_damaged"]["shards"]
    for rel, info in tfdata["fixtures"]["damaged"].items():
        if info["records"] is not None:
            assert dmg[rel]["count"] == info["records"], rel
        assert dmg[rel]["problems"], rel
    assert dmg["datacrc.tfrecord"]["tf_count"] == 2 and dmg["datacrc.tfrecord"]["tf_error"]
    assert dmg["badparse.tfrecord"]["kind"] == "example"


def test_clean_tree_and_content(tfdata, tfrfs_mount):
    """Every path, kind, byte and stat size of the clean fixture directory is what SPEC 1-5 say."""
    mnt = tfrfs_mount(tfdata["clean"])
    actual = walk(mnt)
    problems = compare(actual, tfdata["o_clean"])
    assert not problems, report(problems)


def test_clean_metadata(tfdata, tfrfs_mount):
    """xattrs user.tfrfs.key/kind on features, shard/index/offset/length on records; 0444/0555."""
    mnt = tfrfs_mount(tfdata["clean"])
    actual = walk(mnt, read=False)
    problems = check_metadata(mnt, actual, tfdata["o_clean"])
    errs, bad = read_errors(mnt)
    if bad or errs:
        problems.append(f".tfrfs/errors of a clean source is not empty: {(errs + bad)[:5]!r}")
    schema = (mnt / ".tfrfs" / "schema.json").read_bytes()
    try:
        json.loads(schema)
    except ValueError as exc:
        problems.append(f".tfrfs/schema.json is not JSON: {exc}")
    else:
        for key in ("int_many", "edges", "nokind", "Zoë", "日本", "image_raw", "image/encoded"):
            if json.dumps(key, ensure_ascii=False).encode() not in schema and json.dumps(key).encode() not in schema:
                problems.append(f".tfrfs/schema.json does not mention key {key!r}")
    for p in (".tfrfs", ".tfrfs/errors", ".tfrfs/schema.json"):
        if not os.path.exists(mnt / p):
            problems.append(f"{p} missing")
    # read-only is the default (SPEC 7): no write, create, mkdir, unlink or rename gets through
    rec = mnt / "kinds.tfrecord" / "000000"
    attempts = {
        "open int_one.json for writing": lambda: open(rec / "int_one.json", "r+b").close(),
        "create new.json": lambda: open(rec / "new.json", "xb").close(),
        "mkdir in a record": lambda: os.mkdir(rec / "newdir"),
        "mkdir in a shard folder": lambda: os.mkdir(mnt / "kinds.tfrecord" / "000099"),
        "unlink a feature": lambda: os.unlink(rec / "label.txt"),
        "rename a feature": lambda: os.rename(rec / "label.txt", rec / "label2.txt"),
        "truncate a plain file": lambda: os.truncate(mnt / "README.txt", 0),
    }
    for what, fn in attempts.items():
        try:
            fn()
            problems.append(f"read-only mount allowed: {what}")
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                problems.append(f"read-only mount: {what} failed with errno {exc.errno}, expected EROFS/EACCES/EPERM")
    if (rec / "int_one.json").read_bytes() != b"[3]\n":
        problems.append("int_one.json changed in a read-only mount")
    assert not problems, report(problems)


def test_cp_r_export_matches_oracle(tfdata, tfrfs_mount, tmp_path):
    """``cp -r`` of the whole mount gives the same tree and bytes (stat sizes are exact)."""
    mnt = tfrfs_mount(tfdata["clean"])
    dest = tmp_path / "export"
    proc = subprocess.run(["cp", "-r", str(mnt), str(dest)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"cp -r failed: {proc.stderr[-3000:]}"
    actual = walk(dest)
    problems = compare(actual, tfdata["o_clean"], check_stat_size=True)
    assert not problems, report(problems)


def test_damaged_shards(tfdata, tfrfs_mount):
    """SPEC 6: bad data crc -> listed, EIO, later records served; bad header / cut short / trailing
    bytes -> the records before it; a late unparseable record -> NNNNNN.bin; every problem in
    .tfrfs/errors; the daemon survives."""
    first = tfrfs_mount(tfdata["damaged"])
    # A listing comes from the index alone (it never parses records), so a record past the first
    # 16 that does not parse is listed as a folder until it is first opened (README, "Damaged
    # data"); from then on, and on every later mount, it is NNNNNN.bin as SPEC 2 says.
    late = first / "badparse.tfrecord" / "000017"
    assert late.is_dir() and os.listdir(late) == []
    assert (first / "badparse.tfrecord" / "000017.bin").is_file()
    assert "000017.bin" in os.listdir(first / "badparse.tfrecord")
    run_tfrfs("umount", str(first))
    mnt = tfrfs_mount(tfdata["damaged"])
    actual = walk(mnt)
    problems = compare(actual, tfdata["o_damaged"])
    problems += check_metadata(mnt, actual, tfdata["o_damaged"])
    # reading a damaged record twice still gives EIO, and the mount is still alive afterwards
    rec = mnt / "datacrc.tfrecord" / "000002"
    if rec.is_dir():
        for f in rec.rglob("*"):
            if f.is_file():
                try:
                    f.read_bytes()
                    problems.append(f"{f}: second read succeeded")
                except OSError as exc:
                    if exc.errno != errno.EIO:
                        problems.append(f"{f}: second read errno {exc.errno}")
    try:
        os.listdir(mnt)
    except OSError as exc:
        problems.append(f"the mount died after reading damaged records: {exc!r}")
    lines, bad = read_errors(mnt)
    if bad:
        problems.append(f".tfrfs/errors lines that are not JSON objects: {bad[:5]!r}")
    problems += check_error_lines(lines, tfdata["o_damaged"])
    assert not problems, report(problems)


def test_verify_exit_codes(tfdata):
    """``tfrfs verify``: 1 on the damaged directory (each damaged shard named), 0 on a clean one."""
    proc = run_tfrfs("verify", str(tfdata["damaged"]))
    assert proc.returncode == 1, f"verify damaged exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout + proc.stderr
    missing = [rel for rel in tfdata["o_damaged"]["shards"] if rel not in out]
    assert not missing, f"verify output does not name {missing}:\n{out}"
    proc = run_tfrfs("verify", str(tfdata["clean"]))
    assert proc.returncode == 0, f"verify clean exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    proc = run_tfrfs("verify", str(tfdata["damaged"] / "trailing.tfrecord"))
    assert proc.returncode == 1, f"verify of a shard with trailing bytes exited {proc.returncode}"


def test_inspect_lists_shards_and_counts(tfdata):
    proc = run_tfrfs("inspect", str(tfdata["clean"]))
    assert proc.returncode == 0, f"inspect exited {proc.returncode}:\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    missing = []
    for rel, s in tfdata["o_clean"]["shards"].items():
        if not any(rel in line and str(s["count"]) in line.replace(rel, "") for line in lines):
            missing.append((rel, s["count"]))
    assert not missing, f"inspect output lacks shard/count lines for {missing}:\n{proc.stdout[:3000]}"


def test_single_gzip_file(tfdata, tfrfs_mount):
    """SOURCE a single GZIP shard: one shard folder at the top of the mount."""
    mnt = tfrfs_mount(tfdata["single"])
    actual = walk(mnt)
    problems = compare(actual, tfdata["o_single"])
    problems += check_metadata(mnt, actual, tfdata["o_single"], check_shard_xattr=False)
    assert not problems, report(problems)


def test_quoted_glob(tfdata, tfrfs_mount):
    """SOURCE a quoted glob: its shards as shard folders at the top, nothing else."""
    mnt = tfrfs_mount(str(tfdata["clean"] / "glob_*.tfrecord"))
    actual = walk(mnt)
    tops = sorted(p for p in actual if "/" not in p)
    assert tops == ["glob_a.tfrecord", "glob_b.tfrecord"], tops
    problems = compare(actual, tfdata["o_clean"], prefix_map={"glob_a.tfrecord": "glob_a.tfrecord",
                                                              "glob_b.tfrecord": "glob_b.tfrecord"})
    assert not problems, report(problems)


def test_no_decode_raw_and_records_override(tfdata, tfrfs_mount):
    """``--no-decode-raw`` (SPEC 3.3) shows raw pixel arrays by the other rows of 3.2;
    ``--records raw`` (SPEC 2) shows every record as NNNNNN.bin holding its bytes."""
    clean, o = tfdata["clean"], tfdata["o_clean"]
    problems: list[str] = []
    mnt = tfrfs_mount(clean / "pixels.tfrecord", "--no-decode-raw")
    actual = walk(mnt)
    oracle = {"tree": {}, "shards": o["shards"]}
    for p, e in o["tree"].items():
        if p == "pixels.tfrecord" or p.startswith("pixels.tfrecord/"):
            if e["t"] == "png":
                p = p[: -len(".png")] + e["raw_suffix"]
                e = {"t": "file", "sha256": e["pixels_sha256"], "size": e["raw_size"], "x": e.get("x", {})}
            oracle["tree"][p] = e
    problems += compare(actual, oracle)

    mnt = tfrfs_mount(clean / "kinds.tfrecord", "--records", "raw")
    s = o["shards"]["kinds.tfrecord"]
    want = {"kinds.tfrecord": None}
    for i, sha in enumerate(s["records_sha256"]):
        want[f"kinds.tfrecord/{i:06d}.bin"] = sha
    got = walk(mnt)
    if sorted(got) != sorted(want):
        problems.append(f"--records raw: paths {sorted(got)}, expected {sorted(want)}")
    for p, sha in want.items():
        n = got.get(p)
        if sha is not None and n is not None and (n.data is None or hashlib.sha256(n.data).hexdigest() != sha):
            problems.append(f"--records raw: {p!r} does not hold the record's bytes ({n.data!r:.80})")
    assert not problems, report(problems)
