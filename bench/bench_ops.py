"""Ops on Spark: compaction throughput and the metrics report, each beside a
pyarrow-only floor (issue 5, "Measure").

- compaction: ``ops.compact.compact`` (local removal, no broker) over N finished copies
  (90 % done, 10 % dead letters, 8 endpoints, 2 shards, ~30 day partitions), at three
  sizes. The data is written straight to disk (one ``os.write`` per file into cur/ or
  failed/, index rows bulk-loaded with ``MessageIndex.rebuild_rows``), not through a
  broker. Beside it, the floor: the same rows (index columns + the file bytes, held in
  memory) made into an Arrow table and written day-partitioned, zstd, by pyarrow alone.
  The session is started once and warmed on a small run first (its start and the first
  run's JVM warm-up are rows of their own: a real ``relay ops compact`` pays both).
- metrics: ``ops.metrics.collect`` over N archived rows written directly as Parquet in the
  archive's schema (pyarrow, vectorised; not through compaction), at three sizes up to
  10 M, beside the floor: a pyarrow-only scan of the same files computing the same
  aggregates (totals, distinct ids, volume per day, by subject/sender/endpoint, exact
  latency percentiles and histogram, dead letters by code and reason).

Every data set lives in a fresh temp directory on the real disk ($RELAY_BENCH_DIR, else
/work) and is deleted right after its figure. Linearity is judged by the ratio of the
throughputs of the largest and the smallest size (1.0 = linear; goal >= 0.8).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bench.common import Row, fs_type, rate, remove_when_done
from ops.archive import MESSAGE_COLUMNS
from ops.live import FILE_SCHEMA, rows_table
from sdk.paths import Home, shard_of
from sdk.subjects import endpoint_hash
from workers.index import MessageIndex
from workers.index_sql import COLUMNS
from workers.maildir import Mailbox

DAY_MS = 86_400_000
NOW = 1_795_000_000_000
ENDPOINTS = 8
SHARDS = 2
SENDERS = ("relay.agent.bench.frontend", "relay.agent.bench.planner", "relay.human.console")
DEAD = (
    ("nack", "handler raised ValueError: bad input"),
    ("nack", "handler raised TimeoutError"),
    ("ttl_expired", "ttl expired"),
    ("hop_limit", "max hops exceeded (5/5)"),
    ("access_denied", "access denied by rule > -> relay.agent.bench.>"),
)
COMPACT_SIZES = tuple(
    int(x) for x in os.environ.get("RELAY_BENCH_COMPACT", "100000,300000,1000000").split(",")
)
METRICS_SIZES = tuple(
    int(x) for x in os.environ.get("RELAY_BENCH_METRICS", "1000000,3000000,10000000").split(",")
)
WARMUP_COPIES = 20_000
GOAL_S = 120.0
LINEAR = 0.8  # throughput at the largest size / at the smallest, to call it linear
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_OPEN_NEW = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC


def bench_root(tag: str) -> Path:
    base = os.environ.get("RELAY_BENCH_DIR") or (
        "/work" if os.path.isdir("/work") else str(Path(__file__).parent.parent)
    )
    if fs_type(base) in ("tmpfs", "ramfs"):
        raise SystemExit(f"{base} is tmpfs: file creation and unlink costs would lie")
    return Path(tempfile.mkdtemp(prefix=f"relay-bench-ops-{tag}-", dir=base))


def subjects() -> list[str]:
    return [f"relay.agent.bench.worker{i}" for i in range(ENDPOINTS)]


def _ulid(ms: int, n: int) -> str:
    """A valid ULID string: 48-bit time, then ``n`` as the 80-bit 'random' part (unique,
    increasing with n, so ids sort in creation order)."""
    value = (ms << 80) | n
    return "".join(_CROCKFORD[(value >> s) & 31] for s in range(125, -1, -5))


def _span(n: int) -> tuple[int, int]:
    """(first created time, ms between copies): 30 days of history ending 8 days ago."""
    start = NOW - 38 * DAY_MS
    return start, max(1, (30 * DAY_MS) // max(n, 1))


# ---------------------------------------------------------------------- compaction data


def make_store(root: Path, n: int) -> tuple[Home, list[tuple]]:
    """A data directory with ``n`` finished copies; returns it and the rows (index
    columns + envelope text) that compaction should archive."""
    home = Home(root / "home").create()
    subs = subjects()
    hashes = [endpoint_hash(s) for s in subs]
    boxes = [Mailbox(home.mailbox(h), h) for h in hashes]
    for box in boxes:
        box.create()
    start, step = _span(n)
    rows: list[tuple] = []
    for i in range(n):
        e = i % ENDPOINTS
        created = start + i * step
        mid = _ulid(created, i)
        sender = SENDERS[i % 3]
        stored = created + 3
        claimed = stored + 20 + i % 50
        finished = claimed + 100 + i % 400
        subject = subs[e]
        failed = i % 10 == 9
        dead = ""
        if failed:
            code, reason = DEAD[i % len(DEAD)]
            dead = (
                f',"deadLetter":{{"reason":"{reason}","code":"{code}",'
                f'"failedAt":{finished},"endpoint":"{hashes[e]}"}}'
            )
        payload = f'{{"content":"message {i}","n":{i}}}' if i % 5 else f'"plain text {i}"'
        text = (
            f'{{"id":"{mid}","subject":"{subject}","from":"{sender}","replyTo":null,'
            f'"budget":{{"hopCount":1,"maxHops":5,"ancestorChain":["{subject}"],'
            f'"ttl":{created + 3_600_000},"callBudgetRemaining":9}},'
            f'"createdAt":{created},"payload":{payload}{dead}}}'
        )
        data = text.encode()
        if failed:
            path = f"{boxes[e].failed_dir}/{mid}"
            row = (mid, hashes[e], subject, sender, "failed", created, stored, None, finished)
            row += (reason, code, len(data), None, 0, text)  # no parent; dead, not handed out
        else:
            path = f"{boxes[e].cur_dir}/{mid},C={claimed},D={finished}:2,S"
            row = (mid, hashes[e], subject, sender, "done", created, stored, claimed, finished)
            row += (None, None, len(data), None, 1, text)  # no parent; handed out once
        fd = os.open(path, _OPEN_NEW, 0o600)
        os.write(fd, data)
        os.close(fd)
        rows.append(row)
    for shard in range(SHARDS):
        owned = [r[:-1] for r in rows if shard_of(r[1], SHARDS) == shard]
        with MessageIndex(home.index_db(shard)) as index:
            index.rebuild_rows(owned)
    os.sync()  # the files on disk, so that writeback does not land inside a figure
    return home, rows


def run_compact(spark, home: Home) -> tuple[float, object]:
    from ops.compact import CompactOptions, compact

    opts = CompactOptions(
        home=home, done_retention_ms=0, dead_retention_ms=0, removal="local", now_ms=NOW
    )
    t0 = time.perf_counter()
    summary = compact(spark, opts)
    return time.perf_counter() - t0, summary


def pyarrow_write_floor(rows: list[tuple], out: Path) -> float:
    """The same rows written day-partitioned, zstd, by pyarrow alone."""
    t0 = time.perf_counter()
    table = rows_table(rows, FILE_SCHEMA)
    day = pc.strftime(pc.cast(table["finished_at"], pa.timestamp("ms", "UTC")), "%Y-%m-%d")
    table = table.append_column("day", day)
    ds.write_dataset(
        table,
        out,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("day", pa.string())]), flavor="hive"),
        file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
        existing_data_behavior="overwrite_or_ignore",
    )
    return time.perf_counter() - t0


def compaction_figure(spark, n: int) -> dict:
    root = bench_root(f"compact{n}")
    try:
        t0 = time.perf_counter()
        home, rows = make_store(root, n)
        gen = time.perf_counter() - t0
        floor = pyarrow_write_floor(rows, root / "floor")
        del rows
        seconds, summary = run_compact(spark, home)
        assert summary.archived == n and summary.removed == n, summary
        return {"n": n, "seconds": seconds, "floor": floor, "generate": gen, "summary": summary}
    finally:
        remove_when_done(root)


# ---------------------------------------------------------------------- metrics data


def _ulid_array(ms: np.ndarray, seq: np.ndarray) -> pa.Array:
    """ULID strings for (time, sequence) pairs, vectorised."""
    alphabet = np.frombuffer(_CROCKFORD.encode(), dtype=np.uint8)
    n = len(ms)
    chars = np.empty((n, 26), dtype=np.uint8)
    t = ms.astype(np.uint64)
    for k in range(10):  # 48-bit time: 10 chars (the first holds 3 bits)
        chars[:, 9 - k] = alphabet[(t >> np.uint64(5 * k)) & np.uint64(31)]
    s = seq.astype(np.uint64)
    for k in range(16):  # 80-bit part: the sequence number, zero-padded
        chars[:, 25 - k] = alphabet[(s >> np.uint64(5 * k)) & np.uint64(31)] if k < 12 else 48
    offsets = np.arange(0, 26 * (n + 1), 26, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())]
    )


def archive_chunk(first: int, n: int, total: int, rng: np.random.Generator) -> pa.Table:
    """Rows ``first .. first + n`` of ``total`` archived copies, in the archive's schema
    (``day`` included; it becomes the partition directory)."""
    subs = subjects()
    hashes = [endpoint_hash(s) for s in subs]
    i = np.arange(first, first + n, dtype=np.int64)
    start = NOW - 68 * DAY_MS  # 60 days of history, all of it past retention
    created = start + (i * (60 * DAY_MS)) // total
    msg = np.where(i % 10 == 1, i - 1, i)  # 10 % of messages fan out to a second endpoint
    ep = i % ENDPOINTS
    stored = created + rng.integers(0, 40, n)
    claimed = stored + rng.lognormal(3, 1.5, n).astype(np.int64)
    finished = claimed + rng.lognormal(5, 1.2, n).astype(np.int64)
    failed = rng.random(n) < 0.15
    code_ix = rng.integers(0, len(DEAD), n)
    ids = _ulid_array(created, msg)
    endpoint = pa.DictionaryArray.from_arrays(pa.array(ep, pa.int32()), hashes).cast(pa.string())
    subject = pa.DictionaryArray.from_arrays(pa.array(ep, pa.int32()), subs).cast(pa.string())
    sender = pa.DictionaryArray.from_arrays(
        pa.array(rng.integers(0, 3, n), pa.int32()), list(SENDERS)
    ).cast(pa.string())
    state = pa.array(np.where(failed, "failed", "done"))
    mask = pa.array(~failed)
    reason = pc.if_else(mask, None, pa.array([DEAD[c][1] for c in range(len(DEAD))]).take(code_ix))
    reason_code = pc.if_else(
        mask, None, pa.array([DEAD[c][0] for c in range(len(DEAD))]).take(code_ix)
    )
    claimed_at = pc.if_else(mask, pa.array(claimed), None)
    created_a, finished_a = pa.array(created), pa.array(finished)
    ttl = pa.array(created + 3_600_000)
    budget = pa.StructArray.from_arrays(
        [
            pa.array(np.ones(n, np.int32)),
            pa.array(np.full(n, 5, np.int32)),
            pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), subject),
            ttl,
            pa.array(np.full(n, 9, np.int32)),
        ],
        names=["hopCount", "maxHops", "ancestorChain", "ttl", "callBudgetRemaining"],
    )
    s = pc.cast
    envelope = pc.binary_join_element_wise(
        '{"id":"',
        ids,
        '","subject":"',
        subject,
        '","from":"',
        sender,
        '","replyTo":null,"budget":{"hopCount":1,"maxHops":5,"ancestorChain":["',
        subject,
        '"],"ttl":',
        s(ttl, pa.string()),
        ',"callBudgetRemaining":9},"createdAt":',
        s(created_a, pa.string()),
        ',"payload":{"content":"message ',
        s(pa.array(i), pa.string()),
        '"}}',
        "",
    )
    size = pc.binary_length(envelope).cast(pa.int64())
    day = pc.strftime(pc.cast(finished_a, pa.timestamp("ms", "UTC")), "%Y-%m-%d")
    columns = {
        "id": ids,
        "endpoint": endpoint,
        "subject": subject,
        "published_to": subject,
        "sender": sender,
        "reply_to": pa.nulls(n, pa.string()),
        "budget": budget,
        "state": state,
        "reason": reason,
        "reason_code": reason_code,
        "created_at": created_a,
        "stored_at": pa.array(stored),
        "claimed_at": claimed_at,
        "finished_at": finished_a,
        "size": size,
        "envelope": envelope,
        "run_id": pa.array(np.full(n, "bench-run")),
        "archived_at": pa.array(np.full(n, NOW, np.int64)),
        "day": day,
    }
    assert tuple(columns) == MESSAGE_COLUMNS
    return pa.table(columns)


def make_archive(root: Path, n: int, chunk: int = 1_000_000) -> Path:
    """An archive with ``n`` rows in messages/day=.../part-*.parquet; returns its path."""
    archive = root / "archive"
    rng = np.random.default_rng(7)
    for k, first in enumerate(range(0, n, chunk)):
        table = archive_chunk(first, min(chunk, n - first), n, rng)
        ds.write_dataset(
            table,
            archive / "messages",
            format="parquet",
            basename_template=f"part-{k:05d}-{{i}}.parquet",
            partitioning=ds.partitioning(pa.schema([("day", pa.string())]), flavor="hive"),
            file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
            existing_data_behavior="overwrite_or_ignore",
        )
    return archive


def pyarrow_metrics_floor(archive: Path) -> tuple[float, dict]:
    """The report's aggregates over the archive, by pyarrow alone."""
    t0 = time.perf_counter()
    dataset = ds.dataset(
        archive / "messages",
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("day", pa.string())]), flavor="hive"),
    )
    # The index columns the archive keeps (it has no parent_id or deliveries).
    t = dataset.to_table(columns=[c for c in COLUMNS if c in MESSAGE_COLUMNS])
    out: dict = {"copies": t.num_rows, "messages": pc.count_distinct(t["id"]).as_py()}
    out["bytes"] = pc.sum(t["size"]).as_py()
    out["byState"] = t.group_by("state").aggregate([("id", "count")]).to_pylist()
    bucket = pc.multiply(pc.divide(t["created_at"], DAY_MS), DAY_MS)
    v = pa.table({"bucket": bucket, "id": t["id"], "state": t["state"]})
    out["volume"] = v.group_by(["bucket", "state"]).aggregate(
        [("id", "count"), ("id", "count_distinct")]
    )
    for key in ("subject", "sender", "endpoint"):
        out[key] = t.group_by([key, "state"]).aggregate([("id", "count"), ("id", "count_distinct")])
    done = t.filter(pc.equal(t["state"], "done"))
    lat = pc.subtract(done["finished_at"], done["stored_at"])
    out["latency"] = pc.quantile(lat, q=[0.5, 0.95, 0.99]).to_pylist()
    out["mean"] = pc.mean(lat).as_py()
    per_ep = pa.table({"endpoint": done["endpoint"], "l": lat})
    out["latency_ep"] = per_ep.group_by("endpoint").aggregate([("l", "tdigest")])
    logs = pc.floor(pc.multiply(pc.log10(pc.max_element_wise(lat, 1)), 4))
    out["histogram"] = pa.table({"b": logs}).group_by("b").aggregate([("b", "count")])
    dead = t.filter(pc.equal(t["state"], "failed"))
    out["dead"] = dead.group_by(["endpoint", "reason_code", "reason"]).aggregate([("id", "count")])
    return time.perf_counter() - t0, out


def metrics_figure(spark, n: int) -> dict:
    from ops.metrics import collect

    root = bench_root(f"metrics{n}")
    try:
        t0 = time.perf_counter()
        archive = make_archive(root, n)
        gen = time.perf_counter() - t0
        floor, floor_doc = pyarrow_metrics_floor(archive)
        home = Home(root / "home").create()
        t0 = time.perf_counter()
        doc = collect(spark, home, os.fspath(archive), now_ms=NOW)
        seconds = time.perf_counter() - t0
        assert doc["totals"]["copies"] == n == floor_doc["copies"], doc["totals"]
        assert doc["totals"]["messages"] == floor_doc["messages"]
        return {"n": n, "seconds": seconds, "floor": floor, "generate": gen}
    finally:
        remove_when_done(root)


# ---------------------------------------------------------------------- the rows


def _median(figures: list[dict]) -> dict:
    figures = sorted(figures, key=lambda f: f["seconds"])
    return figures[len(figures) // 2]


def _size(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}k"


def rows(rounds: int = 1) -> list[Row]:
    from ops.spark_session import spark_session

    t0 = time.perf_counter()
    spark = spark_session(None, "relay-bench-ops")
    start = time.perf_counter() - t0
    out = [Row("ops: local[*] SparkSession start", start, "s")]

    # A first, small compaction pays the JVM warm-up (a real run pays it too).
    cold = compaction_figure(spark, WARMUP_COPIES)
    warm = compaction_figure(spark, WARMUP_COPIES)
    warmup = max(0.0, cold["seconds"] - warm["seconds"])
    out.append(
        Row(
            f"ops compact {_size(WARMUP_COPIES)}: first run of a session (JVM warm-up "
            f"{warmup:.1f} s more than warm)",
            cold["seconds"],
            "s",
            "warm run",
            warm["seconds"],
        )
    )

    figures = []
    for n in COMPACT_SIZES:
        f = _median([compaction_figure(spark, n) for _ in range(rounds)])
        figures.append(f)
        s = f["summary"]
        print(
            f"  compact {n:,}: {f['seconds']:.1f} s (floor {f['floor']:.1f} s, generate "
            f"{f['generate']:.1f} s, {s.batches} batches)",
            flush=True,
        )
        big = n == max(COMPACT_SIZES)
        goal_s = GOAL_S * n / 1_000_000
        total = f["seconds"] + warmup
        out.append(
            Row(
                f"ops compact {_size(n)} copies, seconds (warm; +{warmup:.0f} s warm-up cold)",
                f["seconds"],
                "s",
                "pyarrow write",
                f["floor"],
                f"<= {goal_s:.0f} s (2 min per 1M)" if big else "",
                (total <= goal_s) if big else None,
            )
        )
        out.append(
            Row(
                f"ops compact {_size(n)} copies, throughput",
                rate(n, f["seconds"]),
                "copies/s",
                "pyarrow write",
                rate(n, f["floor"]),
            )
        )
    if max(COMPACT_SIZES) < 1_000_000:
        f = max(figures, key=lambda f: f["n"])
        est = 1_000_000 / rate(f["n"], f["seconds"]) + warmup
        out.append(
            Row(
                f"ops compact 1M EXTRAPOLATED from {_size(f['n'])} (+warm-up)",
                est,
                "s",
                goal="<= 120 s",
                met=est <= GOAL_S,
            )
        )
    out.append(_linearity("ops compact", figures))

    figures = []
    for n in METRICS_SIZES:
        try:
            f = _median([metrics_figure(spark, n) for _ in range(rounds)])
        except Exception as exc:  # e.g. the driver heap too small for this size
            name = type(exc).__name__
            out.append(Row(f"ops metrics {_size(n)} FAILED ({name})", float("nan"), "s", met=False))
            break
        figures.append(f)
        print(
            f"  metrics {n:,}: {f['seconds']:.1f} s (floor {f['floor']:.1f} s, generate "
            f"{f['generate']:.1f} s)",
            flush=True,
        )
        big = n == max(METRICS_SIZES)
        goal_s = GOAL_S * n / 10_000_000
        out.append(
            Row(
                f"ops metrics {_size(n)} archived rows, seconds",
                f["seconds"],
                "s",
                "pyarrow scan+agg",
                f["floor"],
                f"<= {goal_s:.0f} s (2 min per 10M)" if big else "",
                (f["seconds"] <= goal_s) if big else None,
            )
        )
        out.append(
            Row(
                f"ops metrics {_size(n)} archived rows, throughput",
                rate(n, f["seconds"]),
                "rows/s",
                "pyarrow scan+agg",
                rate(n, f["floor"]),
            )
        )
    if max(METRICS_SIZES) < 10_000_000:
        f = max(figures, key=lambda f: f["n"])
        est = 10_000_000 / rate(f["n"], f["seconds"])
        out.append(
            Row(
                f"ops metrics 10M EXTRAPOLATED from {_size(f['n'])}",
                est,
                "s",
                goal="<= 120 s",
                met=est <= GOAL_S,
            )
        )
    if len(figures) > 1:
        out.append(_linearity("ops metrics", figures))
    return out


def _linearity(name: str, figures: list[dict]) -> Row:
    small, big = figures[0], figures[-1]
    ratio = rate(big["n"], big["seconds"]) / rate(small["n"], small["seconds"])
    return Row(
        f"{name}: throughput {_size(big['n'])} / {_size(small['n'])} (linear = 1.0)",
        ratio,
        "x",
        goal=f">= {LINEAR}",
        met=ratio >= LINEAR,
    )
