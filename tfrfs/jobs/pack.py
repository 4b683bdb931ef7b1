"""``tfrfs pack FOLDER DEST`` (SPEC 10): folders of records, or of images, into a new dataset.

The plan is made here, on the driver, from names alone: which folders are shards and which are
records (``records`` layout), or which files are images of which class (``imagefolder``), in
what order, into which new shards. Each new shard is a job (``pack_job``): its records made from
their files (``edit.packing``, by the rules a ``--rw`` mount stages files by) and written with
their index file (``shardwrite.write_records``); DEST is published as ``tfrfs reshard`` publishes
one, whole or not at all (``publish``). A record that cannot be packed is reported with every
file's reason, and then nothing is published.

Order: shard folders, record folders and images in natural name order (``rec2`` before
``rec10``; a mount's zero-padded names sort as numbers either way); classes in name order,
numbered from 0.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterator

from tfrfs.edit import packing
from tfrfs.errors import UsageError
from tfrfs.format import names, proto
from tfrfs.index.discovery import named_like_shard
from tfrfs.jobs.publish import Dest
from tfrfs.jobs.reshardplan import cut_by_count
from tfrfs.jobs.shardwrite import write_records

COUNT_XATTR = "user.tfrfs.count"      # a shard folder, copied with cp -a
RECORDS_XATTR = "user.tfrfs.records"  # its records' kind
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff")
LAYOUTS = ("records", "imagefolder")


@dataclass(frozen=True)
class PackShard:
    """One new shard: its name in DEST, its records' kind, and the folders (records layout) or
    image files (``(path, label, class name)``, imagefolder) its records come from, in order."""

    name: str
    kind: str
    records: tuple[str, ...] = ()
    images: tuple[tuple[str, int, str], ...] = ()


def natural(name: str) -> tuple:
    """``rec2`` before ``rec10``: runs of digits compared as numbers."""
    return tuple((0, int(p), p) if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name) if p)


def _subfolders(folder: str) -> list[str]:
    try:
        entries = sorted(os.listdir(folder), key=natural)
    except OSError as exc:
        raise UsageError(f"{folder}: cannot be read: {exc.strerror}") from None
    return [e for e in entries if not names.is_scratch(e) and os.path.isdir(os.path.join(folder, e))]


def _has_xattr(path: str, name: str) -> bool:
    return packing.read_xattr(path, name) is not None


def _holds_files(folder: str) -> bool:
    try:
        return any(not names.is_scratch(e) and os.path.isfile(os.path.join(folder, e)) for e in os.listdir(folder))
    except OSError:
        return False


def shard_folders(folder: str) -> list[tuple[str, str]]:
    """(shard name, folder) of each shard of a records-layout FOLDER: ``FOLDER/SHARD/RECORD/...``,
    or ``FOLDER/RECORD/...`` for one shard. FOLDER is one shard when it was a mount's shard folder
    (``cp -a`` kept its ``user.tfrfs.count``) or a folder inside it holds feature files; else each
    folder in it is a shard."""
    subs = _subfolders(folder)
    base = os.path.basename(os.path.abspath(folder))
    one = _has_xattr(folder, COUNT_XATTR) or (
        not any(_has_xattr(os.path.join(folder, s), COUNT_XATTR) for s in subs)
        and any(_holds_files(os.path.join(folder, s)) for s in subs))
    pairs = [(base, folder)] if one else [(s, os.path.join(folder, s)) for s in subs]
    return [(n if named_like_shard(n) else n + ".tfrecord", f) for n, f in pairs]


def plan_records(folder: str, kind: str | None, shards: int | None, shard_size: int | None = None) -> list[PackShard]:
    """The new shards of a records-layout FOLDER: one per shard folder (its name kept), or, over
    all of them in order, ``shards`` of equal record counts or shards of about ``shard_size``
    bytes of files each (``NAME-NNNNN-of-MMMMM.tfrecord``)."""
    found = shard_folders(folder)
    if not found:
        raise UsageError(f"{folder}: no record folders in it (FOLDER/SHARD/RECORD/... or FOLDER/RECORD/...)")
    per: list[tuple[str, str, list[str]]] = []
    for name, sf in found:
        k = kind or packing.read_xattr(sf, RECORDS_XATTR) or "example"
        if k not in ("example", "sequence"):
            raise UsageError(f"{sf}: records of kind {k!r} cannot be packed from files (example or sequence)")
        per.append((name, k, [os.path.join(sf, r) for r in _subfolders(sf)]))
    if shards is None and shard_size is None:
        return [PackShard(name, k, tuple(recs)) for name, k, recs in per]
    kinds = {k for _, k, _ in per}
    if len(kinds) > 1:
        raise UsageError(f"{folder}: its shards hold both Examples and SequenceExamples; --shards puts "
                         "records of one kind together (pack them one shard folder at a time)")
    one_kind = next(iter(kinds))
    every = [r for _, _, recs in per for r in recs]
    prefix = os.path.basename(os.path.abspath(folder))
    prefix = prefix[:-len(".tfrecord")] if prefix.endswith(".tfrecord") else prefix
    cuts = cut_by_count(len(every), shards) if shards is not None else \
        _cuts_by_size([_folder_bytes(r) for r in every], shard_size or 1)
    return [PackShard(f"{prefix}-{i:05d}-of-{len(cuts):05d}.tfrecord", one_kind, tuple(every[a:b]))
            for i, (a, b) in enumerate(cuts)]


def plan_imagefolder(folder: str, shards: int | None, shard_size: int | None = None) -> list[PackShard]:
    """The new shards of an image folder: ``FOLDER/CLASS/FILE.jpg`` ..., classes numbered in name
    order; one shard (``NAME.tfrecord``), ``shards``, or shards of about ``shard_size`` bytes."""
    classes = _subfolders(folder)
    if not classes:
        raise UsageError(f"{folder}: no class folders in it (FOLDER/CLASS/IMAGE.jpg)")
    images: list[tuple[str, int, str]] = []
    for label, cls in enumerate(classes):
        cf = os.path.join(folder, cls)
        for name in sorted(os.listdir(cf), key=natural):
            if not names.is_scratch(name) and os.path.isfile(os.path.join(cf, name)):
                images.append((os.path.join(cf, name), label, cls))
    prefix = os.path.basename(os.path.abspath(folder))
    cuts = _cuts_by_size([_file_bytes(p) for p, _, _ in images], shard_size) if shard_size is not None \
        else cut_by_count(len(images), shards or 1)
    one = len(cuts) == 1 and shards is None
    return [PackShard(f"{prefix}.tfrecord" if one else f"{prefix}-{i:05d}-of-{len(cuts):05d}.tfrecord",
                      "example", (), tuple(images[a:b])) for i, (a, b) in enumerate(cuts)]


def _file_bytes(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0   # (reported when it is packed)


def _folder_bytes(folder: str) -> int:
    """The bytes of a record folder's files: about what its record holds."""
    return sum(_file_bytes(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def _cuts_by_size(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive ranges of items whose sizes add up to at most ``limit`` (an item larger than
    it alone); at least one range."""
    out: list[tuple[int, int]] = []
    start = used = 0
    for i, n in enumerate(sizes):
        if used and used + n > limit:
            out.append((start, i))
            start, used = i, 0
        used += n
    out.append((start, len(sizes)))
    return out


def named_for(name: str, compression: str) -> str:
    """A new shard's name for its compression: a ``.gz``/``.gzip``/``.zlib`` ending of the shard
    folder it comes from dropped, and ``.gz`` (GZIP) or ``.zlib`` (ZLIB) added, so the name never
    says another compression than the file's."""
    lower = name.lower()
    for end in (".gz", ".gzip", ".zlib"):
        if lower.endswith(end):
            name = name[:-len(end)]
            break
    return name + {"GZIP": ".gz", "ZLIB": ".zlib"}.get(compression, "")


def image_record(path: str, label: int, label_name: str) -> bytes:
    """An image folder's file as its Example: ``image`` (the file's bytes), ``label``,
    ``label_name`` and ``filename``. Raises packing.Problems for a file that is not an image."""
    if os.path.splitext(path)[1].lower() not in IMAGE_SUFFIXES:
        raise packing.Problems([f"{path}: not an image (an image folder holds {' '.join(IMAGE_SUFFIXES)} files)"])
    with open(path, "rb") as f:
        data = f.read()
    ex = proto.Example()
    feats = ex.features.feature
    feats["image"].bytes_list.value.append(data)
    feats["label"].int64_list.value.append(label)
    feats["label_name"].bytes_list.value.append(label_name.encode("utf-8", "surrogateescape"))
    feats["filename"].bytes_list.value.append(os.path.basename(path).encode("utf-8", "surrogateescape"))
    return ex.SerializeToString()


def pack_job(dest: Dest, shard: PackShard, compression: str, hints: packing.Hints) -> dict:
    """Write one new shard: its figures (``ShardWriter.finish``), with ``problems``, every file of
    its records that cannot be packed (then its file is of no use: the driver publishes nothing)."""
    problems: list[str] = []

    def records() -> Iterator[bytes]:
        for folder in shard.records:
            try:
                yield packing.record_bytes(folder, shard.kind, hints)
            except packing.Problems as exc:
                problems.extend(exc.problems)
            except OSError as exc:
                problems.append(f"{folder}: {exc.strerror or exc}")
        for path, label, cls in shard.images:
            try:
                yield image_record(path, label, cls)
            except packing.Problems as exc:
                problems.extend(exc.problems)
            except OSError as exc:
                problems.append(f"{path}: {exc.strerror or exc}")
    body = write_records(dest, shard.name, compression, records(), shard.kind)
    out = dict(body) if body is not None else {"name": shard.name, "count": 0}
    out["problems_found"] = problems
    return out
