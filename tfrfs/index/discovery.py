"""What shards a SOURCE has (SPEC 1): a local folder, file or glob walked and each file judged by
its first bytes (a shard, plain or compressed, or a plain file), the index files shipped beside
each shard, and what tfrfs itself keeps beside them and never shows. The offsets within each
shard are ``shard_index``'s."""

from __future__ import annotations

import glob as _glob
import logging
import os
import re
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterable

from tfrfs.index import idxfile
from tfrfs.format import salvage
from tfrfs.format import tfrecord
from tfrfs.errors import UsageError
from tfrfs.storage.local_storage import local_identity

if TYPE_CHECKING:
    from tfrfs.storage.base import ObjectInfo

log = logging.getLogger("tfrfs")

STAGING_DIR = ".tfrfs-staging"
SNIFF_BYTES = 4096
DAMAGED_DIR = ".tfrfs-damaged"        # repair's copies of damaged shards (SPEC 6), never shown
TMP_PREFIX = ".tfrfs-commit-"         # files being written beside the shards (commit, repair), never shown
OBJECTS_DIR = ".tfrfs-objects"       # a bucket commit's new shard objects, named by the manifest (SPEC 7.1)
HIDDEN_DIRS = (STAGING_DIR, DAMAGED_DIR, OBJECTS_DIR)
# A "being written" object in a reshard's DEST that has no folders to rename (a bucket prefix):
# there until the new dataset's manifest is, so a prefix with it and no manifest is unfinished.
RESHARD_MARKER = TMP_PREFIX + "reshard"
# SPEC 1, "named like a shard": after a final .gz/.gzip/.zlib, a TFRecord suffix (maybe followed
# by - and digits, as TFDS names its shards), or -NNNNN-of-NNNNN.
_SHARD_NAME = re.compile(r"(?:\.(?:tfrecords?|tfrec|records?)(?:-\d+(?:-of-\d+)?)?|-\d+-of-\d+)"
                         r"(?:\.gz|\.gzip|\.zlib)?\Z", re.ASCII)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


INDEX_SUFFIXES = (".tfrfs-idx", ".idx", ".tfindex", ".index")   # index files are never shards (SPEC 1)


def named_like_shard(name: str) -> bool:
    """SPEC 1: whether a file is called like a shard (then it is one even when damaged)."""
    if name.endswith(INDEX_SUFFIXES):
        return False
    return _SHARD_NAME.search(name) is not None


@dataclass(frozen=True)
class ShardFile:
    """A file found to be a shard: where it is and how it is compressed."""

    path: str          # absolute path of the shard file
    relpath: str       # path relative to SOURCE (what users and errors see)
    compression: str
    size: int
    mtime_ns: int
    identity: str = ""                 # what an index of it is validated against (with the size)
    shipped: tuple[str, ...] = ()      # index files found beside it (paths or URLs), best first


class SourceFiles:
    """The files of a local SOURCE other than the shards' records: plain files, folders' times,
    index files beside shards. A source in a store has its own (``storage_discovery.StorageFiles``,
    a subclass over its ``Storage``, answered from the listing it keeps). A local one stays on
    plain os calls: a file is looked at when asked (no listing held for a folder of any size),
    read in place, and written durably with the user's umask."""

    def __init__(self, root: str) -> None:
        self.root = root

    def dir_mtime_ns(self, rel: str) -> int:
        try:
            return os.stat(os.path.join(self.root, rel)).st_mtime_ns
        except OSError:
            return 0

    def plain_stat(self, rel: str) -> tuple[int, int]:
        """(size, mtime_ns) of a plain file."""
        st = os.stat(os.path.join(self.root, rel))
        return st.st_size, st.st_mtime_ns

    def plain_path(self, rel: str) -> str:
        """A local file with the plain file's bytes."""
        return os.path.join(self.root, rel)

    def local_path(self, path: str) -> str | None:
        """The local file that holds ``path`` (a file of the source), to read in place; None
        when it is an object in a store."""
        return path

    def listed(self) -> list["ObjectInfo"]:
        """What a listing of the source said about its files, to be trusted until they are
        written (a local folder's are looked at when needed: none)."""
        return []

    def done_indexing(self) -> None:
        """Indexing is over: let go of what was kept for it."""

    def written_mtime_ns(self, rel: str) -> int:
        """The time of a file just written beside the shards (an index file). Raises OSError
        when it is not there."""
        return os.stat(os.path.join(self.root, rel)).st_mtime_ns

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def read_head(self, path: str, size: int) -> bytes:
        """The first ``size`` bytes of a file (fewer when it is shorter)."""
        with open(path, "rb") as f:
            return f.read(size)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file atomically (temporary file, fsync, rename), readable as any file
        the user makes (0666 less the umask): index files and the manifest are for everyone who
        reads the dataset."""
        from tfrfs.storage import durable
        durable.write_file(path, data, mode=0o666 & ~_umask())

    def open_stream(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def statfs_folder(self) -> str:
        """A local folder whose file system's figures ``statfs`` reports."""
        return self.root


@dataclass(frozen=True)
class Discovery:
    """What a SOURCE holds: shards, plain files and folders, all relative to ``root``."""

    root: str                      # folder the relative paths start from
    shards: tuple[ShardFile, ...]
    plain_files: tuple[str, ...]   # relative paths of non-shard regular files
    dirs: tuple[str, ...]          # relative paths of mirrored sub-folders ("" is the root)
    mirrors_dir: bool              # SOURCE is a folder (new shards may be made in it)
    files: SourceFiles | None = None   # None: the local files under ``root``

    @property
    def access(self) -> SourceFiles:
        return self.files if self.files is not None else SourceFiles(self.root)


def sniff_file(path: str, *, named_as_source: bool = False) -> str | None:
    """The compression of the shard at ``path``, or None when it is not a shard."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    return judge_head(head, os.path.basename(path), named_as_source=named_as_source,
                      stream=lambda: open(path, "rb"))


def judge_head(head: bytes, name: str, *, named_as_source: bool,
               stream: Callable[[], BinaryIO]) -> str | None:
    """SPEC 1: the compression of the file that starts with ``head`` (its first ``SNIFF_BYTES``)
    and is called ``name``, or None when it is not a shard; ``stream`` opens the whole file, for
    the rare compressed file whose first bytes inflate to nothing."""
    named = named_as_source or named_like_shard(name)
    if not head:
        return tfrecord.NONE if named else None
    comp = tfrecord.sniff(head)
    if comp is None:
        # SPEC 1: a file named like a shard whose first header fails is a damaged shard.
        return damaged_compression(head, name) if named_like_shard(name) else None
    if comp in (tfrecord.GZIP, tfrecord.ZLIB) and not named and not tfrecord.inflates_to_a_record(head, comp):
        # A compressed stream of zero records is an empty shard: judge it by name like an empty
        # file. Only when its first bytes inflate to nothing is the rest read to tell.
        if _decompresses_empty(stream, comp):
            return None
    return comp


def damaged_compression(head: bytes, name: str) -> str:
    """How a damaged shard (its first header fails, plain and inflated) is compressed: as its name
    says (``.gz``/``.gzip``, ``.zlib``), else GZIP (the gzip magic first) or ZLIB when its first
    bytes (``head``) start such a stream: inflating them gives at least one byte, or fails on
    none of them (a stream cut short). Else NONE. (A plain shard may start with two bytes that make a zlib header: 78 01
    is a 376-byte first record. zlib refuses the zero bytes of its length at once.)"""
    import io
    import zlib
    lower = name.lower()
    if lower.endswith((".gz", ".gzip")):
        return tfrecord.GZIP
    if lower.endswith(".zlib"):
        return tfrecord.ZLIB
    for comp, wbits in ((tfrecord.GZIP, 16 + zlib.MAX_WBITS), (tfrecord.ZLIB, zlib.MAX_WBITS)):
        if comp == tfrecord.GZIP and head[:2] != b"\x1f\x8b":
            continue
        try:
            zlib.decompressobj(wbits).decompress(head)
            return comp
        except zlib.error:
            out = io.BytesIO()
            salvage.inflate(io.BytesIO(head), out, comp)
            if out.tell():
                return comp
    return tfrecord.NONE


def _decompresses_empty(stream: Callable[[], BinaryIO], comp: str) -> bool:
    """Whether a GZIP/ZLIB file inflates to nothing; stops at the first byte it yields."""
    import zlib
    wbits = 16 + zlib.MAX_WBITS if comp == tfrecord.GZIP else zlib.MAX_WBITS
    d = zlib.decompressobj(wbits)
    with stream() as f:
        while block := f.read(1 << 16):
            try:
                if d.decompress(block, 1):
                    return False
            except zlib.error:
                return False   # damaged: it is judged (and reported) when indexed
            if d.eof:
                break
    return True


def _shard_file(path: str, relpath: str, comp: str, beside: Iterable[str] | None = None) -> ShardFile:
    """A local shard; ``beside``: the names of the files in its folder (listed when None)."""
    st = os.stat(path)
    folder, name = os.path.split(os.path.abspath(path))
    if beside is None:
        try:
            beside = os.listdir(folder)
        except OSError:
            beside = ()
    return ShardFile(path=os.path.abspath(path), relpath=relpath, compression=comp, size=st.st_size,
                     mtime_ns=st.st_mtime_ns, identity=local_identity(st),
                     shipped=tuple(os.path.join(folder, n) for n in shipped_names(name, set(beside))))


def shipped_names(shard_name: str, present: set[str]) -> list[str]:
    """Index files for ``shard_name`` among the names ``present`` beside it, best first: tfrfs's
    own, then the common loaders' text indexes."""
    from tfrfs.index import loader_files as loaderidx
    wanted = [shard_name + idxfile.SUFFIX, *loaderidx.candidate_names(shard_name)]
    return [n for n in wanted if n in present]


def discover(source: str, *, empty_ok: bool = False) -> Discovery:
    """Find the shards of SOURCE (a shard file, a folder, or a glob). Raises UsageError, also for a
    folder without shards unless ``empty_ok`` (a --rw mount, where a dataset can be made)."""
    try:
        os.stat(source)
    except PermissionError as exc:   # a folder above it is closed: never "no such file"
        raise UsageError(f"{source}: {exc.strerror} (a folder above it cannot be entered)") from None
    except OSError:
        pass   # missing, or a glob
    if os.path.isdir(source):
        return _discover_dir(source, empty_ok)
    if os.path.exists(source):
        return _discover_files([source], named=True)
    if any(ch in source for ch in "*?["):
        matches = sorted(p for p in _glob.glob(source, recursive=True) if os.path.isfile(p))
        if not matches:
            raise UsageError(f"no file matches {source!r}")
        return _discover_files(matches, named=False)
    raise UsageError(f"{source}: no such file or directory")


def _discover_files(paths: list[str], *, named: bool) -> Discovery:
    shards = []
    seen: set[str] = set()
    for p in paths:
        if not os.path.isfile(p):
            raise UsageError(f"{p}: not a regular file")
        try:
            comp = sniff_file(p, named_as_source=named)
        except OSError as exc:
            raise UsageError(f"{p}: cannot read: {exc.strerror}") from exc
        if comp is None and named and _holds_a_sound_record(p):
            comp = tfrecord.NONE    # a damaged shard given by name (SPEC 1)
        if comp is None:
            if named:
                raise UsageError(f"{p}: not a TFRecord file (no record in it has valid checksums, "
                                 "plain or after GZIP/ZLIB decompression)")
            continue
        name = os.path.basename(p)
        base, n = name, 2
        while name in seen:  # two globbed files of one name from different folders
            name = f"{base}~{n}"
            n += 1
        seen.add(name)
        shards.append(_shard_file(p, name, comp))
    if not shards:
        raise UsageError(f"no TFRecord shard among {len(paths)} matching files")
    root = os.path.dirname(os.path.abspath(paths[0]))
    return Discovery(root=root, shards=tuple(shards), plain_files=(), dirs=("",), mirrors_dir=False)


def _holds_a_sound_record(path: str) -> bool:
    from tfrfs.format import salvage
    with open(path, "rb") as f:
        fd = f.fileno()
        return salvage.find_sound(lambda n, off: os.pread(fd, n, off), os.fstat(fd).st_size, 0) is not None


def _discover_dir(source: str, empty_ok: bool = False) -> Discovery:
    root = os.path.abspath(source)
    shards: list[ShardFile] = []
    plain: list[str] = []
    dirs: list[str] = [""]
    if not os.access(root, os.R_OK | os.X_OK):
        raise UsageError(f"{source}: permission denied")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in HIDDEN_DIRS)
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        for d in dirnames:
            dirs.append(os.path.join(rel_dir, d))
        for name in sorted(filenames):
            if name.startswith(TMP_PREFIX):
                continue   # a commit's temporary file (see repack)
            full = os.path.join(dirpath, name)
            rel = os.path.join(rel_dir, name)
            try:
                if not stat.S_ISREG(os.stat(full).st_mode):
                    continue
                comp = None if name.endswith(INDEX_SUFFIXES) else sniff_file(full)
            except OSError:
                continue  # unreadable files are left out of the mirror
            if comp is None:
                plain.append(rel)
            else:
                shards.append(_shard_file(full, rel, comp, filenames))
    if not shards and not empty_ok:
        raise UsageError(f"{source}: no TFRecord shard in this folder")
    return Discovery(root=root, shards=tuple(shards), plain_files=tuple(plain), dirs=tuple(dirs),
                     mirrors_dir=True)
