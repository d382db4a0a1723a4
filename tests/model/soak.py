"""`make soak`: run the model test (tests/test_model_delivery.py) for long.

Rounds of pytest, each with its own seed, one after the other (JOBS at once), until
DURATION seconds passed (default 600) or STEPS steps ran. Each round runs
RELAY_MODEL_EXAMPLES sequences (default 10) of up to RELAY_MODEL_STEPS steps (default
40), explores only (phases generate and shrink: a failure saved in .hypothesis/ by an
earlier round is not replayed by every later one, but plain `pytest` replays it), and
writes its log to .hypothesis/relay-model/soak/. At the end: how many sequences and
steps ran, what they exercised of the consumer's contract (hand-outs, hand-outs again,
fetched messages, answers refused, max_deliveries dead letters), and each failure with
its seed, first line, log and replay command.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".hypothesis" / "relay-model" / "soak"


def run_round(number: int, stats: Path) -> dict:
    seed = random.getrandbits(32)
    env = {
        "RELAY_MODEL_EXAMPLES": "10",
        "RELAY_MODEL_STEPS": "40",
        "RELAY_MODEL_PHASES": "generate,shrink",
        "RELAY_MODEL_TIMEOUT": "7200",
        **os.environ,
        "RELAY_MODEL_SEED": str(seed),
        "RELAY_MODEL_STATS": str(stats),
    }
    log = OUT / f"round-{number}-seed-{seed}.log"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q"]
    with open(log, "wb") as out:
        code = subprocess.call(
            [*cmd, "tests/test_model_delivery.py"], cwd=ROOT, env=env, stdout=out, stderr=out
        )
    failure = None
    if code != 0:
        failure = {"seed": seed, "what": summary(log) or f"pytest exited {code}", "log": str(log)}
    return {"failure": failure, "env": {k: env[k] for k in env if k.startswith("RELAY_MODEL_")}}


def summary(log: Path) -> str:
    """The first finding of a failed round: the line after "AssertionError: ..." (the
    model's first problem) with that line, or else the first error line."""
    lines = [ln.lstrip(" |E") for ln in log.read_text(errors="replace").splitlines()]
    for n, line in enumerate(lines):
        if line.startswith("AssertionError:"):
            return f"{line[16:].strip()} {lines[n + 1].strip() if n + 1 < len(lines) else ''}"
    return next((ln for ln in lines if "Error" in ln and ":" in ln), "")


def main() -> int:
    duration = float(os.environ.get("DURATION", "600"))
    max_steps = int(os.environ.get("STEPS", "0")) or None
    jobs = int(os.environ.get("JOBS", "1"))
    OUT.mkdir(parents=True, exist_ok=True)
    stats = OUT / f"stats-{os.getpid()}.jsonl"
    stats.unlink(missing_ok=True)
    started = time.monotonic()
    failures: list[dict] = []
    rounds = 0
    lock = threading.Lock()

    def totals() -> tuple[int, int]:
        records = (
            [json.loads(ln) for ln in stats.read_text().splitlines()] if stats.exists() else []
        )
        return sum(r["sequences"] for r in records), sum(r["steps"] for r in records)

    def more() -> bool:
        return time.monotonic() - started < duration and (
            max_steps is None or totals()[1] < max_steps
        )

    def worker() -> None:
        nonlocal rounds
        while more():
            with lock:
                rounds += 1
                number = rounds
            result = run_round(number, stats)
            sequences, steps = totals()
            state = "FAILED: " + result["failure"]["what"] if result["failure"] else "ok"
            print(f"soak round {number}: {state} (total {sequences} sequences, {steps} steps)")
            if result["failure"]:
                with lock:
                    failures.append({**result["failure"], "env": result["env"]})

    with ThreadPoolExecutor(jobs) as pool:
        for _ in range(jobs):
            pool.submit(worker)
    sequences, steps = totals()
    elapsed = time.monotonic() - started
    print(f"\nsoak: {sequences} sequences, {steps} steps in {rounds} rounds, {elapsed:.0f} s")
    events: dict[str, int] = {}
    for line in stats.read_text().splitlines() if stats.exists() else []:
        for name, count in json.loads(line).get("events", {}).items():
            events[name] = events.get(name, 0) + count
    print(f"seen: {events}")
    print(f"failures: {len(failures)}")
    for f in failures:
        knobs = " ".join(
            f"{k}={v}" for k, v in sorted(f["env"].items()) if k != "RELAY_MODEL_STATS"
        )
        print(f"- seed {f['seed']}: {f['what']}\n  log: {f['log']}")
        print(f"  replay: {knobs} .venv/bin/pytest -s tests/test_model_delivery.py")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
