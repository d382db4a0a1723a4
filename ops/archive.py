"""The Parquet archive: its layout, its row schema and its commit protocol.

Layout under the archive URI (default ``$RELAY_HOME/archive``; any Hadoop URI)::

    messages/day=YYYY-MM-DD/part-*.parquet     archived copies, by UTC day of finished_at
    rejections/day=YYYY-MM-DD/part-*.parquet   the router's rejection counts, by minute's day
    _staging/<batch>.<dataset>/...             a batch being written (invisible to readers:
                                               Spark skips paths starting with "_")
    _runs/<batch>.<dataset>.json               one manifest per committed batch

Commit protocol of one batch, and what a crash between two steps leaves
    1. Spark writes the batch into ``_staging/<batch>.<dataset>/``
                                                            [ops.compact.after_staging_write]
    2. the manifest ``_runs/<batch>.<dataset>.json`` lists its files, state "committing":
       THE COMMIT POINT                                     [ops.compact.after_manifest]
    3. each file is renamed into its ``<dataset>/day=...`` directory
    4. the manifest says "committed"; the staging directory is deleted
    5. (the caller) the live copies are removed           [ops.compact.after_commit, before]
    - crash before 2: a staging directory with no manifest. The next run deletes it; the
      rows are still live and are selected again. Nothing archived, nothing lost.
    - crash between 2 and 4: the next run finishes the renames (roll forward).
    - crash between 4 and 5: archived and still live. The next run selects them again,
      finds their (id, endpoint) in the archive (an anti-join over the days concerned),
      writes nothing for them and removes them: archived once, never lost.
Readers of ``messages/`` may see a batch half-moved during 3; metrics tolerate that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ops.hadoopfs import HadoopFS, to_uri
from workers.faults import fault_point

MESSAGES, REJECTIONS = "messages", "rejections"
KEYS = {MESSAGES: ("id", "endpoint"), REJECTIONS: ("minute", "reason", "endpoint", "sender")}

AFTER_STAGING_WRITE = "ops.compact.after_staging_write"
AFTER_MANIFEST = "ops.compact.after_manifest"
AFTER_COMMIT = "ops.compact.after_commit"

# The envelope fields the archive keeps as typed columns, parsed by Spark from the file.
ENVELOPE_SCHEMA = (
    "replyTo string, publishedTo string, "
    "budget struct<hopCount:int, maxHops:int, ancestorChain:array<string>, ttl:bigint, "
    "callBudgetRemaining:int>"
)

# Columns of messages/, in order (`day` is the partition directory).
MESSAGE_COLUMNS = (
    "id",
    "endpoint",
    "subject",
    "published_to",
    "sender",
    "reply_to",
    "budget",
    "state",
    "reason",
    "reason_code",
    "created_at",
    "stored_at",
    "claimed_at",
    "finished_at",
    "size",
    "envelope",
    "run_id",
    "archived_at",
    "day",
)


@dataclass(frozen=True)
class Committed:
    rows: int
    files: int
    days: tuple[str, ...]


class Archive:
    def __init__(self, spark, location: str) -> None:
        self.spark = spark
        self.uri = to_uri(location)
        self.fs = HadoopFS(spark, self.uri)

    def path(self, *parts: str) -> str:
        return "/".join((self.uri, *parts))

    def days(self, dataset: str) -> set[str]:
        """The day partitions a dataset has."""
        return {
            name.removeprefix("day=")
            for name, is_dir in self.fs.list_dir(self.path(dataset))
            if is_dir and name.startswith("day=")
        }

    def read(self, dataset: str, days: set[str] | None = None):
        """The dataset as a DataFrame (only the given days, when given), or None when
        there is nothing to read."""
        present = self.days(dataset)
        wanted = sorted(present if days is None else present & set(days))
        if not wanted:
            return None
        root = self.path(dataset)
        return self.spark.read.option("basePath", root).parquet(
            *(f"{root}/day={day}" for day in wanted)
        )

    def new_rows(self, df, dataset: str, days: set[str]):
        """``df`` less the rows whose key the archive holds already (in those days)."""
        existing = self.read(dataset, days)
        if existing is None:
            return df
        keys = list(KEYS[dataset])
        return df.join(existing.select(*keys), keys, "left_anti")

    # ------------------------------------------------------------------ commit protocol

    def commit(self, df, dataset: str, batch: str) -> Committed:
        """Write ``df`` (with a ``day`` column) as one batch; see the module docstring."""
        staging = self.path("_staging", f"{batch}.{dataset}")
        manifest_path = self.path("_runs", f"{batch}.{dataset}.json")
        df.write.mode("overwrite").partitionBy("day").parquet(staging)
        fault_point(AFTER_STAGING_WRITE)
        files = self.fs.list_files(staging)
        if not files:
            self.fs.delete(staging)
            return Committed(0, 0, ())
        rows = self.spark.read.parquet(staging).count()  # from the footers
        days = tuple(sorted({f.split("/")[0].removeprefix("day=") for f in files}))
        manifest = {
            "batch": batch,
            "dataset": dataset,
            "state": "committing",
            "rows": rows,
            "days": list(days),
            "files": files,
            "createdAt": int(time.time() * 1000),
        }
        self.fs.write_json(manifest_path, manifest)
        fault_point(AFTER_MANIFEST)
        self._move(staging, dataset, files)
        manifest["state"] = "committed"
        manifest["committedAt"] = int(time.time() * 1000)
        self.fs.write_json(manifest_path, manifest)
        self.fs.delete(staging)
        return Committed(rows, len(files), days)

    def _move(self, staging: str, dataset: str, files: list[str]) -> None:
        made: set[str] = set()
        for rel in files:
            src, dst = f"{staging}/{rel}", self.path(dataset, rel)
            if not self.fs.exists(src):
                continue  # moved by an earlier attempt
            parent = dst.rsplit("/", 1)[0]
            if parent not in made:
                self.fs.mkdirs(parent)
                made.add(parent)
            if self.fs.exists(dst):
                self.fs.delete(src)  # a copy-based rename (s3a) finished its copy
            elif not self.fs.rename(src, dst):
                raise OSError(f"could not move {src} to {dst}")

    def recover(self) -> dict[str, int]:
        """Settle what an earlier, killed run left in ``_staging/``: discard uncommitted
        batches, finish committed ones. Returns {"discarded": n, "completed": n}."""
        discarded = completed = 0
        for name, is_dir in self.fs.list_dir(self.path("_staging")):
            if not is_dir:
                continue
            staging = self.path("_staging", name)
            manifest_path = self.path("_runs", f"{name}.json")
            manifest = self.fs.read_json(manifest_path)
            if manifest is None:
                self.fs.delete(staging)
                discarded += 1
                continue
            if manifest.get("state") == "committing":
                self._move(staging, manifest["dataset"], manifest["files"])
                manifest["state"] = "committed"
                manifest["committedAt"] = int(time.time() * 1000)
                self.fs.write_json(manifest_path, manifest)
                completed += 1
            self.fs.delete(staging)
        return {"discarded": discarded, "completed": completed}

    def manifests(self) -> list[dict]:
        """Every batch manifest, oldest first."""
        found = []
        for name, is_dir in self.fs.list_dir(self.path("_runs")):
            if not is_dir and name.endswith(".json"):
                manifest = self.fs.read_json(self.path("_runs", name))
                if manifest is not None:
                    found.append(manifest)
        return sorted(found, key=lambda m: m.get("batch", ""))
