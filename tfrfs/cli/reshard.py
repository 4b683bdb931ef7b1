"""``tfrfs reshard SOURCE DEST`` (SPEC 8): plan, run one job per new shard, publish, report."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from tfrfs.cli.common import EXIT_OK, EXIT_PROBLEMS, Progress, open_dataset, runner_of

COMPRESSIONS = {"none": "NONE", "gzip": "GZIP", "zlib": "ZLIB"}


def _shard_count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of shards, 1 or more")
    return n


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number as SEED (like 42)") from None


def add_reshard(sub: Any, source_options: Any, size: Any) -> None:
    """The ``reshard`` subcommand's grammar."""
    from tfrfs.cli.common import add_run_options
    p = sub.add_parser(
        "reshard", help="copy SOURCE's records into new shards in DEST (a folder or bucket prefix)",
        description="Copy every record of SOURCE, byte for byte, into new shards in DEST: --shards N of "
                    "equal record counts, or --shard-size SIZE bytes each. Each new shard gets its index "
                    "file, DEST the dataset's manifest, and a TFDS dataset (a folder with dataset_info.json) "
                    "stays one: each split is resharded on its own, named as TFDS names shards, and "
                    "dataset_info.json lists the new shard lengths. DEST appears complete or not at all; "
                    "running the same command again finishes an interrupted run.")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("dest", metavar="DEST", help="a folder that does not exist yet (or is empty), or a bucket prefix")
    cut = p.add_mutually_exclusive_group(required=True)
    cut.add_argument("--shards", type=_shard_count, metavar="N", help="N new shards (per TFDS split) of equal record counts")
    cut.add_argument("--shard-size", type=size, metavar="SIZE",
                     help="new shards of at most SIZE bytes of records each (K, M, G suffixes)")
    p.add_argument("--compression", choices=tuple(COMPRESSIONS), default="none",
                   help="of the new shards (default none)")
    p.add_argument("--shuffle", type=_seed, metavar="SEED",
                   help="put the records in one random order, the same for the same SEED")
    schema = p.add_mutually_exclusive_group()
    schema.add_argument("--schema", dest="schema", action="store_const", const=True,
                        help="read what the records hold while copying them, so that each new shard's index file "
                             "holds its part of the schema (by default only when SOURCE's schema is not known: "
                             "else the new manifest takes SOURCE's, the same records, and each new shard's part "
                             "is read when first needed)")
    schema.add_argument("--no-schema", dest="schema", action="store_const", const=False,
                        help="never read the schema while copying (the manifest then has none unless SOURCE's "
                             "is known)")
    p.add_argument("--no-check", action="store_true",
                   help="copy the records, in order and uncompressed, as byte ranges, "
                        "without reading each record's data checksum or schema (as fast as cp; implies --no-schema). "
                        "Headers were checked when SOURCE was indexed; a record whose data is damaged is "
                        "copied as it is (TensorFlow and `tfrfs verify` still find it), not left out")
    p.add_argument("--name", metavar="TEMPLATE",
                   help="new shard names: {PREFIX} (the source shards' common name, else DEST's), "
                        "{SHARD_INDEX}, {NUM_SHARDS}, {SHARD_X_OF_Y}; default {PREFIX}-{SHARD_X_OF_Y}.tfrecord. "
                        "For a TFDS dataset: {DATASET}, {SPLIT}, {FILEFORMAT} too, and it becomes the "
                        "splits' filepathTemplate")
    source_options(p)
    add_run_options(p)
    p.set_defaults(func=cmd_reshard)


# A job writes several small new shards (one receipt for them all, each source opened once):
# about this many bytes of them, at most this many, and enough jobs for every worker to take a few.
_JOB_BYTES = 64 << 20
_JOB_SHARDS = 32
_JOBS_PER_WORKER = 4


class _Jobs(Sequence):
    """The runner's argument tuples: runs of ``per`` consecutive tasks of the plan, each task made
    when its job is asked for."""

    def __init__(self, where: Any, dest: Any, tasks: Any, per: int, compression: str, kind: str,
                 tally: bool) -> None:
        self.where, self.dest, self.tasks, self.per = where, dest, tasks, per
        self.compression, self.kind, self.tally = compression, kind, tally

    @staticmethod
    def per_job(plan: Any, todo: int, workers: int) -> int:
        """How many new shards a job writes: as many as make ``_JOB_BYTES`` (new shards' average
        size), at most ``_JOB_SHARDS``, and few enough that each worker gets several jobs."""
        average = sum(s.stream_size for s in plan.sources) / max(1, len(plan.names))
        return max(1, min(_JOB_SHARDS, int(_JOB_BYTES // max(average, 1)),
                          todo // (_JOBS_PER_WORKER * max(1, workers))))

    def __len__(self) -> int:
        return -(-len(self.tasks) // self.per)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not 0 <= k < len(self):
            raise IndexError(k)
        tasks = tuple(self.tasks[i] for i in range(k * self.per, min(len(self.tasks), (k + 1) * self.per)))
        return (self.where, self.dest, tasks, self.compression, self.kind, self.tally)


def cmd_reshard(args: argparse.Namespace) -> int:
    from tfrfs.jobs import publish
    from tfrfs.errors import UsageError
    from tfrfs.index.where import Where
    from tfrfs.jobs.publish import Dest
    from tfrfs.storage.factory import is_url
    from tfrfs.storage.fsspec_store import parse_options
    from tfrfs.jobs.reshard import copy_shards
    from tfrfs.jobs.reshardplan import Tasks, make_plan
    from tfrfs.jobs.reshardresult import manifest_body, new_info, order_problems, sizes
    from tfrfs.jobs.reshardplan import check_template
    if args.name is not None:
        # Which fields a name may use is known once SOURCE is (a TFDS dataset's or not): make_plan
        # checks that; what no SOURCE takes is refused before SOURCE is indexed.
        check_template(args.name, ("PREFIX", "DATASET", "SPLIT", "FILEFORMAT"))
    compression = COMPRESSIONS[args.compression]
    if args.no_check and (args.shuffle is not None or compression != "NONE"):
        raise UsageError("--no-check copies the records in order into uncompressed shards: "
                         "leave out --shuffle and --compression, or --no-check")
    if args.no_check:
        if args.schema:
            raise UsageError("--no-check reads no record, so it cannot read the schema: leave out --schema")
        args.schema = False   # no record is read, so none is tallied
    options = parse_options(args.options or []) if is_url(args.dest) else None
    dest = Dest.of(args.dest, options)
    if not is_url(dest.root) and not is_url(args.source):
        src_root = os.path.abspath(args.source)
        if dest.root == src_root or dest.root.startswith(src_root.rstrip(os.sep) + os.sep):
            raise UsageError(f"{args.dest}: DEST is inside SOURCE; give a folder elsewhere")
    if not is_url(dest.root):
        _check_local_dest(args.dest, dest.root)
    started = time.monotonic()
    dataset = open_dataset(args)
    src, indexes = dataset.source, dataset.indexes
    try:
        plan = make_plan(src, indexes, dest, shards=args.shards, shard_size=args.shard_size,
                         compression=compression, shuffle=args.shuffle, template=args.name,
                         schema=args.schema, check=not args.no_check)
        if publish.already_published(dest, plan.key):
            publish.tidy(dest)
            print(f"{args.dest}: already complete ({len(plan.names)} shards from this very reshard); nothing to do")
            return EXIT_OK
        if plan.info is not None and compression != "NONE":
            print(f"tfrfs: note: TFDS reads uncompressed shards; the {args.compression} shards of {args.dest} are for "
                  "other readers", file=sys.stderr)
        publish.begin(dest, plan.key, plan.names + plan.copies + (["dataset_info.json"] if plan.info else []))
        names = plan.names
        earlier = {n: body for n, body in publish.receipts(dest).items()
                   if n < len(names) and body.get("name") == names[n]}
        tasks = Tasks(plan, set(earlier))
        done: dict[int, dict] = dict(earlier)
        progress = Progress("resharding")
        written = sum(b["size"] for b in earlier.values())
        with runner_of(args) as runner:
            jobs = _Jobs(Where.of(src), dest, tasks, _Jobs.per_job(plan, len(tasks), runner.workers),
                         compression, plan.kind, plan.schema)
            for _, job_bodies in runner.run(copy_shards, jobs):
                for body in job_bodies:
                    done[body["n"]] = body
                    written += body["size"]
                rate = written / 1e6 / max(time.monotonic() - started, 1e-6)
                progress.update(f"{len(done)}/{len(names)} shards, {written / 2**20:,.0f} MiB ({rate:,.0f} MB/s)",
                                final=len(done) == len(names))
        bodies = [done[n] for n in range(len(names))]
        _check_counts(plan, bodies, dest)
        publish.check(dest, bodies)
        info, notes = new_info(plan, bodies)
        extra: dict[str, tuple[int, int]] = {}
        files: dict[str, bytes] = {rel: src.discovery.access.read_bytes(_join(src.discovery.root, rel))
                                   for rel in plan.copies}
        if info is not None:
            files["dataset_info.json"] = info
        for name, data in files.items():
            size, _, mtime_ns = dest.write_bytes(name, data)
            extra[name] = (size, mtime_ns)
        publish.publish(dest, manifest_body(bodies, extra, plan.source_tallies), {}, plan.key)
    finally:
        dataset.close()
    problems = order_problems(plan, bodies)
    for rel, p in problems:
        where = f"record {p['index']}" if p.get("index") is not None else "stream"
        print(f"{rel}: {where} at offset {p['offset']}: {p['reason']} (not copied)")
    for note in notes:
        print(f"tfrfs: note: {note}", file=sys.stderr)
    records, size = sizes(bodies)
    took = time.monotonic() - started
    print(f"{args.dest}: {len(bodies)} shards, {records:,} records, {size / 2**20:,.1f} MiB in {took:.1f}s"
          + (f"; {len(problems)} problem(s) in SOURCE: what they hit is left out" if problems else ""))
    return EXIT_PROBLEMS if problems else EXIT_OK


def _check_local_dest(given: str, root: str) -> None:
    """What publishing would refuse of a local DEST only after SOURCE was indexed, refused now:
    DEST a file, DEST's parent missing or not writable, DEST a folder holding something other than
    a finished reshard (which may be this very one, done already). Raises UsageError."""
    from tfrfs.errors import UsageError
    from tfrfs.jobs.publish import MANIFEST
    if os.path.lexists(root) and not os.path.isdir(root):
        raise UsageError(f"{given}: DEST is a file; give a folder that does not exist yet (or is empty)")
    parent = os.path.dirname(root)
    if not os.path.isdir(parent):
        says = "DEST is inside a file" if os.path.exists(parent) else f"no such folder {parent} (DEST's parent)"
        raise UsageError(f"{given}: {says}; give a folder whose parent exists")
    try:
        names = os.listdir(root) if os.path.isdir(root) else []
    except OSError as exc:
        raise UsageError(f"{given}: cannot read DEST: {exc.strerror}") from None
    if MANIFEST in names:
        return   # publishing tells whether it is this reshard's, done already
    if names:
        raise UsageError(f"{given}: DEST is not empty; give a new folder or prefix (or an empty one)")
    # The new shards are written in a folder beside DEST, then renamed to it: the parent is written.
    try:
        probe = tempfile.mkdtemp(prefix=".tfrfs-probe-", dir=parent)
    except OSError as exc:
        raise UsageError(f"{given}: cannot write beside it, in {parent}: {exc.strerror}") from None
    os.rmdir(probe)


def _check_counts(plan: Any, bodies: list[dict], dest: Any) -> None:
    """That each new shard holds the records planned for it (dropped ones counted). A shard that
    does not is written again by the next run."""
    from tfrfs.jobs import publish
    from tfrfs.errors import DataLoss
    expected = [hi - lo for g in plan.groups for lo, hi in g.cuts]
    for body, count in zip(bodies, expected):
        if body["count"] + len(body.get("dropped", ())) != count:
            publish.forget_receipts(dest, [body["n"]])
            raise DataLoss(f"{body['name']}: {body['count']} records written and {len(body.get('dropped', ()))} "
                           f"dropped, {count} planned; run the command again")


def _join(root: str, rel: str) -> str:
    return root.rstrip("/") + "/" + rel if "://" in root else os.path.join(root, rel)
