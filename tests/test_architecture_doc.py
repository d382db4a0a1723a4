"""The documents the code relies on are in the repository, and say what is there.

- docs/architecture.md's module map names every Python module of the product packages,
  and no module that does not exist (like tests/test_protocol_doc.py for the protocol).
- Every design reference in code and docs points to a file in the repository: no
  document outside it is cited, every ``docs/<name>.md`` cited exists, and every
  invariant and section of docs/design.md that is cited by number or title is there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sdk", "broker", "workers", "edges", "ops", "cli")
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()
# Where design references live: the product, the benchmarks, the tests, the docs.
SOURCES = (*PACKAGES, "bench", "tests", "docs", "clients")
TOP_FILES = ("README.md", "Makefile", "Procfile", "pyproject.toml")
SUFFIXES = {".py", ".md", ".js", ".ts", ".c", ".h", ".toml", ".sh"}
SKIPPED_DIRS = {"node_modules", "build", "__pycache__", ".venv"}


def modules_in_tree() -> set[str]:
    """Every module of the product packages, but the packages' own dunder files."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if not path.name.startswith("__")
    }


def modules_on_the_map() -> set[str]:
    """The modules the map names: in its code block, a directory line (``router/``)
    opens a level two spaces deeper, and a module line (``loop.py``) sits at the level of
    the directory it is in; any other line (a description going on) is skipped."""
    block = re.search(r"## Layers and modules\n\n```\n(.*?)```", ARCHITECTURE, re.S)
    assert block, "docs/architecture.md has no module map under 'Layers and modules'"
    found, dirs = set(), []
    for line in block.group(1).splitlines():
        m = re.match(r"( *)(\S+)", line)
        if not m or len(m.group(1)) % 2:
            continue
        depth, word = len(m.group(1)) // 2, m.group(2)
        if depth > len(dirs):
            continue  # the rest of a description
        if re.fullmatch(r"[a-z_]+/", word):
            dirs = [*dirs[:depth], word[:-1]]
        elif re.fullmatch(r"[a-z_]+\.py", word):
            found.add("/".join([*dirs[:depth], word]))
    return found


def test_every_module_is_on_the_map():
    missing = sorted(modules_in_tree() - modules_on_the_map())
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_map_names_only_modules_that_exist():
    gone = sorted(modules_on_the_map() - modules_in_tree())
    assert not gone, f"docs/architecture.md names modules that do not exist: {gone}"


def text_files() -> list[Path]:
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).exists()]
    for top in SOURCES:
        for directory, subdirs, names in os.walk(ROOT / top):
            subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS]
            files.extend(Path(directory, n) for n in names if Path(n).suffix in SUFFIXES)
    return files


FILES = {
    path.relative_to(ROOT).as_posix(): path.read_text(errors="replace") for path in text_files()
}


def test_no_design_reference_points_outside_the_repository():
    brief = "DESIGN" + ".md"  # spelled apart, so that this file does not cite it
    citing = sorted(name for name, text in FILES.items() if brief in text)
    assert not citing, f"{brief} is not in the repository; docs/design.md is: {citing}"


def test_every_cited_document_exists():
    cited = {
        (name, doc)
        for name, text in FILES.items()
        for doc in re.findall(r"\bdocs/([a-z_]+\.md)\b", text)
    }
    missing = sorted((name, doc) for name, doc in cited if not (ROOT / "docs" / doc).exists())
    assert not missing, f"cited documents that do not exist: {missing}"


def design_invariants() -> set[int]:
    section = DESIGN.split("## Invariants", 1)[1].split("\n## ", 1)[0]
    return {int(n) for n in re.findall(r"^(\d+)\. \*\*", section, re.M)}


def design_sections() -> set[str]:
    return set(re.findall(r"^#+ (.+)$", DESIGN, re.M))


def test_design_has_the_five_invariants_the_code_cites():
    assert design_invariants() == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("name", sorted(n for n, t in FILES.items() if "design.md" in t))
def test_citations_of_design_name_what_is_there(name):
    # "design.md invariant 3", "design.md invariants 1 and 3", design.md, "The disk, measured"
    text = " ".join(FILES[name].split())  # a citation may be broken across lines
    invariants, sections = design_invariants(), design_sections()
    for numbers in re.findall(r"design\.md\)?,? invariants? (\d+(?: and \d+)?)", text):
        for n in re.findall(r"\d+", numbers):
            assert int(n) in invariants, f"{name} cites design.md invariant {n}"
    for title in re.findall(r"design\.md\]?(?:\([a-z.]+\))?, \"([^\"]+)\"", text):
        assert any(s.startswith(title) for s in sections), f"{name} cites design.md {title!r}"
