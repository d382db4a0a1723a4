"""Compile the router's hot units with mypyc: ``python build_units.py`` (`make install`).

The units are `sdk.compiled.UNITS`; the extensions go to ``build/compiled/`` (never
beside the sources: a stale extension there would shadow its edited ``.py``), with a
manifest of the sources' hashes that `sdk.compiled` checks at import. The old build is
removed first, so a failed build leaves none, and the pure modules run. Exits non-zero
on failure; the Makefile carries on without it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

# Importing sdk must not load the build this replaces.
os.environ["RELAY_PURE"] = "1"

from sdk.compiled import BUILD, GROUP, MANIFEST, ROOT, UNITS, manifest


def main() -> int:
    from mypyc.build import mypycify  # a dev dependency (mypy): only the build needs it
    from setuptools import setup

    work = ROOT / "build" / "mypyc"  # the generated C and object files
    shutil.rmtree(BUILD, ignore_errors=True)
    before = manifest(ROOT)
    setup(
        name="relay-units",
        script_args=["build_ext", "--build-lib", str(BUILD), "--build-temp", str(work)],
        ext_modules=mypycify(list(UNITS), opt_level="3", group_name=GROUP, target_dir=str(work)),
    )
    if manifest(ROOT) != before:  # a source changed while it compiled: not this build's
        shutil.rmtree(BUILD, ignore_errors=True)
        print("sources changed during the build; run it again", file=sys.stderr)
        return 1
    (BUILD / MANIFEST).write_text(json.dumps(before, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
