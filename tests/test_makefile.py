"""The Makefile's targets run as written (commands checked with a stand-in for the tools)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_lab_allows_root_only_as_root(tmp_path: Path) -> None:
    """Issue 14 item 20: `make lab` failed as root ("Running as root is not recommended. Use
    --allow-root"), how containers and workshop VMs run; --allow-root is added only then."""
    jupyter = tmp_path / "jupyter"
    jupyter.write_text('#!/bin/sh\necho "$@"\n')
    jupyter.chmod(0o755)
    # BIN: the stand-in jupyter; STAMP: a file newer than pyproject.toml, so the venv is not set up
    # (not the Makefile itself: in a fresh clone it may be older, and make would try to remake it)
    stamp = tmp_path / "installed"
    stamp.touch()
    done = subprocess.run(["make", "-s", "lab", f"BIN={tmp_path}", f"STAMP={stamp}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expected = "lab notebooks --allow-root" if os.geteuid() == 0 else "lab notebooks"
    assert done.stdout.splitlines() == [expected]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_dashboard_serves_the_conversation_trace(tmp_path: Path) -> None:
    """Issue 18 item 3: `make dashboard` runs `kvlab dashboard conversation` (as root too: Voilà
    needs no --allow-root), with its `## make dashboard — ...` comment as the other targets."""
    kvlab = tmp_path / "kvlab"
    kvlab.write_text('#!/bin/sh\necho "$@"\n')
    kvlab.chmod(0o755)
    stamp = tmp_path / "installed"
    stamp.touch()
    done = subprocess.run(["make", "-s", "dashboard", f"BIN={tmp_path}", f"STAMP={stamp}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["dashboard conversation"]
    assert "## make dashboard — " in (ROOT / "Makefile").read_text()
