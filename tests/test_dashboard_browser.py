"""``kvlab dashboard`` in a real browser: Voilà + headless Chromium (issue 18, item 3).

The command itself is started (``kvlab dashboard conversation --port P --no-browser``, as root
here as in containers), the page opened, and with the real mouse and keyboard: the replay
panel's capacity slider moved (the chart's drawing and the summary change), a bundled trace
picked in the trace picker (the panels follow), a malformed Mooncake file uploaded (the loader's
error, file and line, on the page; the trace stays). Throughout: no console or page error (none
of the CDN fetches a closed network refuses either) and no "Error displaying widget". After the
server is stopped no kernel of it is left running. Without Chromium the test skips, under
``CI=true`` it fails. No timings are asserted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from browser_harness import (
    ServerProcess,
    browser_page,
    chart_locator,
    chart_snapshot,
    choose_dropdown,
    drag_slider,
    free_port,
    need_browser,
)

from kvlab.cli.dashboard import kernel_pids

ROOT = Path(__file__).resolve().parent.parent
BAD = b'{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n{"timestamp": 10}\n'


def wait_for(page: Any, check: Any, what: str, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s * 4)):
        if check():
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"{what} within {timeout_s:.0f} s")


def test_dashboard_slider_picker_and_bad_upload(tmp_path: Path) -> None:
    chromium = need_browser()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "TMPDIR": str(tmp_path)}  # the command's temp folder (and its kernels' connection files) in here
    argv = [sys.executable, "-m", "kvlab.cli", "dashboard", "conversation", "--port", str(port), "--no-browser"]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(BAD)
    with ServerProcess(argv, ready_url=f"http://127.0.0.1:{port}/voila/static/voila.js", env=env, cwd=tmp_path,
                       timeout_s=120) as server, browser_page(chromium) as page:
        page.goto(f"http://127.0.0.1:{port}/", timeout=180_000)
        replay_tab = page.locator(".widget-tab .widget-vbox").filter(has=page.locator(".vega-embed")).first
        chart = chart_locator(replay_tab)
        wait_for(page, lambda: chart.count() and chart_snapshot(chart), "the replay chart drawn", 120)
        info = page.get_by_text("distinct blocks of 512 tokens")
        assert "12,031" in info.inner_text()
        assert page.get_by_text("kvlab · KV-cache workshop").is_visible()

        # the capacity slider, with the real mouse: the chart and the summary follow
        summary = replay_tab.locator(".widget-html-content", has_text="block hit ratio").first
        before, before_summary = chart_snapshot(chart), summary.inner_text()
        drag_slider(page, replay_tab.locator(".widget-slider").first, 0.15)
        wait_for(page, lambda: chart_snapshot(chart) not in ("", before) and summary.inner_text() != before_summary,
                 "the chart and the summary changed after the slider moved")

        # a bundled trace in the picker, with the keyboard: the panels follow
        choose_dropdown(page, page.locator(".widget-dropdown select").first, "synthetic (bundled)")
        wait_for(page, lambda: "3,993" in info.inner_text(), "the synthetic trace shown")
        wait_for(page, lambda: chart.count() and chart_snapshot(chart), "the replay chart redrawn")

        # a malformed Mooncake file: the loader's error on the page, the trace stays
        with page.expect_file_chooser() as chooser:  # the button opens the browser's file dialog
            page.locator(".widget-upload").click()
        chooser.value.set_files(str(bad))
        error = page.locator(".widget-html-content", has_text="Could not load the trace").first
        error.wait_for(timeout=60_000)
        assert "bad.jsonl:2: missing field 'input_length'" in error.inner_text()
        assert "3,993" in info.inner_text()

        assert kernel_pids(tmp_path), "no kernel of the page found: the check below would see nothing"
        assert page.get_by_text("Error displaying widget").count() == 0
        assert page.page_errors == [], page.page_errors
        log = server.log_tail(200)
    assert "Traceback" not in log, log
    assert kernel_pids(tmp_path) == []  # stopped with the server
