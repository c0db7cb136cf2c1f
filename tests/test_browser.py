"""kvlab's notebooks in a real browser: JupyterLab + headless Chromium (issue 18, item 1).

One JupyterLab per module, on a temp copy of ``notebooks/`` with ``KVLAB_SMOKE=1`` in the kernel's
environment; the kernel imports kvlab from this checkout (``PYTHONPATH``) and its data from
``data/`` beside the package. Notebook 01 and 06 run in full; then the real mouse and keyboard
move a panel's controls, and the test asserts that every cell ran without error, no widget
failed to display, the page logged no error, and the chart's drawing changed after each move
(the kernel saw the new value: the panel's summary line changed too). Without Chromium the tests
skip, except under ``CI=true``, where they fail (``make test`` and ``.ci/run`` install it).
The harness itself (``tests/browser_harness.py``) must report a failing cell: a tiny notebook
that raises is run too. No timings are asserted (``benchmarks/bench_browser.py`` measures them).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import server_process
from browser_harness import (
    CHART_SELECTOR,
    ServerProcess,
    browser_page,
    chart_locator,
    chart_snapshot,
    choose_dropdown,
    drag_slider,
    free_port,
    jupyter_lab,
    need_browser,
    run_notebook,
)

from kvlab.ui.replay_panel import TOUCH_ORDER_LABELS

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser (skip without one; fail under CI=true)."""
    return need_browser()


@pytest.fixture(scope="module")
def lab(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """JupyterLab on a temp copy of notebooks/, smoke mode, kvlab from this checkout."""
    root = tmp_path_factory.mktemp("lab")
    for nb in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(nb, root / nb.name)
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    with jupyter_lab(root, env={"KVLAB_SMOKE": "1", "PYTHONPATH": pythonpath}) as server:
        yield server


@pytest.fixture(scope="module")
def page(chromium: str) -> Iterator[Any]:
    """One headless Chromium page for the module; ``page.page_errors`` collects console errors."""
    with browser_page(chromium) as p:
        yield p


def panel_output(page: Any, *, has: str) -> Any:
    """The output area of the (first) widget panel with a slider, a chart and ``has`` (a selector)."""
    return (page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output")
            .filter(has=page.locator(".widget-slider")).filter(has=page.locator(CHART_SELECTOR))
            .filter(has=page.locator(has)).first)


def changed_after(page: Any, output: Any, move: Any, *, timeout_s: float = 60.0) -> tuple[str, str]:
    """Run ``move`` and wait until both the chart's drawing and the panel's summary line changed
    (the kernel saw the new value and pushed a new chart); returns the summary before and after."""
    chart = chart_locator(output)
    # the summary line, not the touch-order help next to it
    summary = output.locator(".widget-html-content").filter(has_text="block hit ratio").first
    before_chart, before_summary = chart_snapshot(chart), summary.inner_text()
    move()
    for _ in range(int(timeout_s * 4)):
        page.wait_for_timeout(250)
        after = chart_snapshot(chart)
        if after and after != before_chart and summary.inner_text() != before_summary:
            return before_summary, summary.inner_text()
    raise AssertionError(f"after the move the chart changed: {chart_snapshot(chart) != before_chart}, the summary "
                         f"changed: {summary.inner_text() != before_summary} (still {before_summary!r})")


def test_quickstart_replay_panel(lab: Any, page: Any) -> None:
    """Notebook 01 runs cleanly; its replay panel follows the capacity slider (mouse) and the
    touch-order toggle (a mouse click, then the keyboard: Tab to the other button, Space)."""
    errors_before = len(page.page_errors)
    assert run_notebook(page, lab, "01_quickstart.ipynb", timeout_s=240) == []
    output = panel_output(page, has=".widget-toggle-buttons")
    # the toggle first: at the default 10,000 blocks the two touch orders differ (at 500 they do not)
    tail = output.get_by_role("button", name=TOUCH_ORDER_LABELS["tail_most_recent"], exact=True)
    changed_after(page, output, lambda: tail.click())
    assert "mod-active" in (tail.get_attribute("class") or "")
    readout = output.locator(".widget-readout").first
    start = readout.inner_text()
    changed_after(page, output, lambda: drag_slider(page, output.locator(".widget-slider").first, 0.15))
    assert readout.inner_text() != start
    assert page.page_errors[errors_before:] == []


def test_tiers_design_explorer(lab: Any, page: Any) -> None:
    """Notebook 06 runs cleanly; its design explorer follows a GiB slider (mouse) and the GPU
    tier's policy dropdown (keyboard)."""
    errors_before = len(page.page_errors)
    assert run_notebook(page, lab, "06_tiers.ipynb", timeout_s=240) == []
    output = panel_output(page, has=".widget-dropdown")
    sliders = output.locator(".widget-slider")
    gpu = sliders.filter(has=page.locator("label", has_text="GPU")).first
    changed_after(page, output, lambda: drag_slider(page, gpu, 0.6))
    policy = output.locator(".widget-dropdown").filter(has=page.locator("label", has_text="policy")).first
    changed_after(page, output, lambda: choose_dropdown(page, policy, "fifo"))
    assert page.page_errors[errors_before:] == []


def test_harness_reports_a_failing_cell(lab: Any, page: Any) -> None:
    """The harness is not blind: a notebook whose second cell raises is reported with the
    exception, and the cell after it as not run."""
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": src}
             for src in ("x = 1", "raise ValueError('boom from the harness test')", "y = 2")]
    notebook = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}},
                "nbformat": 4, "nbformat_minor": 5}
    (Path(lab.root_dir) / "raises.ipynb").write_text(json.dumps(notebook))
    problems = run_notebook(page, lab, "raises.ipynb", timeout_s=60)
    assert any("ValueError" in p and "boom from the harness test" in p for p in problems), problems
    assert any(p.startswith("code cell 2: not run") for p in problems), problems


def test_server_process_start_failure_raises_with_the_log(tmp_path: Path) -> None:
    """A server that dies before it is ready raises at once, with the end of its log."""
    argv = [sys.executable, "-c", "import sys; print('bad flag --nope'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match=r"exited with status 3(.|\n)*bad flag --nope"):
        with ServerProcess(argv, ready_url=f"http://127.0.0.1:{free_port()}/", cwd=tmp_path, timeout_s=30):
            pass


def test_server_process_kills_its_whole_tree(tmp_path: Path) -> None:
    """On exit the server's group is killed, and so is a child it started in a session of its own
    that ignores SIGTERM (as Jupyter starts kernels)."""
    port = free_port()
    code = ("import http.server, signal, subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, "
            "signal.SIG_IGN); time.sleep(600)'], start_new_session=True)\n"
            f"http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')\n")
    with ServerProcess([sys.executable, "-c", code], ready_url=f"http://127.0.0.1:{port}/", cwd=tmp_path,
                       timeout_s=60) as server:
        pids = [server.proc.pid]
        for _ in range(100):  # the child may still be starting
            children = [pid for pid, _ in server_process._descendants(pids[0])]
            if children:
                break
            time.sleep(0.05)
        pids += children
    assert len(pids) == 2
    for pid in pids:  # gone, or a zombie waiting to be reaped
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("ci", ["true", None])
def test_missing_browser_fails_under_ci_else_skips(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   ci: str | None) -> None:
    """Without chromium the browser tests skip, except under CI=true, where they fail with the
    install command (CI must run them)."""
    monkeypatch.delenv("KVLAB_CHROMIUM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
        with pytest.raises(pytest.skip.Exception, match="no chromium"):
            need_browser()
    else:
        monkeypatch.setenv("CI", ci)
        with pytest.raises(pytest.fail.Exception, match="apt-get install -y --no-install-recommends chromium"):
            need_browser()
