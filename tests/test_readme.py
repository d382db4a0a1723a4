"""The README's Python snippets run as pasted, against a real broker, and leave nothing
claimed behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
SNIPPETS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_python_snippets():
    assert len(SNIPPETS) >= 3


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.splitlines()[-1][:40])
def test_a_readme_snippet_runs_as_pasted_and_strands_nothing(broker, snippet):
    env = {**os.environ, "RELAY_HOME": str(broker.home.root), "PYTHONPATH": str(ROOT)}
    ran = subprocess.run(
        [sys.executable, "-c", snippet], env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    client = broker.client()
    for endpoint in client.list_endpoints():
        assert client.pending(endpoint.subject) == [], endpoint.subject
