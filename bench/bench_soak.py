"""A soak: a 2-shard broker under a steady offered load for minutes, watching the
router's memory and counting what the consumer received.

One publisher offers ``RATE`` msg/s (paced by a monotonic clock: publish n is due at
start + n / RATE, so a slow moment is caught up rather than lost) to 4 endpoints spread
over the shards, for ``seconds`` (default 600: the issue asks for a 10-minute soak); a
second client consumes every endpoint and acknowledges each message (the SDK acks when
the handler returns). The rate limit is disabled so the offered rate is what reaches the
broker. The router's VmRSS is sampled every 10 s.

Rows: router RSS at the first sample after a 30 s warm-up, at the last sample, the drift
between them (goal within ±10 %), the achieved publish rate (publishes the broker
confirmed stored, per second of publishing), and the messages lost (confirmed publishes
the consumer never received after a drain wait; goal 0). Progress goes to stderr every
60 s. There is one run, not interleaved rounds: a soak is about time, not a median.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from bench.common import Row, base_dir, rate, remove_when_done, rss_mib, stop_broker
from bench.workload import PAYLOAD, SENDER, SUBJECT, spread_subjects

SHARDS = 2
ENDPOINTS = 4
RATE = 500  # offered msg/s
SECONDS = 600.0  # default soak length
SAMPLE_EVERY = 10.0  # s between router VmRSS samples
WARMUP = 30.0  # s: the first sample counted is the first one at or after this
PROGRESS_EVERY = 60.0  # s between progress lines on stderr
DRIFT_GOAL = 10.0  # %, either way
MAX_IN_FLIGHT = 1000  # publishes awaiting an answer (the router allows 1024 per client)
DRAIN_IDLE = 30.0  # s without a new delivery before the drain wait gives up
DRAIN_MAX = 120.0  # s at most for the drain wait


def _log(text: str) -> None:
    print(f"soak: {text}", file=sys.stderr, flush=True)


class Soak:
    def __init__(self, seconds: float, offered: float) -> None:
        from tests.harness import Broker  # real processes, its own home

        self.seconds = seconds
        self.offered = offered
        self.base = base_dir()
        self.broker = Broker(shards=SHARDS, home=self.base / "home")
        self.lock = threading.Lock()
        self.sent = 0  # publish requests made
        self.confirmed = 0  # answered: stored on its endpoint
        self.failed = 0  # answered with an error or a rejection
        self.first_error = ""
        self.consumed: set[str] = set()  # message ids the handler saw (redeliveries once)
        self.samples: list[tuple[float, float]] = []  # (s since start, router RSS MiB)
        self.slots = threading.Semaphore(MAX_IN_FLIGHT)
        self.stop = threading.Event()

    # ------------------------------------------------------------------ pieces

    def _rss(self) -> float:
        return rss_mib(self.broker.procs["router"].pid)

    def _on_message(self, envelope: Any) -> None:
        with self.lock:
            self.consumed.add(envelope.id)

    def _on_done(self, future: Any) -> None:
        try:
            result = future.result()
            ok = result.delivered_to == 1 and not result.rejected
            error = "" if ok else f"not stored: {result}"
        except Exception as exc:
            ok, error = False, repr(exc)
        with self.lock:
            if ok:
                self.confirmed += 1
            else:
                self.failed += 1
                self.first_error = self.first_error or error
        self.slots.release()

    def _counts(self) -> tuple[int, int, int, int]:
        with self.lock:
            return self.sent, self.confirmed, self.failed, len(self.consumed)

    def _sampler(self, start: float) -> None:
        """Router VmRSS every SAMPLE_EVERY s (on the clock, not after a fixed sleep)."""
        n, last_progress = 0, 0.0
        while True:
            due = start + n * SAMPLE_EVERY
            if self.stop.wait(max(0.0, due - time.monotonic())):
                return
            elapsed = time.monotonic() - start
            rss = self._rss()
            self.samples.append((elapsed, rss))
            n += 1
            if elapsed - last_progress >= PROGRESS_EVERY - 1:
                last_progress = elapsed
                sent, confirmed, failed, consumed = self._counts()
                _log(
                    f"{elapsed:5.0f} s: sent {sent:,}, stored {confirmed:,}, failed {failed:,}, "
                    f"consumed {consumed:,}, {rate(confirmed, elapsed):,.0f} msg/s, "
                    f"router RSS {rss:.1f} MiB"
                )

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        self.broker.start()
        admin = self.broker.client(timeout=30)
        admin.set_config({"rateLimit": {"enabled": False}})
        endpoints = spread_subjects(ENDPOINTS, SHARDS)
        for subject in endpoints:
            admin.register_endpoint(subject)
        consumer = self.broker.client(timeout=30)
        consumer.subscribe(f"{SUBJECT}.*", self._on_message)
        publisher = self.broker.client(timeout=30)

        _log(
            f"{self.offered:g} msg/s to {ENDPOINTS} endpoints on {SHARDS} shards for "
            f"{self.seconds:g} s, router pid {self.broker.procs['router'].pid}"
        )
        start = time.monotonic()
        sampler = threading.Thread(target=self._sampler, args=(start,), daemon=True)
        sampler.start()
        try:
            count = int(self.seconds * self.offered)
            publish_async = publisher.publish_async
            for n in range(count):
                delay = start + n / self.offered - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.slots.acquire()
                with self.lock:
                    self.sent += 1
                payload = {**PAYLOAD, "n": n}
                future = publish_async(endpoints[n % ENDPOINTS], payload, sender=SENDER)
                future.add_done_callback(self._on_done)
            # Every publish answered (a slot each) before the clock stops.
            for _ in range(MAX_IN_FLIGHT):
                if not self.slots.acquire(timeout=60):
                    raise RuntimeError("publishes still unanswered 60 s after the last one")
            elapsed = time.monotonic() - start
        finally:
            self.stop.set()
            sampler.join(SAMPLE_EVERY + 5)
        if not self.samples or elapsed - self.samples[-1][0] > SAMPLE_EVERY / 2:
            self.samples.append((elapsed, self._rss()))

        # Drain: wait until the consumer has everything, or nothing new arrives for a while.
        drain_start = time.monotonic()
        seen, idle_since = -1, drain_start
        while True:
            _, confirmed, _, consumed = self._counts()
            now = time.monotonic()
            if consumed >= confirmed or now - drain_start > DRAIN_MAX:
                break
            if consumed != seen:
                seen, idle_since = consumed, now
            elif now - idle_since > DRAIN_IDLE:
                break
            time.sleep(0.1)
        sent, confirmed, failed, consumed = self._counts()
        _log(
            f"done: {elapsed:.0f} s publishing, sent {sent:,}, stored {confirmed:,}, "
            f"failed {failed:,}, consumed {consumed:,} after a "
            f"{time.monotonic() - drain_start:.1f} s drain"
        )
        if failed:
            _log(f"first failure: {self.first_error}")
        return {
            "elapsed": elapsed,
            "sent": sent,
            "confirmed": confirmed,
            "failed": failed,
            "consumed": consumed,
        }

    def cleanup(self) -> None:
        self.stop.set()
        try:
            stop_broker(self.broker)
        finally:
            remove_when_done(self.base)


# --------------------------------------------------------------------------- rows


def rows(rounds: int | None = None, seconds: float = SECONDS, offered: float = RATE) -> list[Row]:
    """One soak run; ``rounds`` is accepted for the harness and ignored."""
    del rounds
    soak = Soak(seconds, offered)
    try:
        got = soak.run()
    finally:
        soak.cleanup()
    return _table(got, soak.samples, seconds, offered)


def _table(
    got: dict[str, Any], samples: list[tuple[float, float]], seconds: float, offered: float
) -> list[Row]:
    warm = [s for s in samples if s[0] >= WARMUP - 0.5] or samples  # a short run: all
    (t_first, first), (t_last, last) = warm[0], warm[-1]
    drift = (last - first) / first * 100
    achieved = rate(got["confirmed"], got["elapsed"])
    lost = got["confirmed"] - got["consumed"]
    what = f"soak {seconds:g} s, {offered:g} msg/s"
    failed = f", {got['failed']:,} publishes failed" if got["failed"] else ""
    return [
        Row(
            f"{what}: router RSS, first sample after {WARMUP:g} s (t={t_first:.0f} s)", first, "MiB"
        ),
        Row(f"{what}: router RSS, last sample (t={t_last:.0f} s)", last, "MiB"),
        Row(
            f"{what}: router RSS drift, {len(warm)} samples",
            drift,
            "%",
            goal=f"within ±{DRIFT_GOAL:g} %",
            met=abs(drift) <= DRIFT_GOAL,
        ),
        Row(
            f"{what}: publish rate achieved{failed}",
            achieved,
            "msg/s",
            "offered",
            offered,
        ),
        Row(
            f"{what}: messages lost (stored - consumed)",
            lost,
            "msg",
            goal="0",
            met=lost == 0,
        ),
    ]


if __name__ == "__main__":
    for row in rows(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else SECONDS):
        print(f"{row.metric:<90} {row.relay:>10,.1f} {row.unit:<6} {row.goal}")
