"""The compiled units (sdk/compiled.py): used only while they match their sources, and
the publish path the same whether they run compiled or as pure Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sdk import compiled

ROOT = Path(__file__).resolve().parent.parent


def build_of(tmp_path: Path, units: dict[str, str]) -> tuple[Path, Path]:
    """A source tree holding ``units`` (path -> text) and a build made from it."""
    root, build = tmp_path / "src", tmp_path / "build"
    for unit, text in units.items():
        (root / unit).parent.mkdir(parents=True, exist_ok=True)
        (root / unit).write_text(text)
    build.mkdir()
    made = compiled.manifest(root, tuple(units))
    (build / compiled.MANIFEST).write_text(json.dumps(made))
    return root, build


def test_a_build_of_the_current_sources_is_used(tmp_path):
    root, build = build_of(tmp_path, {"a/x.py": "X = 1\n", "a/y.py": "Y = 2\n"})
    assert compiled.stale_units(build, root) == []


def test_an_edited_source_makes_the_build_stale_naming_the_unit(tmp_path):
    root, build = build_of(tmp_path, {"a/x.py": "X = 1\n", "a/y.py": "Y = 2\n"})
    (root / "a/y.py").write_text("Y = 3\n")
    assert compiled.stale_units(build, root) == ["a/y.py"]


def test_a_removed_source_makes_the_build_stale(tmp_path):
    root, build = build_of(tmp_path, {"a/x.py": "X = 1\n"})
    (root / "a/x.py").unlink()
    assert compiled.stale_units(build, root) == ["a/x.py"]


def test_no_build_another_interpreters_or_a_broken_manifest_is_no_build(tmp_path):
    root, build = build_of(tmp_path, {"a/x.py": "X = 1\n"})
    assert compiled.stale_units(tmp_path / "nothing", root) is None
    made = json.loads((build / compiled.MANIFEST).read_text())
    (build / compiled.MANIFEST).write_text(json.dumps({**made, "suffix": ".cpython-39.so"}))
    assert compiled.stale_units(build, root) is None
    (build / compiled.MANIFEST).write_text("{not json")
    assert compiled.stale_units(build, root) is None


def test_lint_type_checks_every_compiled_unit():
    """A type error in a unit fails its build; `make lint` (mypy's files) finds it first."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        files = tomllib.load(f)["tool"]["mypy"]["files"]
    assert all(unit in files or unit.startswith("sdk/") for unit in compiled.UNITS)


def _run(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


_WHERE = "import broker.publish, sdk.ids; print(broker.publish.__file__, sdk.ids.__file__)"


def test_relay_pure_runs_every_unit_from_its_source():
    assert _run(_WHERE, RELAY_PURE="1").split() == [
        str(ROOT / "broker" / "publish.py"),
        str(ROOT / "sdk" / "ids.py"),
    ]


@pytest.mark.skipif(
    compiled.stale_units(compiled.BUILD, compiled.ROOT) != [], reason="no current build"
)
def test_a_current_build_runs_the_units_compiled():
    where = _run(_WHERE, RELAY_PURE="")
    assert all(Path(p).is_relative_to(compiled.BUILD) for p in where.split()), where


@pytest.mark.skipif(
    compiled.stale_units(compiled.BUILD, compiled.ROOT) != [], reason="no current build"
)
def test_the_installed_relay_command_finds_the_packages_not_the_builds_folders(tmp_path):
    """The `relay` console script runs with the checkout off sys.path (the editable
    install's finder maps the packages): the build's folders, which hold no
    __init__.py, must never be taken for the packages (`make run` broke on that)."""
    code = (
        "import sdk, broker.router; "  # sdk first: it decides on the build
        "print(broker.__file__, hasattr(broker.router, 'main'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "RELAY_PURE": ""},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == [str(ROOT / "broker" / "__init__.py"), "True"], done.stdout


@pytest.mark.parametrize("pure", ["1", ""], ids=["pure", "compiled-if-built"])
def test_the_publish_path_runs_in_process(pure):
    """bench.publish_cost drives the router's units through whole publishes (request,
    plan, copies, stored answers, replies) in process: it must run either way."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.publish_cost", "--publishes", "320", "--reps", "1"],
        cwd=ROOT,
        env={**os.environ, "RELAY_PURE": pure},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "µs per publish" in out
