"""`relay ops compact`: move finished history out of the live store into Parquet.

    relay ops compact [--archive URI] [--master URL] [--done-retention 7d]
                      [--dead-retention 30d] [--batch-rows N] [--vacuum-pages N]
    spark-submit ops/compact.py --home DIR [same options]

Candidates are the copies that are finished and past retention: done ones whose done time
is older than ``--done-retention`` (default 7 days) and dead letters whose failure time is
older than ``--dead-retention`` (30 days). New and claimed messages are never candidates,
and the writers check again before they remove anything.

Per batch of candidates (in (id, endpoint) order, from the shard indexes, read-only):

1. read their files (the driver reads them, so any Spark master works: the executors
   never need the mailboxes);
2. Spark parses the envelopes, drops rows the archive already holds (a batch committed
   by an earlier run that was killed before its removal) and writes the rest, by UTC day
   of their finish time, through the archive's commit protocol (ops/archive.py);
3. the archived copies (and those found already archived) are removed from the live
   store by their writers, or by this job when no broker runs (ops/removal.py). The
   removal of a batch runs on a thread of its own while the next batch is read and
   written (the removal waits on the disk, the write on the CPUs); it starts only once
   its own batch has committed, and one removal runs at a time.

Then the router's old rejection counts are archived the same way, and each index is
checkpointed and, past ``--vacuum-pages`` free pages, vacuumed. A run killed anywhere
and run again archives nothing twice and loses nothing: docs/ops.md walks through it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

if __package__ in (None, ""):  # run as a file: `spark-submit ops/compact.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ops.archive import (
    AFTER_COMMIT,
    ENVELOPE_SCHEMA,
    MESSAGE_COLUMNS,
    MESSAGES,
    REJECTIONS,
    Archive,
)
from ops.live import (
    FILE_SCHEMA,
    REJECTION_SCHEMA,
    FileReader,
    day_of,
    finished_rows,
    open_indexes,
    read_rejections,
    rejections_path,
    rows_table,
)
from ops.progress import Progress
from ops.removal import OpsError, RemovalTotals, choose_removal
from sdk.paths import Home
from workers.faults import fault_point
from workers.sqlite import open_db, transaction

DAY_MS = 86_400_000
DONE_RETENTION = "7d"
DEAD_RETENTION = "30d"
BATCH_ROWS = 200_000  # candidates per commit: bounds driver memory (~0.5 KiB a row)
VACUUM_PAGES = 1024  # free index pages (4 KiB each) from which an index is vacuumed


def parse_duration(text: str) -> int:
    """'7d', '12h', '30m', '45s' or a bare number of days, in ms."""
    units = {"d": DAY_MS, "h": 3_600_000, "m": 60_000, "s": 1000}
    text = text.strip().lower()
    unit = units.get(text[-1:])
    number = text[:-1] if unit else text
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 7d, 12h, 30m") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a retention cannot be negative")
    return int(value * (unit or DAY_MS))


@dataclass
class CompactOptions:
    home: Home
    archive: str | None = None  # default $RELAY_HOME/archive
    done_retention_ms: int = 7 * DAY_MS
    dead_retention_ms: int = 30 * DAY_MS
    batch_rows: int = BATCH_ROWS
    vacuum_pages: int = VACUUM_PAGES
    removal: str = "auto"  # auto | broker | local
    now_ms: int | None = None

    @property
    def archive_location(self) -> str:
        return self.archive or os.fspath(self.home.archive)


@dataclass
class CompactSummary:
    run_id: str
    archive: str
    removal: str = ""
    candidates: int = 0  # finished copies past retention found in the indexes
    archived: int = 0  # rows this run wrote to the archive
    already_archived: int = 0  # found in the archive (an earlier run's): not written again
    missing_files: int = 0  # index rows whose file was gone: nothing to archive
    removed: int = 0  # copies no longer in the live store (index rows deleted)
    files_removed: int = 0
    bytes_freed: int = 0
    skipped: int = 0  # new or claimed after all: left alone by the writers
    batches: int = 0
    rejection_rows: int = 0  # rejection-count rows archived
    recovered: dict[str, int] = field(default_factory=dict)
    indexes: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        mib = self.bytes_freed / 1_048_576
        vacuumed = sum(1 for i in self.indexes if i.get("vacuumed"))
        lines = [
            f"compaction {self.run_id} in {self.seconds:.1f} s, archive {self.archive}",
            f"  candidates  {self.candidates:,} finished copies past retention",
            f"  archived    {self.archived:,} rows"
            + (
                f" ({self.already_archived:,} were archived already)"
                if self.already_archived
                else ""
            ),
            f"  removed     {self.removed:,} copies by {self.removal}: {self.files_removed:,} "
            f"files, {mib:,.1f} MiB freed"
            + (f", {self.skipped:,} left alone (not finished)" if self.skipped else ""),
            f"  indexes     {len(self.indexes)} checkpointed, {vacuumed} vacuumed",
        ]
        if self.missing_files:
            lines.append(f"  missing     {self.missing_files:,} index rows had no file")
        if self.rejection_rows:
            lines.append(f"  rejections  {self.rejection_rows:,} count rows archived")
        if any(self.recovered.values()):
            lines.append(
                f"  recovered   an earlier run's batches: {self.recovered.get('completed', 0)} "
                f"completed, {self.recovered.get('discarded', 0)} discarded"
            )
        return "\n".join(lines)


def new_run_id(now_ms: int) -> str:
    stamp = datetime.fromtimestamp(now_ms / 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(3)}"


def batched(rows: Iterable[tuple], size: int) -> Iterator[list[tuple]]:
    batch: list[tuple] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def messages_frame(spark, table, run_id: str, archived_at: int):
    """The archive rows of a batch: the index columns, the envelope's own fields parsed
    by Spark, the file itself, and the run that archived it."""
    from pyspark.sql import functions as F

    df = spark.createDataFrame(table)
    env = F.from_json("envelope", ENVELOPE_SCHEMA)
    computed = {
        "published_to": env["publishedTo"],
        "reply_to": env["replyTo"],
        "budget": env["budget"],
        "run_id": F.lit(run_id),
        "archived_at": F.lit(archived_at).cast("long"),
        "day": F.date_format(F.timestamp_millis("finished_at"), "yyyy-MM-dd"),
    }
    # MESSAGE_COLUMNS is the one list of the archive's columns and their order.
    return df.select(*[computed[c].alias(c) if c in computed else c for c in MESSAGE_COLUMNS])


def compact(spark, opts: CompactOptions, progress: Progress | None = None) -> CompactSummary:
    progress = progress or Progress(enabled=False)
    started = time.monotonic()
    now = opts.now_ms if opts.now_ms is not None else int(time.time() * 1000)
    done_before, failed_before = now - opts.done_retention_ms, now - opts.dead_retention_ms
    archive = Archive(spark, opts.archive_location)
    summary = CompactSummary(new_run_id(now), archive.uri)

    progress.update("recover")
    summary.recovered = archive.recover()
    remover = choose_removal(opts.home, opts.removal)
    summary.removal = remover.mode
    totals = RemovalTotals()
    # One removal in flight, overlapping the next batch's read and Spark write.
    background = ThreadPoolExecutor(1, thread_name_prefix="relay-compact-remove")
    pending: Future | None = None

    def settle() -> None:
        nonlocal pending
        if pending is not None:
            done, pending = pending, None
            done.result()  # its error (e.g. OpsError) stops the run here
            progress.update("remove", totals.removed)

    try:
        reader = FileReader(opts.home)
        with open_indexes(opts.home) as indexes:
            candidates = finished_rows(indexes, done_before, failed_before)
            for seq, chunk in enumerate(batched(candidates, opts.batch_rows)):
                summary.batches += 1
                keys, hints, file_rows = [], {}, []
                for row in chunk:
                    key = (row[0], row[1])
                    keys.append(key)
                    hints[key] = (row[0], row[7], row[8])
                    data = reader.read(row)
                    if data is None:
                        summary.missing_files += 1
                    else:
                        file_rows.append((*row, data.decode("utf-8", "replace")))
                    if len(keys) % 10_000 == 0:
                        progress.update("read files", summary.candidates + len(keys))
                summary.candidates += len(chunk)
                progress.update("read files", summary.candidates)
                if file_rows:
                    progress.update("write", summary.archived, f"batch {seq + 1}")
                    days = {day_of(row[8]) for row in file_rows}
                    df = messages_frame(
                        spark, rows_table(file_rows, FILE_SCHEMA), summary.run_id, now
                    )
                    df = archive.new_rows(df, MESSAGES, days)
                    committed = archive.commit(df, MESSAGES, f"{summary.run_id}-{seq:04d}")
                    summary.archived += committed.rows
                    summary.already_archived += len(file_rows) - committed.rows
                    progress.update("write", summary.archived, f"batch {seq + 1}")
                fault_point(AFTER_COMMIT)
                settle()  # the previous batch's removal
                pending = background.submit(remover.remove, keys, hints, totals)
            settle()
        summary.rejection_rows = _compact_rejections(
            spark, opts, archive, summary.run_id, failed_before
        )
        progress.update("checkpoint")
        remover.finish(opts.vacuum_pages, totals)
    finally:
        if pending is not None:  # a failure elsewhere: let the removal finish first
            wait([pending])
        background.shutdown()
        remover.close()
        progress.done()
    summary.removed, summary.files_removed = totals.removed, totals.files
    summary.bytes_freed, summary.skipped, summary.indexes = (
        totals.bytes,
        totals.skipped,
        totals.indexes,
    )
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


def _compact_rejections(
    spark, opts: CompactOptions, archive: Archive, run_id: str, before: int
) -> int:
    """Archive the router's rejection counts of minutes past the dead-letter retention,
    then delete them from rejections.db. The router only ever adds to the current
    minute, so rows this old never change again."""
    from pyspark.sql import functions as F

    rows = read_rejections(opts.home, before_minute=before)
    if not rows:
        return 0
    df = spark.createDataFrame(rows_table(rows, REJECTION_SCHEMA)).withColumn(
        "day", F.date_format(F.timestamp_millis("minute"), "yyyy-MM-dd")
    )
    df = archive.new_rows(df, REJECTIONS, {day_of(r[0]) for r in rows})
    committed = archive.commit(df, REJECTIONS, f"{run_id}-rejections")
    conn = open_db(rejections_path(opts.home))
    try:
        with transaction(conn):
            conn.cursor().executemany(
                "DELETE FROM rejections WHERE minute = ? AND reason = ? AND endpoint = ? "
                "AND sender = ?",
                [r[:4] for r in rows],
            )
    finally:
        conn.close()
    return committed.rows


# ---------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--archive", help="archive URI or path (default $RELAY_HOME/archive)")
    parser.add_argument("--master", help="Spark master (default local[*])")
    parser.add_argument(
        "--done-retention",
        type=parse_duration,
        default=DONE_RETENTION,
        metavar="AGE",
        help=f"archive done messages older than this (default {DONE_RETENTION})",
    )
    parser.add_argument(
        "--dead-retention",
        type=parse_duration,
        default=DEAD_RETENTION,
        metavar="AGE",
        help=f"archive dead letters older than this (default {DEAD_RETENTION})",
    )
    parser.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help="rows per commit")
    parser.add_argument(
        "--vacuum-pages",
        type=int,
        default=VACUUM_PAGES,
        help=f"vacuum an index with at least this many free pages (default {VACUUM_PAGES})",
    )
    parser.add_argument(
        "--removal",
        choices=["auto", "broker", "local"],
        default="auto",
        help="who removes archived files: the running broker's writers, or this job when "
        "no Relay process runs (default: auto)",
    )
    parser.add_argument(
        "--now",
        type=int,
        default=None,
        metavar="MS",
        help="the clock retention counts from, unix ms (default: now; for reproducible runs)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def run(args: argparse.Namespace) -> int:
    from ops.spark_session import spark_session

    if args.batch_rows < 1 or args.vacuum_pages < 0:
        print("relay ops compact: --batch-rows must be >= 1, --vacuum-pages >= 0", file=sys.stderr)
        return 2
    opts = CompactOptions(
        home=Home(args.home),
        archive=args.archive,
        done_retention_ms=args.done_retention,
        dead_retention_ms=args.dead_retention,
        batch_rows=args.batch_rows,
        vacuum_pages=args.vacuum_pages,
        removal=args.removal,
        now_ms=args.now,
    )
    progress = Progress(enabled=not args.quiet)
    progress.update("spark")
    spark = spark_session(args.master, "relay-ops-compact")
    try:
        summary = compact(spark, opts, progress)
    except OpsError as exc:
        print(f"relay ops compact: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary.to_json(), indent=2) if args.json else summary.describe())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compact.py", description=__doc__.split("\n")[0])
    parser.add_argument("--home", default=None, help="data directory (default $RELAY_HOME)")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
