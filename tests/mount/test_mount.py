"""Real FUSE mounts of the built-in sample: what ls, cp, find and friends see."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tfrfs.format import jsontext
from tfrfs.format import proto
from tfrfs.format import tfrecord
from tfrfs.fuse import turns

from conftest import force_unmount, is_mounted, run_tfrfs
from support import example_pb, reference

pytestmark = pytest.mark.mount


def test_tree_never_imports_fuse() -> None:
    code = ("import sys, tfrfs.view.tree, tfrfs.cli; "
            "assert 'tfrfs.fuse.libfuse' not in sys.modules, 'libfuse was loaded'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_layout_and_contents(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample)
    top = sorted(os.listdir(mnt))
    assert top == sorted(["clips.tfrecord", "dataset_info.json", "label_map.pbtxt", "mnist_raw.tfrecord",
                          "raw_rgb.tfrecord", "tabular.tfrecord.gz", "train", "val"])
    assert ".tfrfs" not in top and os.path.isdir(mnt / ".tfrfs")
    shard = mnt / "train" / "train-00000-of-00002.tfrecord"
    assert sorted(os.listdir(shard)) == [f"{i:06d}" for i in range(12)]
    rec = shard / "000000"
    records = reference.written_records(sample / "train" / "train-00000-of-00002.tfrecord")
    ex = example_pb.Example.FromString(records[0])
    feats = ex.features.feature
    assert (rec / "image" / "encoded.jpg").read_bytes() == feats["image/encoded"].bytes_list.value[0]
    assert json.loads((rec / "image" / "height.json").read_text()) == list(feats["image/height"].int64_list.value)
    labels = (rec / "image" / "object" / "class" / "label.json").read_bytes()
    assert labels == jsontext.dumps_json(list(feats["image/object/class/label"].int64_list.value))
    # Exact sizes, modes, owner and time.
    st = os.stat(rec / "image" / "encoded.jpg")
    assert st.st_size == len(feats["image/encoded"].bytes_list.value[0])
    assert stat.S_IMODE(st.st_mode) == 0o444 and stat.S_IMODE(os.stat(rec).st_mode) == 0o555
    assert st.st_uid == os.getuid()
    assert st.st_mtime_ns == os.stat(sample / "train" / "train-00000-of-00002.tfrecord").st_mtime_ns
    # Plain files pass through unchanged.
    assert (mnt / "label_map.pbtxt").read_bytes() == (sample / "label_map.pbtxt").read_bytes()


def test_xattrs(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample)
    rec = mnt / "train" / "train-00000-of-00002.tfrecord" / "000001"
    assert os.getxattr(rec, "user.tfrfs.shard") == b"train/train-00000-of-00002.tfrecord"
    assert os.getxattr(rec, "user.tfrfs.index") == b"1"
    offset = int(os.getxattr(rec, "user.tfrfs.offset"))
    length = int(os.getxattr(rec, "user.tfrfs.length"))
    data = (sample / "train" / "train-00000-of-00002.tfrecord").read_bytes()
    assert tfrecord.parse_header(data[offset:offset + 12]) == length
    f = rec / "image" / "object" / "bbox" / "xmin.json"
    assert os.getxattr(f, "user.tfrfs.key") == b"image/object/bbox/xmin"
    assert os.getxattr(f, "user.tfrfs.kind") == b"float_list"
    assert os.getxattr(rec / "image", "user.tfrfs.key") == b"image"
    with pytest.raises(OSError) as e:
        os.getxattr(f, "user.nothing")
    assert e.value.errno == errno.ENODATA


def test_read_only_refuses_writes(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample)
    rec = mnt / "train" / "train-00000-of-00002.tfrecord" / "000000"
    for action in (lambda: (rec / "image" / "height.json").write_text("[1]"),
                   lambda: os.mkdir(rec / "new"),
                   lambda: os.unlink(rec / "image" / "height.json")):
        with pytest.raises(OSError) as e:
            action()
        assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def test_bad_names(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample)
    shard = mnt / "train" / "train-00000-of-00002.tfrecord"
    for name in ("12", "0000012", "000012", "000000.bin", "abc", "\udcff"):
        assert not os.path.exists(os.path.join(os.fsencode(shard), os.fsencode(name)))
    with pytest.raises(OSError) as e:
        os.stat(shard / ("x" * 300))
    assert e.value.errno == errno.ENAMETOOLONG


def test_cp_r_find_ls_grep(sample: Path, tfrfs_mount, tmp_path: Path) -> None:
    mnt = tfrfs_mount(sample)
    out = tmp_path / "copy"
    shutil.copytree(mnt / "val", out)
    n_files = sum(len(fs) for _, _, fs in os.walk(out))
    found = subprocess.run(["find", str(mnt / "val"), "-type", "f"], capture_output=True, text=True, check=True)
    assert len(found.stdout.splitlines()) == n_files
    # ls -lR stats every entry (a failed stat goes to stderr): each file listed once, read-only.
    files = [Path(d) / f for d, dirs, fs in os.walk(mnt) for f in fs]
    ls = subprocess.run(["ls", "-lR", str(mnt)], capture_output=True, text=True)
    assert ls.returncode == 0 and ls.stderr == "", ls.stderr
    listed = [line for line in ls.stdout.splitlines() if line.startswith("-")]
    assert len(listed) == len(files) > 300 and all(line.startswith("-r--r--r-- ") for line in listed)
    # grep finds exactly the files holding the word, and exits 0 for having found some.
    holding = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and b"cat" in p.read_bytes())
    assert holding
    grep = subprocess.run(["grep", "-rl", "cat", str(mnt / "val")], capture_output=True, text=True)
    assert grep.returncode == 0 and grep.stderr == "", grep.stderr
    assert sorted(str(Path(p).relative_to(mnt / "val")) for p in grep.stdout.splitlines()) == holding
    subprocess.run(["cp", "-r", str(mnt / "clips.tfrecord"), str(tmp_path / "clips")], check=True)
    assert (tmp_path / "clips" / "000000" / "context").is_dir()
    assert (tmp_path / "clips" / "000000" / "feature_lists").is_dir()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: drop_caches, to make the kernel forget inodes")
@pytest.mark.parametrize("rw", [False, True])
def test_inode_numbers_survive_the_kernel_forgetting(rw: bool, sample: Path, tmp_path: Path, tfrfs_mount) -> None:
    """cp, rsync and tar compare a file's inode number between stat and open: one the kernel
    forgot in between (memory pressure, here drop_caches) must come back with the same number."""
    src = tmp_path / "src"
    shutil.copytree(sample, src)
    mnt = tfrfs_mount(src, *(["--rw"] if rw else []))
    rec = next(p for p in sorted((mnt / "val").iterdir()) if p.is_dir())
    paths = [mnt / "val", rec] + sorted(p for p in rec.rglob("*") if p.is_file())[:5]
    before = [os.stat(p).st_ino for p in paths]
    listed = {e.name: e.inode() for e in os.scandir(rec)}
    assert len(set(before)) == len(before)
    assert os.stat(mnt).st_ino == 1 and os.stat(mnt / ".").st_ino == 1
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("2\n")   # dentries and inodes
    assert [os.stat(p).st_ino for p in paths] == before
    assert listed == {e.name: os.stat(rec / e.name).st_ino for e in os.scandir(rec)}


@pytest.mark.parametrize("rw", [False, True])
def test_records_are_numbered_in_record_order(rw: bool, sample: Path, tmp_path: Path, tfrfs_mount) -> None:
    """cp -r reads a folder's entries in inode order: a shard's records must come in record
    order (a remote shard is then read in order, and read ahead), in listings and in stat."""
    src = tmp_path / "src"
    shutil.copytree(sample, src)
    mnt = tfrfs_mount(src, *(["--rw"] if rw else []))
    shards = ["train/train-00000-of-00002.tfrecord", "train/train-00001-of-00002.tfrecord",
              "val/val-00000-of-00001.tfrecord", "mnist_raw.tfrecord"]   # the last: records as .bin
    for shard in shards:
        listed = [(e.inode(), e.name) for e in os.scandir(mnt / shard)]
        assert len(listed) > 2
        assert sorted(listed) == sorted(listed, key=lambda e: e[1])
        assert [os.stat(mnt / shard / name).st_ino for _, name in listed] == [i for i, _ in listed]
    ids = [os.stat(mnt / shard / name).st_ino for shard in shards for name in os.listdir(mnt / shard)]
    assert len(set(ids)) == len(ids)


def test_listings_carry_exact_attributes(sample: Path, tfrfs_mount) -> None:
    """A read-only listing hands the kernel each entry's attributes (readdirplus), and stat then
    answers from them without asking the daemon: they must be exactly what a lookup gives."""
    mnt = tfrfs_mount(sample)
    shard_mtime = os.stat(sample / "train" / "train-00000-of-00002.tfrecord").st_mtime_ns
    files = 0
    for dirpath, _dirs, names in os.walk(mnt):   # listings first, as ls -l, find and cp -r do
        for entry in os.scandir(dirpath):
            st = entry.stat(follow_symlinks=False)
            assert st.st_ino == entry.inode()
            if entry.is_dir(follow_symlinks=False):
                assert stat.S_IMODE(st.st_mode) == 0o555
                continue
            files += 1
            data = Path(entry.path).read_bytes()
            assert st.st_size == len(data), entry.path
            assert stat.S_IMODE(st.st_mode) == 0o444 and st.st_uid == os.getuid()
            assert st.st_blocks == (len(data) + 511) // 512
            if "/train/train-00000-of-00002.tfrecord/" in entry.path:
                assert st.st_mtime_ns == shard_mtime
    assert files > 300


@pytest.mark.skipif(os.geteuid() != 0, reason="the read-ahead knob is root's")
def test_read_only_mount_reads_ahead_1_mib(sample: Path, tmp_path: Path) -> None:
    """Large files arrive in 1 MiB requests: the mount's read-ahead is raised from 128 KiB. The
    paths are relative, as typed in a shell: the daemon runs in / (libfuse moves it there)."""
    (tmp_path / "mnt").mkdir()
    run_tfrfs("mount", str(sample), "mnt", "--cache-dir", "cache", "--log", "daemon.log", cwd=tmp_path, check=True)
    try:
        dev = os.stat(tmp_path / "mnt").st_dev
        knob = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        deadline = time.monotonic() + 5
        while knob.read_text().strip() != "1024" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert knob.read_text().strip() == "1024"
        assert len(os.listdir(tmp_path / "mnt" / "train" / "train-00000-of-00002.tfrecord")) == 12
    finally:
        run_tfrfs("umount", "mnt", cwd=tmp_path)
        still_mounted = is_mounted(tmp_path / "mnt")
        force_unmount(tmp_path / "mnt")   # whatever happened above, leave no mount behind
    assert not still_mounted
    log = (tmp_path / "daemon.log").read_text()
    assert "read-ahead 1024 KiB" in log and "Traceback" not in log


def _daemon_pid(mnt: Path) -> int:
    out = subprocess.run(["pgrep", "-f", "--", f"{mnt} -f --daemon"], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, f"expected one daemon for {mnt}, found {out}"
    return int(out[0])


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("poll_us", ["0", "100", "5000"])
def test_request_loop_serves_then_sleeps_and_ends_on_sigterm(poll_us: str, sample: Path, tfrfs_mount) -> None:
    """The daemon's request loop (--poll-us N: it watches N microseconds for the next request
    before sleeping) answers everything, spends no CPU once requests stop, and ends on SIGTERM
    as libfuse's own loop does: unmounted, the daemon gone."""
    mnt = tfrfs_mount(sample, "--poll-us", poll_us)
    pid = _daemon_pid(mnt)
    files = [p for p in mnt.rglob("*") if p.is_file()]
    assert sum(len(p.read_bytes()) for p in files) > 100_000 and len(files) > 300
    # (the helpers look for requests every HELP_EVERY_S until none has come for HELP_IDLE_S)
    time.sleep(turns.HELP_IDLE_S + 0.2)
    cpu0 = _cpu_s(pid)
    time.sleep(1.0)
    assert _cpu_s(pid) - cpu0 <= 0.03, "the daemon kept using CPU with no requests coming"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the daemon did not end on SIGTERM"
    assert not is_mounted(mnt)
    assert "unmounted" in tfrfs_mount.log_text(mnt)


def test_poll_us_must_be_a_whole_number(sample: Path, tmp_path: Path) -> None:
    proc = run_tfrfs("mount", str(sample), str(tmp_path), "--poll-us", "-5")
    assert proc.returncode == 2 and "--poll-us" in proc.stderr and not is_mounted(tmp_path)


def test_raw_pixels_are_png(sample: Path, tfrfs_mount) -> None:
    from PIL import Image
    mnt = tfrfs_mount(sample)
    png = mnt / "mnist_raw.tfrecord" / "000000" / "image_raw.png"
    img = Image.open(png)
    assert img.size == (28, 28) and img.mode == "L"
    ex = example_pb.Example.FromString(reference.written_records(sample / "mnist_raw.tfrecord")[0])
    assert img.tobytes() == ex.features.feature["image_raw"].bytes_list.value[0]
    no = tfrfs_mount(sample, "--no-decode-raw")
    assert (no / "mnist_raw.tfrecord" / "000000" / "image_raw.bin").read_bytes() == img.tobytes()


def test_metadata_files(sample: Path, tfrfs_mount) -> None:
    mnt = tfrfs_mount(sample)
    schema = json.loads((mnt / ".tfrfs" / "schema.json").read_text())
    enc = schema["features"]["image/encoded"]
    assert enc["kind"] == "bytes_list" and enc["records"] >= 30
    assert (mnt / ".tfrfs" / "errors").read_text() == ""


def test_damaged_shard_served_with_eio(tmp_path: Path, tfrfs_mount) -> None:
    src = tmp_path / "src"
    src.mkdir()
    recs = []
    for i in range(20):
        ex = proto.Example()
        ex.features.feature["i"].int64_list.value.append(i)
        recs.append(ex.SerializeToString())
    frames = [tfrecord.frame(r) for r in recs]
    # Record 18's int value: it still parses, and it lies past the records read to tell the kind,
    # so the mount finds the damage only when the record is read.
    bad = bytearray(b"".join(frames))
    bad[sum(map(len, frames[:18])) + 12 + len(recs[18]) - 1] ^= 0x01
    (src / "d.tfrecord").write_bytes(bytes(bad) + b"\x00\x01")
    mnt = tfrfs_mount(src)
    shard = mnt / "d.tfrecord"
    # Read (and so cached by the kernel) before the damaged record is: it must grow all the same.
    before = [json.loads(x) for x in (mnt / ".tfrfs" / "errors").read_text().splitlines()]
    assert {(x["shard"], x["index"]) for x in before} == {("d.tfrecord", 20)}
    assert sorted(os.listdir(shard)) == [f"{i:06d}" for i in range(20)]
    assert (shard / "000000" / "i.json").read_text() == "[0]\n"
    with pytest.raises(OSError) as e:
        (shard / "000018" / "i.json").read_bytes()
    assert e.value.errno == errno.EIO
    assert (shard / "000019" / "i.json").read_text() == "[19]\n"
    lines = [json.loads(x) for x in (mnt / ".tfrfs" / "errors").read_text().splitlines()]
    assert {(x["shard"], x["index"]) for x in lines} == {("d.tfrecord", 18), ("d.tfrecord", 20)}
    assert all({"shard", "index", "offset", "reason"} <= set(x) for x in lines)
    # The daemon survived all of that.
    assert (shard / "000002" / "i.json").read_text() == "[2]\n"


def test_cli_errors_and_exit_codes(sample: Path, tmp_path: Path, tfrfs_mount) -> None:
    (tmp_path / "mnt").mkdir()
    bad = run_tfrfs("mount", str(tmp_path / "missing"), str(tmp_path / "mnt"))
    assert bad.returncode == 2 and "no such file" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    notshard = tmp_path / "notes.txt"
    notshard.write_text("hello")
    bad = run_tfrfs("mount", str(notshard), str(tmp_path / "mnt"))
    assert bad.returncode == 2 and "not a TFRecord file" in bad.stderr
    bad = run_tfrfs("mount", str(sample), str(tmp_path / "nowhere"))
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    assert not is_mounted(tmp_path / "mnt")
    assert run_tfrfs("umount", str(tmp_path / "mnt")).returncode == 2
    assert run_tfrfs("bogus").returncode == 2
    for cmd in ("mount", "umount", "verify", "inspect"):
        h = run_tfrfs(cmd, "--help")
        assert h.returncode == 0 and "usage:" in h.stdout
    insp = run_tfrfs("inspect", str(sample), "--cache-dir", str(tmp_path / "c"))
    assert insp.returncode == 0 and "train/train-00000-of-00002.tfrecord" in insp.stdout
    assert "image/encoded" in insp.stdout
    ok = run_tfrfs("verify", str(sample))
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_umount_and_remount_uses_cache(sample: Path, tfrfs_mount) -> None:
    """The second mount of a dataset loads each shard's index (and a GZIP shard's decompressed
    stream) from the cache: no shard is scanned again, so no cache file is written anew."""
    mnt = tfrfs_mount(sample)
    assert run_tfrfs("umount", str(mnt)).returncode == 0
    assert not is_mounted(mnt)

    def cached() -> dict[str, tuple[int, int]]:
        # An index is saved by writing a new file and renaming it over the old: a new inode.
        return {str(p.relative_to(tfrfs_mount.cache)): (os.stat(p).st_ino, os.stat(p).st_mtime_ns)
                for p in sorted(tfrfs_mount.cache.rglob("*")) if p.is_file() and p.parent.name in ("index", "streams")}

    before = cached()
    shards = [p for p in sample.rglob("*") if p.is_file() and p.suffix not in (".json", ".pbtxt")]
    assert sum(1 for k in before if k.startswith("index/")) == len(shards) == 7
    assert sum(1 for k in before if k.startswith("streams/")) == 1     # tabular.tfrecord.gz
    mnt2 = tfrfs_mount(sample, mountpoint=mnt)
    assert sorted(os.listdir(mnt2 / "val" / "val-00000-of-00001.tfrecord"))[:1] == ["000000"]
    assert (mnt2 / "tabular.tfrecord.gz" / "000000").is_dir()
    assert cached() == before, "the second mount indexed the shards again"
