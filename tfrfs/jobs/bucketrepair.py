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

from tfrfs.storage import durable
from tfrfs.errors import DataLoss
from tfrfs.index.shard_index import DAMAGED_DIR, TMP_PREFIX
from tfrfs.storage.places import Place

if TYPE_CHECKING:
    from tfrfs.jobs.runner import Where
    from tfrfs.storage.fsspec_store import Store
    from tfrfs.jobs.repair import Repaired
    from tfrfs.dataset.sources import Source

CHUNK = 1 << 20        # bytes read at a time when checking or comparing objects
REPAIR_TMP = TMP_PREFIX + "repair-"


def place_of(source: "Source") -> Place:
    """The bucket prefix of a remote source, with what its listing said about every object."""
    from tfrfs.storage.remote_reader import RemoteReaders
    from tfrfs.dataset.sources import RemoteFiles
    assert source.store is not None
    files = source.discovery.files
    listed = list(files.objects.values()) if isinstance(files, RemoteFiles) else []
    readers = source.readers if isinstance(source.readers, RemoteReaders) else None
    from tfrfs.storage.fsspec_storage import FsspecStorage
    return Place(FsspecStorage.around(source.store), source.discovery.root, listed,
                 complete=source.discovery.mirrors_dir, readers=readers)


# --- the shard job ------------------------------------------------------------------------------

def write_repaired(where: "Where", result: "Repaired", tmp: str,
                   copy_sound: Callable[["Where", "Repaired", BinaryIO | None], None]) -> None:
    """Step 1: the repaired shard as the object ``tmp``, checked; ``result.written`` names it."""
    from tfrfs.edit.repack import check_new_shard
    store: Store = where.readers().store
    shard = result.shard
    with tempfile.NamedTemporaryFile(prefix=REPAIR_TMP) as out:
        copy_sound(where, result, out)   # type: ignore[arg-type]
        out.flush()
        check_new_shard(out.name, shard.compression, result.kept, range(result.kept))
        result.written_size = os.fstat(out.fileno()).st_size
        upload_checked(store, out.name, tmp)
    result.written = tmp


def upload_checked(store: "Store", local: str, url: str) -> None:
    """Upload ``local`` as ``url`` and read it back: the object must hold exactly its bytes (size
    and CRC-32C), else it is deleted and DataLoss raised."""
    size, want = _crc_of(open(local, "rb"))
    durable.fault_point("write", url)
    store.put_file(url, local)
    with store.open_stream(url) as f:
        got_size, got = _crc_of(f)
    if (got_size, got) != (size, want):
        store.delete(url)
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
    from tfrfs.storage.fsspec_storage import FsspecStorage
    assert isinstance(place.storage, FsspecStorage)
    store = place.storage.store
    shard = result.shard
    tmp = result.written
    assert tmp is not None
    now = _info(store, shard.path)
    if now is None or (int(now.get("size") or 0), _identity(store, shard.path, now)) != (shard.size, shard.identity):
        raise DataLoss(f"{shard.path}: changed since it was checked: left as it is (run tfrfs repair again)")
    if backup:
        result.backup = keep_original(store, shard.path, now)
    durable.fault_point("rename", shard.path)
    place.changed(shard.path)
    store.copy(tmp, shard.path)
    got = _info(store, shard.path)
    if got is None or int(got.get("size") or 0) != result.written_size:
        raise DataLoss(f"{shard.path}: the copy over it did not take ({got and got.get('size')} bytes, "
                       f"expected {result.written_size}): the repaired shard is at {tmp}")
    durable.fault_point("unlink", tmp)
    store.delete(tmp)


def keep_original(store: "Store", url: str, info: dict[str, Any]) -> str:
    """Step 3: the object ``url`` (whose look-up is ``info``) copied to ``.tfrfs-damaged/NAME``
    beside it (``NAME~2``... when that holds something else). Returns where it went."""
    folder, name = posixpath.split(url)
    dest, n = posixpath.join(folder, DAMAGED_DIR, name), 2
    while (there := _info(store, dest)) is not None:
        if _same_object(store, url, info, dest, there):
            return dest    # kept by a repair that stopped before it replaced the shard
        dest, n = posixpath.join(folder, DAMAGED_DIR, f"{name}~{n}"), n + 1
    durable.fault_point("write", dest)
    store.copy(url, dest)
    return dest


def _same_object(store: "Store", a: str, a_info: dict[str, Any], b: str, b_info: dict[str, Any]) -> bool:
    """Whether two objects hold the same bytes: by the store's content hash where both have one
    (S3's ETag, GCS's MD5 and CRC-32C), else by reading both."""
    if int(a_info.get("size") or 0) != int(b_info.get("size") or 0):
        return False
    for key in ("md5Hash", "crc32c", "ETag"):
        x, y = a_info.get(key), b_info.get(key)
        if x and y and x == y:
            return True
    with store.open_stream(a) as fa, store.open_stream(b) as fb:
        while True:
            x, y = fa.read(CHUNK), fb.read(CHUNK)
            if x != y:
                return False
            if not x:
                return True


def _info(store: "Store", url: str) -> dict[str, Any] | None:
    try:
        info = store.info(url, fresh=True)
    except FileNotFoundError:
        return None
    return None if info.get("type") == "directory" else info


def _identity(store: "Store", url: str, info: dict[str, Any]) -> str:
    from tfrfs.storage.fsspec_store import object_info
    return object_info(store, {**info, "name": info.get("name", store.path_of(url))}).identity


def clear_leftovers(source: "Source", place: Place) -> None:
    """Temporary objects of a repair that stopped before it replaced its shard: never needed
    again (a rerun writes them anew)."""
    from tfrfs.dataset.sources import RemoteFiles
    files = source.discovery.files
    if not isinstance(files, RemoteFiles):
        return
    for rel, obj in files.objects.items():
        if posixpath.basename(rel).startswith(REPAIR_TMP):
            drop_quietly(place, obj.url)


def drop_quietly(place: Place, url: str) -> None:
    """Delete a temporary object if it is there; a failure leaves it for the next run."""
    try:
        place.unlink(url)
    except OSError:
        pass
