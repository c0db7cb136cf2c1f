"""Notebooks are stored thin: no outputs, no widget state, smoke switch first, assertion last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS][:1] == ["01_quickstart.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_clean_and_asserts(path: Path) -> None:
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "strip outputs"
    assert "widgets" not in nb.get("metadata", {}), "strip widget state"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert "KVLAB_SMOKE" in "".join(code[0]["source"]), "first code cell must read KVLAB_SMOKE"
    assert "assert " in "".join(code[-1]["source"]), "last cell must assert what the notebook teaches"
