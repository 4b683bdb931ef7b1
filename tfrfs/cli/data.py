"""Commands that read a dataset without mounting it (SPEC 6, 1.2): verify, repair, inspect and
index."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tfrfs.errors import TfrfsError, UsageError
from tfrfs.storage.factory import is_url
from tfrfs.cli.common import EXIT_OK, EXIT_PROBLEMS, Progress, open_args, open_dataset, runner_of

if TYPE_CHECKING:
    from tfrfs.dataset.factory import DatasetParts


def _job_progress(what: str, shards: int) -> Callable[[int, int, int, int], None]:
    """Progress of a command whose shard jobs report as they finish: shards done, records, MiB."""
    progress = Progress(what)

    def show(done: int, records: int, done_bytes: int, total_bytes: int) -> None:
        progress.update(f"{done}/{shards} shards, {records:,} records, "
                        f"{done_bytes / 2**20:,.0f}/{total_bytes / 2**20:,.0f} MiB", final=done == shards)
    return show


def _problem_line(shard: str, p: Any) -> str:
    where = f"record {p.index}" if p.index is not None else "stream"
    line = f"{shard}: {where} at offset {p.offset}: {p.reason}"
    if p.compressed_offset is not None:
        line += f" (compressed offset {p.compressed_offset})"
    return line


def cmd_verify(args: argparse.Namespace) -> int:
    from tfrfs.jobs.verify import verify_source
    src = open_args(args)
    try:
        shards = src.discovery.shards
        total = problems = 0
        reports = []
        with runner_of(args, walk=True) as runner:
            for report in verify_source(src, records=args.records, runner=runner,
                                        progress=_job_progress("verifying", len(shards))):
                total += report.records
                problems += len(report.problems)
                if args.json:
                    reports.append(report.as_json())
                for p in report.problems if not args.json else ():
                    print(_problem_line(report.shard.relpath, p), flush=True)
    finally:
        src.close()
    if args.json:
        print(json.dumps({"shards": reports, "records": total, "problems": problems}, indent=1, ensure_ascii=False))
    else:
        print(f"{len(shards)} shards, {total:,} records checked, {problems} problem(s)")
    return EXIT_PROBLEMS if problems else EXIT_OK


def cmd_repair(args: argparse.Namespace) -> int:
    from tfrfs.jobs.repair import repair_source
    from tfrfs.format.tfrecord import OVERHEAD
    src = open_args(args)
    failed = repaired = 0
    stack = contextlib.ExitStack()
    try:
        shards = src.discovery.shards
        runner = stack.enter_context(runner_of(args))
        results = repair_source(src, backup=not args.no_backup, dry_run=args.dry_run,
                                progress=_job_progress("checking", len(shards)), runner=runner)
        for r in results:
            rel = r.shard.relpath
            for p in r.report.problems:
                if p.index not in r.report.unparsable:
                    print(_problem_line(rel, p))
            dropped = [f"record {i} (bytes {o}..{o + n + OVERHEAD})" for i, o, n in r.dropped_records]
            dropped += [f"bytes {a}..{b}" for a, b in r.dropped_ranges if b > a]
            if r.compressed_tail:
                a, b = r.compressed_tail
                dropped.append(f"compressed bytes {a}..{b} (do not inflate)" if b > a else
                               f"nothing more: the compressed stream is cut short at byte {a}")
            if r.error:
                failed += 1
                print(f"{rel}: NOT repaired: {r.error}", file=sys.stderr)
                continue
            repaired += 1
            verb = "would keep" if args.dry_run else "repaired: kept"
            print(f"{rel}: {verb} {r.kept:,} records; dropped {', '.join(dropped) or 'nothing'}")
            if r.backup:
                print(f"{rel}: the damaged original is kept as {os.path.relpath(r.backup, src.discovery.root)}")
            for note in r.notes:
                print(f"{rel}: {note}")
    finally:
        stack.close()
        src.close()
    what = "damaged shard(s) found" if args.dry_run else "shard(s) repaired"
    print(f"{len(shards)} shards checked, {repaired} {what}" + (f", {failed} could not be" if failed else ""))
    return EXIT_PROBLEMS if failed else EXIT_OK


def _schema_progress(schema: Any) -> None:
    """Progress on stderr while ``schema`` reads the records it does not know yet."""
    progress = Progress("reading the schema")

    def show(done: int, total: int) -> None:
        progress.update(f"{done:,}/{total:,} records", final=done == total)
    schema.progress = show


def cmd_inspect(args: argparse.Namespace) -> int:
    with runner_of(args, walk=True) as runner:
        dataset = open_dataset(args, runner=runner, schema=True)
        try:
            dataset.store.note_problems()   # each logged as it is found, before the schema is read
            _schema_progress(dataset.schema)
            _read_tallies(runner, dataset.source, dataset.schema)
            schema = dataset.schema.summary()
            problems = dataset.problems
            indexes = dataset.indexes
        finally:
            dataset.close()
    if args.json:
        print(json.dumps(schema, indent=2, ensure_ascii=False))
        return EXIT_OK
    rows = [(s["shard"], s["compression"], s["kind"], f"{s['records']:,}") for s in schema["shards"]]
    _table(("shard", "compression", "records as", "count"), rows)
    print(f"\n{len(rows)} shards, {sum(s['records'] for s in schema['shards']):,} records\n")
    for section in ("features", "feature_lists"):
        feats = schema.get(section)
        if not feats:
            continue
        frows = [(k, _kind_words(v["kind"]), f"{v['records']:,}", f"{v['min_values']}..{v['max_values']}",
                  " ".join(v["shown_as"])) for k, v in sorted(feats.items())]
        _table((section[:-1] if section == "features" else "feature list", "kind", "records", "values",
                "shown as"), frows)
        print()
    damaged = [i for i in indexes if i.problems]
    for idx in damaged[:20]:
        first = idx.problems[0]
        more = f" (and {len(idx.problems) - 1} more)" if len(idx.problems) > 1 else ""
        print(f"damaged: {_problem_line(idx.shard.relpath, first)}{more}")
    if len(damaged) > 20:
        print(f"damaged: {len(damaged) - 20} more shard(s)")
    if problems:
        print(f"{problems} problem(s) found; run `tfrfs verify {args.source}` for details "
              f"and `tfrfs repair` to rewrite damaged shards")
    return EXIT_OK


def _kind_words(kind: str | None | list[str | None]) -> str:
    """A feature's kinds as schema.json gives them (one, or a list, most records first), in words:
    ``bytes_list or none`` (none: a feature with no kind)."""
    kinds = kind if isinstance(kind, list) else [kind]
    return " or ".join(k or "none" for k in kinds)


def _check_beside(source: str) -> None:
    """That the index files can go beside a local SOURCE's shards: its folder is writable (the
    shards' own folders are known only once SOURCE is listed; writing there says the rest).
    Raises UsageError."""
    if is_url(source) or not os.path.exists(source):
        return   # a bucket, or a glob: SOURCE's own checks and the writing tell
    folder = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{folder}: not writable, so no index file can go beside its shards; give "
                         "--out-dir DIR (and mount with --index-dir DIR)")


def cmd_index(args: argparse.Namespace) -> int:
    from tfrfs.dataset.sources import ship_indexes, write_manifest
    started = time.monotonic()
    write = args.beside or args.out_dir or args.format == "dali"
    if write and not args.out_dir:
        _check_beside(args.source)
    # The shards indexed by jobs have their schema read there too, while their bytes are in the
    # page cache; ``_read_schema`` reads what is left (large shards in parts, cached indexes).
    runner = runner_of(args, walk=True)
    try:
        dataset = open_dataset(args, runner=runner, schema=not args.no_schema)
    except BaseException:
        runner.close()
        raise
    src, indexes, cache = dataset.source, dataset.indexes, dataset.cache
    manifest_at = None
    try:
        with runner:
            schema = None if args.no_schema else _read_schema(dataset, runner)
        try:
            shipped = ship_indexes(src, indexes, cache, fmt=args.format, out_dir=args.out_dir) if write else []
            if args.beside and args.format == "tfrfs" and src.discovery.mirrors_dir:
                manifest_at = write_manifest(src, indexes, cache, shipped, schema)
        except TfrfsError:
            raise
        except OSError as exc:   # the disk filled up, or a folder of SOURCE refused (a bucket: access denied)
            where = f"into {args.out_dir}" if args.out_dir else "beside the shards"
            what = f"{exc.filename}: " if exc.filename else ""
            raise TfrfsError(f"cannot write the index files {where}: {what}{exc.strerror or exc}") from None
    finally:
        dataset.close()
    for s in shipped:
        if s.skipped:
            print(f"{s.shard}: no index file written: {s.skipped}", file=sys.stderr)
    records = sum(i.count for i in indexes)
    problems = sum(len(i.problems) for i in indexes)
    reused = len(indexes) - cache.scans
    print(f"{len(indexes)} shards, {records:,} records indexed in {time.monotonic() - started:.1f}s "
          f"({cache.scans} scanned, {reused} from the cache or index files)")
    written = [s for s in shipped if s.path]
    if written:
        where = args.out_dir or "beside the shards"
        print(f"wrote {len(written)} {args.format} index file(s) {where}")
    if manifest_at:
        print(f"wrote the dataset's manifest {manifest_at}")
    if problems:
        print(f"{problems} problem(s) found; run `tfrfs verify {args.source}` for details", file=sys.stderr)
    return EXIT_PROBLEMS if problems or any(s.skipped for s in shipped) else EXIT_OK


def _read_schema(dataset: DatasetParts, runner: Any) -> dict:
    """Every shard's part of the schema, into its index (so into the files shipped beside it); the
    dataset's schema summary (SPEC 5)."""
    schema = dataset.schema
    _schema_progress(schema)
    _read_tallies(runner, dataset.source, schema)
    schema.tallies()
    return schema.summary()


def _read_tallies(runner: Any, src: Any, schema: Any) -> None:
    """The shards' parts of ``schema`` that are not known yet, read as shard jobs on ``runner``
    and kept as the schema keeps what it reads itself (with the shard's index, in the cache)."""
    from tfrfs.index.where import Where
    from tfrfs.jobs.indexing import read_tallies
    store = schema.store

    def keep(n: int, idx: Any, tally: Any) -> None:
        idx.tally = tally
        if schema.save is not None and tally.kind == idx.detected_kind and store.shards[n] is idx:
            schema.save(idx)
    read_tallies(runner, Where.of(src), store.shards, store.kinds, keep, schema.progress)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in (header, *rows):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
