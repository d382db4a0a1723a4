"""Which Python functions still run interpreted on the SDK's handler-row paths, and how
often: the functions mypyc did not compile (sdk/compiled.py), the standard library's
(queue, threading, concurrent.futures, json) and the bench's own.

    python -m bench.sdk_frames [--path publish_async|consume] [--count N] [--rate R]

Runs the workloads of bench/sdk_instructions.py against its stand-ins (no broker, no
disk), natively, with a profile hook on every thread of the client (set before the
client starts them) that counts each Python frame entered while the count is on. A
compiled function enters no frame: what is counted is exactly what runs interpreted.
Prints one JSON line: frames per message, and the commonest, per thread, as
"file:function [thread]". Run with ``RELAY_PURE=1`` to see the whole path. A
measurement: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from bench import sdk_instructions


class FrameCount:
    """A profile hook counting the frames entered while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.frames: Counter[str] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.on and event == "call":
            code = frame.f_code
            where = f"{Path(code.co_filename).name}:{code.co_name}"
            self.frames[f"{where} [{threading.current_thread().name}]"] += 1


def counted(count: FrameCount, run: sdk_instructions.Runner) -> None:
    count.on = True
    try:
        run()
    finally:
        count.on = False


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sdk_frames", description=__doc__)
    parser.add_argument("--path", choices=("publish_async", "consume"), default="consume")
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    count = FrameCount()
    threading.setprofile(count)  # every thread the client starts from here on
    sys.setprofile(count)
    sdk_instructions.workload(args.path, args.count, args.rate, lambda run: counted(count, run))
    sys.setprofile(None)
    threading.setprofile(None)
    figures = {
        "path": args.path,
        "count": args.count,
        "frames_per_message": round(sum(count.frames.values()) / args.count, 2),
        "commonest": {k: round(v / args.count, 2) for k, v in count.frames.most_common(args.top)},
    }
    print(json.dumps(figures, indent=1), flush=True)


if __name__ == "__main__":
    main()
