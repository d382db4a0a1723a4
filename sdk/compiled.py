"""The router's hot units compiled with mypyc, used only while they match their sources.

`make install` compiles the modules in `UNITS` to C extensions (build_units.py) into
``build/compiled/``, outside the source tree, and writes a manifest there: the sha256 of
each unit's source as compiled. Each package holding a unit puts that directory first
in its ``__path__`` (`search_path`), so ``import broker.publish`` finds the extension,
but only when every unit's source still has the hash the manifest names. An edit to a
unit's ``.py`` therefore takes effect at once, pure Python, with a warning naming the
stale units until the next `make install`; it is never silently shadowed by an older
build. ``RELAY_PURE=1`` in the environment runs the pure modules regardless (the tests
run both ways: tests/test_compiled.py). No build (no C compiler, a client install):
the pure modules, as before. What it buys: docs/performance.md,
"Fewer objects per publish, and mypyc".

This module is never compiled: it decides whether the others are.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout (an editable install's)
BUILD = ROOT / "build" / "compiled"
MANIFEST = "manifest.json"
GROUP = "relay_units"  # the name of the shared library mypyc builds for all of them
PURE_ENV = "RELAY_PURE"

# The units compiled: the publish path, from the request's frame to its answer, and the
# pure policies it runs (python -m bench.publish_cost names them all); and the router's
# loop with its socket edges and the acks' operations, run once a pass, which at 1,000
# messages/s is four times a message (docs/performance.md, "The loop compiled after
# all"), with what the loop calls each pass (the clock, the index readers,
# federation's holds); the writer's group commit, from its socket to its index
# transaction; and the client's threads, a publish's send and a subscription's read
# (docs/performance.md, "The writer and the client compiled"), with the checks of what
# they read (sdk/fields.py) and the hand-outs they hold (sdk/holdings.py; "The last
# interpreted calls on the handler path"). Only modules that type-check (make lint)
# and that no test replaces parts of at run time (tests swap references instead:
# tests/harness.py `StandIn`). Not sdk/types.py: its public types take a list where
# they keep a tuple (PublishResult's __post_init__ converts it), which a compiled
# dataclass refuses before converting, and a compiled frozen dataclass does not
# unpickle.
UNITS = (
    "sdk/subjects.py",
    "sdk/ids.py",
    "sdk/fields.py",
    "sdk/holdings.py",
    "sdk/wire.py",
    "sdk/paths.py",
    "broker/sublist.py",
    "broker/budget.py",
    "broker/publish.py",
    "broker/reliability.py",
    "broker/ratelimit.py",
    "broker/breaker.py",
    "broker/backpressure.py",
    "broker/rules.py",
    "broker/delegation.py",
    "broker/rejections.py",
    "broker/router/delivery.py",
    "broker/router/jobs.py",
    "broker/router/replies.py",
    "broker/router/writer_events.py",
    "broker/router/ops_publish.py",
    "broker/router/dispatch.py",
    "broker/router/requests.py",
    "broker/router/remote_parts.py",
    "broker/router/directory.py",
    "broker/router/consumers.py",
    "broker/router/context.py",
    "broker/router/signal_out.py",
    "workers/protocol.py",
    "broker/router/loop.py",
    "broker/router/client_links.py",
    "broker/router/writer_links.py",
    "broker/router/ops_consume.py",
    "sdk/sockets.py",
    "sdk/transport.py",
    "sdk/subscription.py",
    "sdk/subscriptions.py",
    "sdk/client.py",
    "workers/writer.py",
    "workers/group_commit.py",
    "workers/index.py",
    "workers/index_changes.py",
    "workers/maildir.py",
    "workers/flush.py",
    "workers/fsio.py",
    "workers/filenames.py",
    "workers/clock.py",
    "broker/router/indexes.py",
    "broker/router/federation.py",
)


def source_hashes(root: Path, units: tuple[str, ...] = UNITS) -> dict[str, str]:
    """The sha256 of each unit's source under ``root`` ("" for one that is missing)."""
    hashes = {}
    for unit in units:
        try:
            hashes[unit] = hashlib.sha256((root / unit).read_bytes()).hexdigest()
        except OSError:
            hashes[unit] = ""
    return hashes


def manifest(root: Path, units: tuple[str, ...] = UNITS) -> dict[str, object]:
    """What a build records: the interpreter's extension suffix and the sources' hashes."""
    return {"suffix": sysconfig.get_config_var("EXT_SUFFIX"), "units": source_hashes(root, units)}


def stale_units(build: Path, root: Path) -> list[str] | None:
    """The units whose source differs from what ``build`` was compiled from; [] when the
    build matches every source; None when there is no usable build (none, another
    interpreter's, or a manifest that cannot be read)."""
    try:
        built = json.loads((build / MANIFEST).read_text())
        units = built["units"]
        if built["suffix"] != sysconfig.get_config_var("EXT_SUFFIX") or not units:
            return None
        now = source_hashes(root, tuple(units))
        return sorted(unit for unit, digest in units.items() if now[unit] != digest)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


@functools.cache
def in_use() -> bool:
    """Whether this process runs the compiled units (decided once, at first import)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False
    stale = stale_units(BUILD, ROOT)
    if stale is None:
        return False
    if stale:
        warnings.warn(
            f"compiled units older than their sources ({', '.join(stale)}): running all "
            f"units as pure Python; `make install` compiles them again",
            RuntimeWarning,
            stacklevel=3,  # the package whose import asked
        )
        return False
    _load_group()
    return True


def _load_group() -> None:
    """Import the shared library the compiled units need (``<GROUP>__mypyc``) from its
    file. Not by putting the build on sys.path: its folders (broker/, sdk/, workers/)
    hold no __init__.py, and where the checkout itself is off sys.path (the `relay`
    command of an editable install) the import system would take them for namespace
    packages and shadow the real ones."""
    name = f"{GROUP}__mypyc"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(
        name, BUILD / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} from {BUILD}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def search_path(package: str, path: list[str]) -> list[str]:
    """A package's ``__path__`` with its compiled units' directory first, when in use."""
    if not in_use():
        return path
    return [str(BUILD.joinpath(*package.split("."))), *path]
