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
    for name in ("jupyter", "kvlab"):
        (tmp_path / name).write_text(f'#!/bin/sh\necho "{name} $@"\n')
        (tmp_path / name).chmod(0o755)
    # BIN: the stand-in jupyter; STAMP: a file newer than pyproject.toml, so the venv is not set up
    # (not the Makefile itself: in a fresh clone it may be older, and make would try to remake it)
    stamp = tmp_path / "installed"
    stamp.touch()
    done = subprocess.run(["make", "-s", "lab", f"BIN={tmp_path}", f"STAMP={stamp}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expected = "jupyter lab notebooks --allow-root" if os.geteuid() == 0 else "jupyter lab notebooks"
    assert done.stdout.splitlines() == ["kvlab warmup", expected]  # compiled before the class starts


def _tool_dir(tmp_path: Path, *, with_chromium: bool) -> tuple[Path, Path]:
    """A PATH of stand-ins: apt-get and sudo that log their arguments, id and env (the real ones),
    and a chromium only when ``with_chromium``; returns the folder and the log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("apt-get", "sudo"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\n' + ('exec "$@"\n' if name == "sudo" else ""))
        script.chmod(0o755)
    for name in ("id", "env"):
        (bin_dir / name).symlink_to(shutil.which(name))
    if with_chromium:
        (bin_dir / "chromium").write_text("#!/bin/sh\n")
        (bin_dir / "chromium").chmod(0o755)
    return bin_dir, log


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize("with_chromium", [False, True])
def test_make_chromium_installs_debian_chromium_when_missing(tmp_path: Path, with_chromium: bool) -> None:
    """Issue 18: `make test` installs Debian's chromium for the browser tests when it is missing
    (apt-get update, then a non-interactive install without recommends; sudo when not root), and
    touches nothing when one is on PATH."""
    bin_dir, log = _tool_dir(tmp_path, with_chromium=with_chromium)
    env = {k: v for k, v in os.environ.items() if k != "KVLAB_CHROMIUM"}
    env["PATH"] = str(bin_dir)
    done = subprocess.run([shutil.which("make"), "-s", "chromium"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    if with_chromium:
        assert calls == []
        return
    update, install = "apt-get update -qq", "apt-get install -y -qq --no-install-recommends chromium"
    if os.geteuid() == 0:
        assert calls == [update, install]
    else:  # the stand-in sudo logs, then runs the command
        assert calls == [f"sudo {update}", update, f"sudo env DEBIAN_FRONTEND=noninteractive {install}", install]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_test_needs_chromium_and_never_downloads_browsers() -> None:
    """`make test` depends on the chromium target and tells Playwright not to download browsers."""
    done = subprocess.run(["make", "-n", "-p", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    rule = next(line for line in done.stdout.splitlines() if line.startswith("test:"))
    assert "chromium" in rule.split()
    assert "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1" in done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_every_notebook_runs_once_in_make_test() -> None:
    """A notebook left out of nbmake (``--ignore``) is run by the browser test instead, and no other."""
    import re

    done = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    ignored = set(re.findall(r"--ignore=notebooks/(\S+\.ipynb)", done.stdout))
    browser = (ROOT / "tests" / "test_browser.py").read_text()
    assert ignored and all(f'"{name}"' in browser for name in ignored)
    assert all((ROOT / "notebooks" / name).is_file() for name in ignored)


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
    assert done.stdout.splitlines() == ["warmup", "dashboard conversation"]
    assert "## make dashboard — " in (ROOT / "Makefile").read_text()
