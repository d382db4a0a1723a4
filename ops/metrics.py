"""`relay ops metrics`: delivery statistics over the archive and the live index.

    relay ops metrics [--archive URI] [--master URL] [--out DIR] [--bucket auto|minute|hour|day]

Spark SQL over two views:

- ``messages``: every copy, live (the shard indexes, read-only, through Arrow) and
  archived (``archive/messages``). A copy archived by a run that was killed before its
  removal is in both; the live row is dropped (a semi-join of the archive's keys
  against the live finished keys).
- ``rejections``: the router's counts of rate_limited, backpressure and circuit_open
  refusals (``rejections.db``, broker/rejections.py, and ``archive/rejections``).

Budget, access and no-match rejections are dead letters: they are counted from
``messages`` by their code. Latency is stored -> done (``finished_at - stored_at`` of
done copies: time waiting in new/ plus the consumer's handling), exact percentiles.
Depth is live only: copies waiting in new/ and claimed now, per endpoint.

Output: a JSON document (`collect`) and a self-contained HTML report (ops/report.py),
both written to ``--out`` (default ``$RELAY_HOME/reports``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: `spark-submit ops/metrics.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ops.archive import MESSAGES, REJECTIONS, Archive
from ops.live import (
    INDEX_SCHEMA,
    REJECTION_SCHEMA,
    all_rows,
    endpoint_subjects,
    open_indexes,
    read_rejections,
    rows_table,
)
from ops.progress import Progress
from sdk.paths import UNROUTABLE, Home, write_private
from workers.index_sql import COLUMNS

BUCKETS_MS = {"minute": 60_000, "hour": 3_600_000, "day": 86_400_000}
PERCENTILES = (0.5, 0.95, 0.99)
HISTOGRAM_STEPS = 4  # latency histogram bins per power of ten
# Dead-letter codes decided at publish time: rejections of the publish, by category.
PUBLISH_CODES = {
    "no_match": "no_match",
    "access_denied": "access_denied",
    "hop_limit": "budget_exceeded",
    "cycle_detected": "budget_exceeded",
    "ttl_expired": "budget_exceeded",
    "budget_exhausted": "budget_exceeded",
}
ROUTER_REASONS = ("rate_limited", "backpressure", "circuit_open")
PAGE_ROWS = 200_000  # live rows per Arrow chunk


def choose_bucket(first_ms: int | None, last_ms: int | None) -> str:
    """minute for up to 6 hours of data, hour up to 7 days, day beyond."""
    span = (last_ms or 0) - (first_ms or 0)
    if span <= 6 * 3_600_000:
        return "minute"
    if span <= 7 * 86_400_000:
        return "hour"
    return "day"


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return (
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def _live_frame(spark, home: Home):
    import pyarrow as pa

    tables = []
    with open_indexes(home) as indexes:
        chunk: list[tuple] = []
        for row in all_rows(indexes):
            chunk.append(row)
            if len(chunk) >= PAGE_ROWS:
                tables.append(rows_table(chunk))
                chunk = []
        tables.append(rows_table(chunk))
    table = pa.concat_tables(tables)
    return spark.createDataFrame(table, schema=_spark_schema(spark, INDEX_SCHEMA)), table.num_rows


def _spark_schema(spark, schema) -> str:
    types = {"string": "string", "int64": "bigint"}
    return ", ".join(f"{f.name} {types[str(f.type)]}" for f in schema)


def _rows(df) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in df.collect()]


def collect(
    spark,
    home: Home,
    archive_location: str | None = None,
    *,
    bucket: str = "auto",
    top: int = 50,
    now_ms: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The metrics document (see docs/ops.md for its fields), stage by stage: the views,
    then one function per part of the document, each a few Spark SQL queries over them."""
    progress = progress or Progress(enabled=False)
    started = time.monotonic()
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    archive = Archive(spark, archive_location or os.fspath(home.archive))

    progress.update("read live")
    views = register_views(spark, home, archive)
    progress.update("totals")
    total = totals(spark)
    if bucket == "auto":
        bucket = choose_bucket(total["first_created"], total["last_created"])
    width = BUCKETS_MS[bucket]
    progress.update("volume")
    volume_rows = volume(spark, width)
    progress.update("breakdowns")
    subjects = endpoint_subjects(home)
    by_subject, by_sender = by_subject_and_sender(spark, top)
    by_endpoint_rows = by_endpoint(spark, subjects)
    progress.update("latency")
    latency_doc = latency(spark)
    progress.update("dead letters")
    dead = dead_letters(spark, top)
    progress.update("rejections")
    rejected = rejections(spark, dead["byCode"], width, top)
    progress.update("depth")
    depth_rows = depth(spark, subjects, now)
    progress.done()
    views.release()

    return {
        "generatedAt": now,
        "generatedAtIso": _iso(now),
        "home": os.fspath(home.root),
        "archive": archive.uri,
        "seconds": round(time.monotonic() - started, 3),
        "sources": {
            "live": views.live_rows,
            "archived": total["archived"],
            "overlap": views.overlap,
        },
        "range": {
            "firstCreated": total["first_created"],
            "lastCreated": total["last_created"],
            "firstCreatedIso": _iso(total["first_created"]),
            "lastCreatedIso": _iso(total["last_created"]),
        },
        "bucket": bucket,
        "totals": {
            "copies": total["copies"],
            "messages": total["messages"],
            "bytes": total["bytes"],
            "byState": {s: total[s] for s in ("new", "claimed", "done", "failed")},
        },
        "volume": volume_rows,
        "bySubject": by_subject,
        "bySender": by_sender,
        "byEndpoint": by_endpoint_rows,
        "latency": latency_doc,
        "deadLetters": {"total": total["failed"], **dead},
        "rejections": rejected,
        "depth": depth_rows,
    }


# ---------------------------------------------------------------------- the stages
#
# Each stage below queries the views `register_views` made (``messages``, ``live``,
# ``rejections``) and returns its part of the document, so each can be run, and tested,
# over views made by hand.


@dataclass
class Views:
    """What `register_views` registered, and what to release once the stages ran."""

    messages: Any  # the persisted ``messages`` frame
    duplicates: Any | None  # the keys both archived and live, cached (None: no archive)
    live_rows: int  # rows read from the shard indexes
    overlap: int  # copies both archived and still live, counted once

    def release(self) -> None:
        self.messages.unpersist()
        if self.duplicates is not None:
            self.duplicates.unpersist()


def register_views(spark, home: Home, archive: Archive) -> Views:
    """The SQL views ``messages`` (every copy, live and archived, each once), ``live``
    (the shard indexes now) and ``rejections`` (the router's counts)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    live, live_rows = _live_frame(spark, home)
    archived = archive.read(MESSAGES)
    overlap = 0
    dup = None
    if archived is not None:
        # The archive has the index columns of its day (docs/ops.md), not those added
        # since (parent_id, deliveries): the union holds the ones both sides have.
        shared = [c for c in COLUMNS if c in archived.columns]
        archived = archived.select(*shared)
        keys = ["id", "endpoint"]
        finished = live.where(F.col("state").isin("done", "failed")).select(*keys)
        dup = archived.select(*keys).join(finished, keys, "left_semi").cache()
        overlap = dup.count()
        if overlap:
            live = live.join(dup, keys, "left_anti")
        messages = (
            live.select(*shared)
            .withColumn("source", F.lit("live"))
            .unionByName(archived.withColumn("source", F.lit("archive")))
        )
    else:
        messages = live.withColumn("source", F.lit("live"))
    # Every query below scans this: keep it (spills to disk when it does not fit).
    messages = messages.persist(StorageLevel.MEMORY_AND_DISK)
    messages.createOrReplaceTempView("messages")
    live.createOrReplaceTempView("live")
    _rejections_frame(spark, home, archive).createOrReplaceTempView("rejections")
    return Views(messages, dup, live_rows, overlap)


def totals(spark) -> dict[str, Any]:
    """Copies, messages, copies per state and per source, bytes, first and last created."""
    return (
        spark.sql(
            """
        SELECT count(*) AS copies, count(DISTINCT id) AS messages,
               count_if(state = 'new') AS new, count_if(state = 'claimed') AS claimed,
               count_if(state = 'done') AS done, count_if(state = 'failed') AS failed,
               count_if(source = 'live') AS live, count_if(source = 'archive') AS archived,
               coalesce(sum(size), 0) AS bytes,
               min(created_at) AS first_created, max(created_at) AS last_created
        FROM messages
        """
        )
        .first()
        .asDict()
    )


def volume(spark, width: int) -> list[dict[str, Any]]:
    """Copies, messages, done and failed per bucket of ``width`` ms of creation time."""
    rows = _rows(
        spark.sql(
            f"""
            SELECT floor(created_at / {width}) * {width} AS bucket, count(*) AS copies,
                   count(DISTINCT id) AS messages, count_if(state = 'done') AS done,
                   count_if(state = 'failed') AS failed
            FROM messages GROUP BY 1 ORDER BY 1
            """
        )
    )
    for row in rows:
        row["bucket"] = int(row["bucket"])
        row["start"] = _iso(row["bucket"])
    return rows


def by_subject_and_sender(spark, top: int) -> tuple[list[dict], list[dict]]:
    """The ``top`` subjects (by copies) and senders (by messages), with their states."""
    by_subject = _rows(
        spark.sql(
            f"""
            SELECT subject, count(*) AS copies, count(DISTINCT id) AS messages,
                   count_if(state = 'done') AS done, count_if(state = 'failed') AS failed,
                   count_if(state = 'new') AS new, count_if(state = 'claimed') AS claimed
            FROM messages GROUP BY subject ORDER BY copies DESC, subject LIMIT {int(top)}
            """
        )
    )
    by_sender = _rows(
        spark.sql(
            f"""
            SELECT sender, count(DISTINCT id) AS messages, count(*) AS copies,
                   count_if(state = 'failed') AS failed
            FROM messages GROUP BY sender ORDER BY messages DESC, sender LIMIT {int(top)}
            """
        )
    )
    return by_subject, by_sender


def by_endpoint(spark, subjects: dict[str, str]) -> list[dict[str, Any]]:
    """Every endpoint's copies by state and its latency percentiles; ``subjects`` names
    the registered ones (an endpoint no longer registered is shown by its hash)."""
    pcts = ", ".join(str(p) for p in PERCENTILES)
    rows = _rows(
        spark.sql(
            f"""
            SELECT endpoint, count(*) AS copies, count_if(state = 'done') AS done,
                   count_if(state = 'failed') AS failed, count_if(state = 'new') AS new,
                   count_if(state = 'claimed') AS claimed,
                   percentile(CASE WHEN state = 'done' THEN finished_at - stored_at END,
                              array({pcts})) AS latency
            FROM messages GROUP BY endpoint ORDER BY copies DESC, endpoint
            """
        )
    )
    for row in rows:
        row["subject"] = subjects.get(row["endpoint"], row["endpoint"])
        row.update(_percentiles(row.pop("latency")))
    return rows


def latency(spark) -> dict[str, Any]:
    """Stored -> done of every done copy: count, mean, min, max, exact percentiles, and
    a histogram with `HISTOGRAM_STEPS` bins per power of ten (below 1 ms: one bin)."""
    pcts = ", ".join(str(p) for p in PERCENTILES)
    lat = spark.sql(
        f"""
        SELECT count(*) AS count, avg(l) AS mean, max(l) AS max, min(l) AS min,
               percentile(l, array({pcts})) AS p
        FROM (SELECT finished_at - stored_at AS l FROM messages WHERE state = 'done')
        """
    ).first()
    doc = {"count": lat["count"], "mean": lat["mean"], "min": lat["min"], "max": lat["max"]}
    doc.update(_percentiles(lat["p"]))
    histogram = _rows(
        spark.sql(
            f"""
            SELECT CASE WHEN l < 1 THEN -1 ELSE floor(log10(l) * {HISTOGRAM_STEPS}) END AS bin,
                   count(*) AS count
            FROM (SELECT finished_at - stored_at AS l FROM messages WHERE state = 'done')
            GROUP BY 1 ORDER BY 1
            """
        )
    )
    doc["histogram"] = [
        {
            "fromMs": 0.0 if h["bin"] < 0 else 10 ** (h["bin"] / HISTOGRAM_STEPS),
            "toMs": 1.0 if h["bin"] < 0 else 10 ** ((h["bin"] + 1) / HISTOGRAM_STEPS),
            "count": h["count"],
        }
        for h in histogram
    ]
    return doc


def dead_letters(spark, top: int) -> dict[str, list[dict[str, Any]]]:
    """Dead letters by code, the ``top`` (code, reason) pairs, and by endpoint and code."""
    by_code = _rows(
        spark.sql(
            "SELECT reason_code AS code, count(*) AS count FROM messages WHERE state = 'failed' "
            "GROUP BY reason_code ORDER BY count DESC, code"
        )
    )
    top_reasons = _rows(
        spark.sql(
            f"""
            SELECT reason_code AS code, reason, count(*) AS count FROM messages
            WHERE state = 'failed' GROUP BY reason_code, reason
            ORDER BY count DESC, code, reason LIMIT {int(top)}
            """
        )
    )
    dead_by_endpoint = _rows(
        spark.sql(
            "SELECT endpoint, reason_code AS code, count(*) AS count FROM messages "
            "WHERE state = 'failed' GROUP BY endpoint, reason_code ORDER BY count DESC"
        )
    )
    return {"byCode": by_code, "topReasons": top_reasons, "byEndpoint": dead_by_endpoint}


def rejections(spark, dead_by_code: list[dict[str, Any]], width: int, top: int) -> dict:
    """Every rejection of a publish by reason: the router's refusals (nothing stored) and
    the dead letters made at publish time (``dead_by_code``, by `PUBLISH_CODES`); the
    router's by endpoint (the ``top``) and per bucket of ``width`` ms."""
    router = {
        r["reason"]: r["count"]
        for r in _rows(
            spark.sql("SELECT reason, sum(count) AS count FROM rejections GROUP BY reason")
        )
    }
    by_reason = [
        {"reason": reason, "category": reason, "source": "router", "count": int(n)}
        for reason, n in sorted(router.items())
    ]
    for row in dead_by_code:
        if row["code"] in PUBLISH_CODES:
            by_reason.append(
                {
                    "reason": row["code"],
                    "category": PUBLISH_CODES[row["code"]],
                    "source": "dead_letter",
                    "count": row["count"],
                }
            )
    by_reason.sort(key=lambda r: (-r["count"], r["reason"]))
    rejections_by_endpoint = _rows(
        spark.sql(
            "SELECT reason, endpoint, sum(count) AS count FROM rejections "
            f"GROUP BY reason, endpoint ORDER BY count DESC LIMIT {int(top)}"
        )
    )
    over_time = _rows(
        spark.sql(
            f"SELECT floor(minute / {width}) * {width} AS bucket, reason, sum(count) AS count "
            "FROM rejections GROUP BY 1, 2 ORDER BY 1, 2"
        )
    )
    for row in over_time:
        row["bucket"] = int(row["bucket"])
    return {
        "total": sum(r["count"] for r in by_reason),
        "byReason": by_reason,
        "byEndpoint": rejections_by_endpoint,
        "overTime": over_time,
    }


def depth(spark, subjects: dict[str, str], now: int) -> list[dict[str, Any]]:
    """Each endpoint now (``live`` only): waiting in new/, claimed, the oldest waiting's
    age at ``now``; every registered endpoint (``subjects``) is listed, even empty."""
    depth_rows = {
        r["endpoint"]: r
        for r in _rows(
            spark.sql(
                "SELECT endpoint, count_if(state = 'new') AS waiting, "
                "count_if(state = 'claimed') AS claimed, "
                "min(CASE WHEN state = 'new' THEN stored_at END) AS oldest_waiting "
                "FROM live GROUP BY endpoint"
            )
        )
    }
    rows = []
    for endpoint in sorted(set(subjects) | {e for e in depth_rows if e != UNROUTABLE}):
        row = depth_rows.get(endpoint, {"waiting": 0, "claimed": 0, "oldest_waiting": None})
        oldest = row["oldest_waiting"]
        rows.append(
            {
                "endpoint": endpoint,
                "subject": subjects.get(endpoint, endpoint),
                "waiting": row["waiting"],
                "claimed": row["claimed"],
                "oldestWaitingAgeMs": None if oldest is None else max(0, now - oldest),
            }
        )
    rows.sort(key=lambda d: (-d["waiting"], d["subject"]))
    return rows


def _percentiles(values: list[float] | None) -> dict[str, float | None]:
    names = [f"p{round(p * 100)}" for p in PERCENTILES]
    if values is None:
        return dict.fromkeys(names)
    return dict(zip(names, values, strict=True))


def _rejections_frame(spark, home: Home, archive: Archive):
    keys = ["minute", "reason", "endpoint", "sender"]
    live = spark.createDataFrame(
        rows_table(read_rejections(home), REJECTION_SCHEMA),
        schema=_spark_schema(spark, REJECTION_SCHEMA),
    )
    archived = archive.read(REJECTIONS)
    if archived is None:
        return live
    # A key in both was archived by a run killed before it deleted the rows: same count.
    return live.unionByName(archived.select(*keys, "count")).dropDuplicates(keys)


# ---------------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--archive", help="archive URI or path (default $RELAY_HOME/archive)")
    parser.add_argument("--master", help="Spark master (default local[*])")
    parser.add_argument(
        "--out", help="directory for the JSON and HTML (default $RELAY_HOME/reports)"
    )
    parser.add_argument(
        "--bucket",
        choices=["auto", *BUCKETS_MS],
        default="auto",
        help="time bucket of the volume series (default: by the data's span)",
    )
    parser.add_argument("--top", type=int, default=50, help="rows of the by-subject/sender tables")
    parser.add_argument("--json", action="store_true", help="also print the JSON document")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def write_outputs(doc: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    from ops.report import render_html

    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = datetime.fromtimestamp(doc["generatedAt"] / 1000, UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path = out_dir / f"metrics-{stamp}.json"
    html_path = out_dir / f"metrics-{stamp}.html"
    # 0600: the report names senders and endpoints, like the mail it counts
    write_private(json_path, json.dumps(doc, indent=1))
    write_private(html_path, render_html(doc))
    return json_path, html_path


def run(args: argparse.Namespace) -> int:
    from ops.spark_session import spark_session

    home = Home(args.home)
    progress = Progress(enabled=not args.quiet)
    progress.update("spark")
    spark = spark_session(args.master, "relay-ops-metrics")
    doc = collect(spark, home, args.archive, bucket=args.bucket, top=args.top, progress=progress)
    json_path, html_path = write_outputs(doc, Path(args.out) if args.out else home.root / "reports")
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        t = doc["totals"]
        lat = doc["latency"]
        print(
            f"metrics over {t['copies']:,} copies ({doc['sources']['archived']:,} archived) "
            f"in {doc['seconds']:.1f} s; latency p50 {_fmt_ms(lat['p50'])}, "
            f"p99 {_fmt_ms(lat['p99'])}"
        )
        print(f"  JSON  {json_path}\n  HTML  {html_path}")
    return 0


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="metrics.py", description=__doc__.split("\n")[0])
    parser.add_argument("--home", default=None, help="data directory (default $RELAY_HOME)")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
