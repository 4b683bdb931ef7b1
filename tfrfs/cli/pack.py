"""``tfrfs pack FOLDER DEST`` (SPEC 10): the command; the work is ``jobs.pack``'s."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from dataclasses import replace
from typing import Any

from tfrfs.cli.common import EXIT_OK, EXIT_USAGE, Progress, add_run_options, runner_of
from tfrfs.errors import UsageError

COMPRESSIONS = {"none": "NONE", "gzip": "GZIP", "zlib": "ZLIB"}


def add_pack(sub: Any) -> None:
    """The ``pack`` subcommand's grammar."""
    p = sub.add_parser(
        "pack", help="write shards in DEST from folders of record folders, or of images",
        description="The inverse of the mount: record folders laid out as a mount shows records (as cp -a "
                    "copies them out of one, or made by hand: image.jpg, label.json, caption.txt) become the "
                    "records of new shards in DEST, by the rules a --rw mount takes files by. FOLDER holds "
                    "shard folders of record folders (FOLDER/SHARD/RECORD/...; each shard folder one new shard, "
                    "its name kept), or record folders (FOLDER/RECORD/...: one shard). --layout imagefolder "
                    "takes FOLDER/CLASS/IMAGE.jpg instead: each image an Example of image (its bytes), label "
                    "(classes numbered from 0 in name order), label_name and filename. Each new shard gets its "
                    "index file, DEST the dataset's manifest; DEST appears complete or not at all. Every file "
                    "that cannot be packed is named with the reason, and then nothing is written (exit 2).")
    p.add_argument("folder", metavar="FOLDER")
    p.add_argument("dest", metavar="DEST", help="a folder that does not exist yet (or is empty), or a bucket prefix")
    p.add_argument("--layout", choices=("records", "imagefolder"), default="records",
                   help="how FOLDER holds the records (default records)")
    cut = p.add_mutually_exclusive_group()
    cut.add_argument("--shards", type=_count, metavar="N",
                     help="N new shards of equal record counts over all of FOLDER's records, in order "
                          "(default: one per shard folder; one for an image folder)")
    cut.add_argument("--shard-size", type=_size, metavar="SIZE",
                     help="new shards of about SIZE bytes of the records' files each (K, M, G suffixes)")
    p.add_argument("--compression", choices=tuple(COMPRESSIONS), default="none", help="of the new shards (default none)")
    p.add_argument("--records", choices=("example", "sequence"),
                   help="the records' kind (default: as a copied shard folder's user.tfrfs.records xattr says, "
                        "else example)")
    p.add_argument("--schema", metavar="FILE",
                   help="a dataset's .tfrfs/schema.json: the kinds of values their files cannot tell (an empty "
                        "list), which .txt values end in a newline, and the keys shown as raw pixels, where the "
                        "files carry no user.tfrfs.* xattrs")
    add_run_options(p)
    p.set_defaults(func=cmd_pack)


def _size(text: str) -> int:
    from tfrfs.index.memory import parse_size
    try:
        n = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if n < 1:
        raise argparse.ArgumentTypeError("at least 1 byte")
    return n


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError("at least 1")
    return n


def cmd_pack(args: argparse.Namespace) -> int:
    import os
    from tfrfs.edit.packing import Hints
    from tfrfs.format import tfrecord
    from tfrfs.jobs import pack, publish
    from tfrfs.jobs.reshardresult import manifest_body
    from tfrfs.jobs.shard_work import gather
    started = time.monotonic()
    if not os.path.isdir(args.folder):
        raise UsageError(f"{args.folder}: not a folder")
    hints = Hints()
    if args.schema:
        try:
            with open(args.schema, "rb") as f:
                hints = Hints.from_schema(json.load(f))
        except (OSError, ValueError) as exc:
            raise UsageError(f"--schema {args.schema}: {getattr(exc, 'strerror', None) or exc}") from None
    shards = pack.plan_imagefolder(args.folder, args.shards, args.shard_size) if args.layout == "imagefolder" \
        else pack.plan_records(args.folder, args.records, args.shards, args.shard_size)
    compression = getattr(tfrecord, COMPRESSIONS[args.compression])
    shards = [replace(s, name=pack.named_for(s.name, compression)) for s in shards]
    dest = publish.Dest.of(args.dest)
    key = "pack:" + uuid.uuid4().hex
    publish.already_published(dest, key)   # raises unless DEST is new or empty
    publish.begin(dest, key, [s.name for s in shards])
    total = sum(len(s.records) + len(s.images) for s in shards)
    progress = Progress("packing")
    counted = [0, 0]

    def finished(_: int, body: dict) -> None:
        counted[0] += 1
        counted[1] += int(body.get("count", 0))
        progress.update(f"{counted[0]}/{len(shards)} shards, {counted[1]:,}/{total:,} records")
    runner = runner_of(args)
    try:
        with runner:
            done = list(gather(runner, pack.pack_job, [(dest, s, compression, hints) for s in shards], finished))
        problems = [p for body in done for p in body["problems_found"]]
        if problems:
            publish.abandon(dest)
            progress.update("stopped", final=True)
            for line in problems:
                print(line, file=sys.stderr)
            print(f"{len(problems)} file(s) cannot be packed; nothing was written to {args.dest}", file=sys.stderr)
            return EXIT_USAGE
        written = [b for b in done if b.get("files")]
        publish.check(dest, written)
        publish.publish(dest, manifest_body(written, {}), {}, key)
    except BaseException:
        publish.abandon(dest)
        raise
    progress.update(f"{len(written)} shards, {counted[1]:,} records", final=True)
    size = sum(b["size"] for b in written)
    print(f"{args.dest}: {len(written)} shards, {counted[1]:,} records, {size / (1 << 20):,.1f} MiB "
          f"in {time.monotonic() - started:.1f}s")
    return EXIT_OK
