"""``tfrfs repair`` of shards in a bucket (SPEC 6, 1.1): objects are replaced whole.

A bucket has no rename, but it replaces an object whole: a reader of ``NAME`` sees the old
object or the new one, never a mix (an upload in parts becomes visible only once complete; a
server-side copy is one step). So a damaged shard ``NAME`` is repaired in these steps:

1. a shard job writes its sound records (``repair._copy_sound``, the writer of a local repair)
   into a temporary local file, a record at a time, and checks it as a local repair checks its
   new file (framing, count, checksums); uploads it as ``.tfrfs-commit-repair-NAME`` beside the
   shard; and reads the object back to check its size and CRC-32C against the checked file;
2. here, the shard is looked up: if it changed since it was checked, it is left as it is;
3. the original is kept as ``.tfrfs-damaged/NAME`` by a server-side copy (unless
   ``--no-backup``; an identical copy already there, from a run that stopped, is used);
4. the temporary object is copied over ``NAME`` (server-side) and the result's size checked;
5. the temporary object is deleted.

A crash at any point leaves ``NAME`` the damaged original or the repaired shard, whole. Running
repair again finishes: a shard still damaged is rewritten (its temporary object, if any, is
written anew or deleted first), a sound one is left as it is, and the index files and manifest
follow what is there (``repair._follow_manifest``).
"""

from __future__ import annotations

import os
import posixpath
import tempfile
from typing import TYPE_CHECKING, Any, BinaryIO, Callable

import crc32c

from tfrfs.errors import DataLoss
from tfrfs.index.discovery import DAMAGED_DIR, TMP_PREFIX
from tfrfs.storage.base import Stat, Storage
from tfrfs.storage.places import Place

if TYPE_CHECKING:
    from tfrfs.index.where import Where
    from tfrfs.jobs.repair import Repaired
    from tfrfs.index.opened import OpenedSource

CHUNK = 1 << 20        # bytes read at a time when checking or comparing objects
REPAIR_TMP = TMP_PREFIX + "repair-"


def place_of(source: "OpenedSource") -> Place:
    """The prefix of a source in a bucket, with what its listing said about every object."""
    from tfrfs.storage.remote_reader import RemoteReaders
    readers = source.readers if isinstance(source.readers, RemoteReaders) else None
    return Place(source.storage, source.discovery.root, source.discovery.access.listed(),
                 complete=source.discovery.mirrors_dir, readers=readers)


# --- the shard job ------------------------------------------------------------------------------

def write_repaired(where: "Where", result: "Repaired", tmp: str,
                   copy_sound: Callable[["Where", "Repaired", BinaryIO | None], None]) -> None:
    """Step 1: the repaired shard as the object ``tmp``, checked; ``result.written`` names it."""
    from tfrfs.edit.repack import check_new_shard
    shard = result.shard
    with tempfile.NamedTemporaryFile(prefix=REPAIR_TMP) as out:
        copy_sound(where, result, out)   # type: ignore[arg-type]
        out.flush()
        check_new_shard(out.name, shard.compression, result.kept, range(result.kept))
        result.written_size = os.fstat(out.fileno()).st_size
        upload_checked(where.storage(), out.name, tmp)
    result.written = tmp


def upload_checked(storage: Storage, local: str, url: str) -> None:
    """Upload ``local`` as ``url`` and read it back: the object must hold exactly its bytes (size
    and CRC-32C), else it is deleted and DataLoss raised."""
    size, want = _crc_of(open(local, "rb"))
    storage.upload(local, url)
    with storage.open_read(url) as f:
        got_size, got = _crc_of(f)
    if (got_size, got) != (size, want):
        storage.delete(url)
        raise DataLoss(f"{url}: the uploaded copy does not read back ({got_size} bytes, CRC-32C {got:08x}; "
                       f"written {size} bytes, CRC-32C {want:08x})")


def _crc_of(f: Any) -> tuple[int, int]:
    with f:
        size, crc = 0, 0
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return size, crc
            size += len(chunk)
            crc = crc32c.crc32c(chunk, crc)


# --- here, in shard order -----------------------------------------------------------------------

def put_in_place(place: Place, result: "Repaired", *, backup: bool) -> None:
    """Steps 2 to 5 for one shard whose repaired copy (``result.written``) is checked."""
    storage = place.storage
    shard = result.shard
    tmp = result.written
    assert tmp is not None
    now = _stat(storage, shard.path)
    if now is None or (now.size, now.identity) != (shard.size, shard.identity):
        raise DataLoss(f"{shard.path}: changed since it was checked: left as it is (run tfrfs repair again)")
    if backup:
        result.backup = keep_original(storage, shard.path, now)
    place.changed(shard.path)
    storage.rename(tmp, shard.path)   # a copy over it, checked, then the temporary object deleted


def keep_original(storage: Storage, url: str, seen: Stat) -> str:
    """Step 3: the object ``url`` (as ``seen``) copied to ``.tfrfs-damaged/NAME`` beside it
    (``NAME~2``... when that holds something else). Returns where it went."""
    folder, name = storage.split(url)
    dest, n = storage.join(folder, DAMAGED_DIR, name), 2
    while (there := _stat(storage, dest)) is not None:
        if _same_object(storage, url, seen, dest, there):
            return dest    # kept by a repair that stopped before it replaced the shard
        dest, n = storage.join(folder, DAMAGED_DIR, f"{name}~{n}"), n + 1
    storage.copy(url, dest)
    return dest


def _same_object(storage: Storage, a: str, a_seen: Stat, b: str, b_seen: Stat) -> bool:
    """Whether two objects hold the same bytes: by their content hash where the identity is one
    (S3's ETag, which a copy keeps), else by reading both."""
    if a_seen.size != b_seen.size:
        return False
    if a_seen.identity.startswith("etag:") and a_seen.identity == b_seen.identity:
        return True
    with storage.open_read(a) as fa, storage.open_read(b) as fb:
        while True:
            x, y = fa.read(CHUNK), fb.read(CHUNK)
            if x != y:
                return False
            if not x:
                return True


def _stat(storage: Storage, url: str) -> Stat | None:
    got = storage.stat(url)
    return None if got is None or got.is_dir else got


def clear_leftovers(source: "OpenedSource", place: Place) -> None:
    """Temporary objects of a repair that stopped before it replaced its shard: never needed
    again (a rerun writes them anew)."""
    for obj in source.discovery.access.listed():
        if posixpath.basename(obj.url).startswith(REPAIR_TMP):
            drop_quietly(place, obj.url)


def drop_quietly(place: Place, url: str) -> None:
    """Delete a temporary object if it is there; a failure leaves it for the next run."""
    try:
        place.unlink(url)
    except OSError:
        pass
