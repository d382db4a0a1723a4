"""The path of one publish through the router: files entered, and climbs back up.

    python -m bench.publish_path [--tree DIR] [--windows N]

Runs the router of a source tree (default: this one; ``--tree`` another checkout, e.g. a
worktree of a85b487, the router before issue 16's split) in a thread of this process,
with two real writer processes running the same tree's code. A client registers an
endpoint and publishes a few warm-up messages; then, N times, a profiler on the router
thread only records the Python calls made while ONE publish with no subscriber goes
from request to PublishResult. It prints the method, the counts, every climb, and the
path in files. The tree runs as pure Python (``RELAY_PURE=1``): compiled, its units
make no Python calls to record. A measurement: nothing is asserted about the numbers.

How it counts (printed with the results):
- Recorded: ``sys.setprofile`` 'call' events on the router thread whose code lives in
  the tree's broker/, sdk/ or workers/. A call's caller is the nearest frame up the
  stack that is in those directories. A generator resumed after its first entry is not
  a new call (its resumes are counted apart). Not seen: C functions, code made at run
  time (a dataclass's ``__init__``, a NamedTuple's ``__new__``: file "<string>").
- The window opens at a pass boundary (the loop's ``poll``) before the request is sent
  and closes at the first boundary after the PublishResult arrived. Kept: the pass
  that read the request (``_drain_clients``) and the first later one that read a
  writer's report (``_drain``: the ``stored`` report, and the reply sent), without the
  timer's work in them (``_sweep``, ``flush_due``). Other passes (waiting, a client's
  heartbeat ping) are dropped.
- Files entered: calls whose callee's file is not its caller's. Distinct files: files
  of callers and callees. Climb: a call into a higher layer than the caller's. Layers,
  top down: 1 the loop (broker/router.py before the split, broker/router/loop.py
  after), 2 the rest of broker/router/, 3 the other broker/*.py, 4 sdk/ and workers/.
- A lambda or closure belongs to the file where it is written, so a callback defined
  in the loop and called from broker/publish.py is a climb to layer 1. A call back up
  inside one layer (a unit of broker/router/ calling an operation's closure) is not.
- The windows should agree (a heartbeat ping read in the same pass as the publish would
  add its calls); the most common sequence is reported.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import NamedTuple

SUBJECT, SENDER, SHARDS = "relay.agent.demo.a", "relay.agent.demo.cli", 2
TIMER = {"_sweep", "flush_due"}
RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class Call(NamedTuple):
    caller: str  # file, relative to the tree
    caller_func: str
    callee: str
    callee_func: str
    top: str  # the loop step (function called by serve) this call is under


def layer(path: str) -> int:
    if path in ("broker/router.py", "broker/router/loop.py"):
        return 1
    return 2 if path.startswith("broker/router/") else 3 if path.startswith("broker/") else 4


class Recorder:
    """The router thread's profile function: records calls in windows of whole passes."""

    def __init__(self, tree: Path, serve_code: object) -> None:
        self.tree, self.serve_code = tree, serve_code
        self.roots = tuple(f"{tree / d}{os.sep}" for d in ("broker", "sdk", "workers"))
        self.state = "idle"  # idle -> armed -> recording -> stopping -> idle
        self.opened, self.closed = threading.Event(), threading.Event()
        self.passes: list[list[Call]] = []
        self.entered: set[object] = set()  # generator frames already entered
        self.resumes: list[int] = []  # per pass

    def open(self) -> None:
        self.passes, self.entered, self.resumes = [], set(), []
        self.opened.clear(), self.closed.clear()
        self.state = "armed"
        assert self.opened.wait(5), "the router's loop did not come round"

    def close(self) -> None:
        self.state = "stopping"
        assert self.closed.wait(5), "the router's loop did not come round"
        self.entered = set()

    def profile(self, frame, event, _arg) -> None:  # sys.setprofile's signature
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "poll" and frame.f_back and frame.f_back.f_code is self.serve_code:
            if self.state == "armed":
                self.state = "recording"
                self.opened.set()
            elif self.state == "stopping":
                self.state = "idle"
                self.closed.set()
            if self.state == "recording":
                self.passes.append([])
                self.resumes.append(0)
            return
        if self.state not in ("recording", "stopping") or not self.in_repo(code):
            return
        if code.co_flags & RESUMABLE:
            if frame in self.entered:
                self.resumes[-1] += 1
                return
            self.entered.add(frame)
        caller = frame.f_back
        while caller is not None and not self.in_repo(caller.f_code):
            caller = caller.f_back
        if caller is None:  # entered from outside the tree: not a move between its files
            return
        top = frame
        while top.f_back is not None and top.f_back.f_code is not self.serve_code:
            top = top.f_back
        names = (caller.f_code.co_qualname, code.co_qualname, top.f_code.co_name)
        self.passes[-1].append(Call(self.rel(caller.f_code), names[0], self.rel(code), *names[1:]))

    def in_repo(self, code) -> bool:
        return code.co_filename.startswith(self.roots)

    def rel(self, code) -> str:
        return Path(code.co_filename).relative_to(self.tree).as_posix()

    def kept(self) -> tuple[tuple[tuple[str, tuple[Call, ...]], ...], int]:
        """The pass that read the request, then the first that read a writer's report;
        and the generator resumes in them."""
        out, resumes, want = [], 0, "_drain_clients"
        for calls, resumed in zip(self.passes, self.resumes, strict=True):
            if want in {c.top for c in calls}:
                kind = "request" if want == "_drain_clients" else "report"
                out.append((kind, tuple(c for c in calls if c.top not in TIMER)))
                resumes += resumed
                if kind == "report":
                    return tuple(out), resumes
                want = "_drain"
        raise AssertionError("no request and report passes in the window")


def counts(calls: list[Call]) -> tuple[int, int, int, int]:
    entered = sum(c.callee != c.caller for c in calls)
    files = len({c.caller for c in calls} | {c.callee for c in calls})
    climbs = sum(layer(c.callee) < layer(c.caller) for c in calls)
    return len(calls), entered, files, climbs


def report(tree: Path, windows: list[tuple]) -> None:
    git = ["git", "-C", tree, "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    (chosen, resumes), same = Counter(windows).most_common(1)[0]
    print(f"# Publish path: {tree} at {commit}\n")
    print(__doc__.split("How it counts (printed with the results):\n")[1])
    print(f"windows: {len(windows)}, identical to the one reported: {same}")
    for (other, _), n in Counter(windows).most_common()[1:]:
        sizes = ", ".join(f"{kind} {counts(calls)}" for kind, calls in other)
        print(f"  {n} other: (calls, entered, files, climbs) {sizes}")
    print(f"generator resumes, not counted as calls: {resumes}\n")
    every = [c for _, calls in chosen for c in calls]
    print(f"{'pass':<10}{'calls':>7}{'files entered':>15}{'distinct files':>16}{'climbs':>8}")
    for kind, calls in [*chosen, ("total", every)]:
        n, entered, files, climbs = counts(calls)
        print(f"{kind:<10}{n:>7}{entered:>15}{files:>16}{climbs:>8}")
    print("\nclimbs (caller -> callee, in order):")
    for c in every:
        if layer(c.callee) < layer(c.caller):
            print(f"  L{layer(c.caller)} {c.caller}:{c.caller_func}")
            print(f"    -> L{layer(c.callee)} {c.callee}:{c.callee_func}")
    print("\nfiles entered, in order (calls in a row between the same two files on one line):")
    for kind, calls in chosen:
        print(f"  [{kind}]")
        moves = [c for c in calls if c.callee != c.caller]
        for (a, b), group in groupby(moves, key=lambda c: (c.caller, c.callee)):
            group = list(group)
            print(
                f"    {a}:{group[0].caller_func} -> {b}: {', '.join(c.callee_func for c in group)}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=Path(__file__).resolve().parent.parent, type=Path)
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))
    # Python calls are what it counts, and the compiled units (sdk/compiled.py) make
    # none: the tree runs as pure Python, the router and its writers alike.
    os.environ["RELAY_PURE"] = "1"
    import broker
    from broker.router import Router
    from sdk.client import connect
    from sdk.paths import Home

    assert Path(broker.__file__).is_relative_to(tree), f"broker from {broker.__file__}"
    home = Home(tempfile.mkdtemp(prefix="relay-pp-", dir="/tmp"))
    router = Router(home, shards=SHARDS)
    recorder = Recorder(tree, Router.serve.__code__)

    def run() -> None:
        router.start()
        sys.setprofile(recorder.profile)
        try:
            router.serve()
        finally:
            sys.setprofile(None)
            router.close()

    thread = threading.Thread(target=run, name="router")
    thread.start()
    cmd = [sys.executable, "-m", "cli", "--home", str(home.root), "writer"]
    writers = [
        subprocess.Popen(
            [*cmd, "--shard", str(k), "--shards", str(SHARDS)],
            cwd=tree,  # the tree's code, not the installed one
            env={**os.environ, "PYTHONPATH": str(tree), "RELAY_LOG": "WARNING"},
            stdout=subprocess.DEVNULL,
        )
        for k in range(SHARDS)
    ]
    windows = []
    try:
        with connect(home.root, timeout=10.0) as client:
            deadline = time.monotonic() + 20
            while not all(w["pid"] for w in client.status()["writers"]):
                assert time.monotonic() < deadline, "writers did not come up"
                time.sleep(0.05)
            client.register_endpoint(SUBJECT)
            for i in range(5):
                client.publish(SUBJECT, f"warm-up {i}", sender=SENDER)
            for i in range(args.windows):
                recorder.open()
                result = client.publish(SUBJECT, f"measured {i}", sender=SENDER)
                recorder.close()
                assert result.delivered_to == 1, result
                windows.append(recorder.kept())
    finally:
        router.stopping = True
        thread.join(10)
        for w in writers:
            w.terminate()
        for w in writers:
            w.wait(10)
        shutil.rmtree(home.root, ignore_errors=True)
    report(tree, windows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
