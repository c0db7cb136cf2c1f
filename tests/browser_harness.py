"""Drive kvlab's notebooks and panels in a real browser: JupyterLab (or Voilà) + headless Chromium.

Used by ``tests/test_browser.py`` and ``benchmarks/bench_browser.py`` (which put ``tests/`` on
``sys.path``). Debian's ``chromium`` is driven by Playwright's sync API with
``executable_path`` (Playwright's own browser download is never used). Every server this module
starts runs in its own process group and is killed with its children on exit, also on a failure
or Ctrl-C; ports are free loopback ports, every directory a server writes is a temp directory.

API:
    chromium_path(), need_browser()      where the browser is; skip, or fail under ``CI=true``
    ServerProcess(argv, ready_url=...)   a server process group, ready once ``ready_url`` is 200
    free_port()                          a free port on 127.0.0.1 (both from ``tests/server_process.py``)
    jupyter_lab(root_dir, env=...)       JupyterLab on ``root_dir`` (``.url``, ``.token``, ``.root_dir``)
    browser_page(chromium)               a Playwright page; its console errors in ``page_errors``
    run_notebook(page, lab, name)        open, run all cells, wait; the error outputs it shows
    drag_slider / choose_dropdown        move a widget with the real mouse / keyboard
    chart_snapshot(locator)              the chart's SVG markup or canvas pixels
    time_repaint(page, chart, act)       seconds from the slider's release to the chart's last repaint
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from server_process import ServerProcess, free_port  # tests/ is on sys.path

__all__ = ["CHART_SELECTOR", "ServerProcess", "browser_page", "chart_locator", "chart_snapshot", "choose_dropdown",
           "chromium_path", "drag_slider", "free_port", "jupyter_lab", "need_browser", "run_notebook", "time_repaint"]

INSTALL_HINT = ("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
                "chromium (make test and .ci/run do this)")

#: Console errors that are benign and unavoidable, by exact text (none so far: an error is an error).
ALLOWED_CONSOLE_ERRORS: frozenset[str] = frozenset()


def chromium_path() -> str | None:
    """The Chromium executable: ``$KVLAB_CHROMIUM``, else ``chromium`` or ``chromium-browser``
    on ``PATH``; ``None`` when there is none."""
    env = os.environ.get("KVLAB_CHROMIUM")
    if env:
        return env
    return shutil.which("chromium") or shutil.which("chromium-browser")


def need_browser() -> str:
    """The Chromium path for a test; without one the test skips, or fails under ``CI=true``
    (CI must run the browser tests; the message gives the install command)."""
    import pytest

    path = chromium_path()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but no chromium is installed; the browser tests must run in CI: {INSTALL_HINT}")
        pytest.skip(f"no chromium: {INSTALL_HINT}")
    return path


#: User settings of the lab under test: no news or update popups; every cell in the DOM.
LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def jupyter_lab(root_dir: str | Path, *, env: Mapping[str, str] | None = None, timeout_s: float = 120.0
                ) -> ServerProcess:
    """JupyterLab on ``root_dir`` (not yet started: use it as a context manager).

    ``python -m jupyter lab`` on a free loopback port with a random token, ``--allow-root`` as
    root, no news or update checks, and config, data, runtime, settings and workspace folders in
    a temp directory (not the user's). ``env`` is added to this process's environment (the
    kernels inherit it: e.g. ``KVLAB_SMOKE=1``). The returned server has ``.url``
    (``http://127.0.0.1:PORT/``), ``.token`` and ``.root_dir``.
    """
    port, token = free_port(), secrets.token_hex(16)
    state = Path(tempfile.mkdtemp(prefix="kvlab-lab-"))
    for plugin, values in LAB_SETTINGS.items():
        path = state / "settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    full_env = {**os.environ, **(env or {}), "JUPYTER_CONFIG_DIR": str(state / "config"),
                "JUPYTER_DATA_DIR": str(state / "data"), "JUPYTER_RUNTIME_DIR": str(state / "runtime"),
                "JUPYTERLAB_SETTINGS_DIR": str(state / "settings"),
                "JUPYTERLAB_WORKSPACES_DIR": str(state / "workspaces"), "JUPYTER_PLATFORM_DIRS": "1"}
    argv = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
            "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    server = ServerProcess(argv, ready_url=f"http://127.0.0.1:{port}/api/status?token={token}", env=full_env,
                           cwd=str(root_dir), timeout_s=timeout_s, cleanup_dirs=[state])
    server.url, server.token, server.root_dir = f"http://127.0.0.1:{port}/", token, Path(root_dir)  # type: ignore[attr-defined]
    return server


@contextlib.contextmanager
def browser_page(chromium: str, *, viewport: tuple[int, int] = (1400, 1000)) -> Iterator[Any]:
    """A Playwright page in headless Chromium (``chromium``: the executable; ``--no-sandbox``,
    since tests run as root in containers). Every console message of type ``error`` and every
    uncaught page exception is appended to ``page.page_errors`` (a ``list[str]``; texts in
    :data:`ALLOWED_CONSOLE_ERRORS` excepted). The browser is closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            errors: list[str] = []
            page.page_errors = errors

            def on_console(msg: Any) -> None:
                if msg.type == "error" and msg.text not in ALLOWED_CONSOLE_ERRORS:
                    errors.append(f"console: {msg.text} ({msg.location.get('url', '')})")

            page.on("console", on_console)
            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
            yield page
        finally:
            browser.close()


_CELLS_STATE_JS = """nb => {
  const prompts = [...nb.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent.trim());
  const errors = [];
  nb.querySelectorAll('.jp-Cell').forEach((cell, i) => {
    cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').forEach(out => {
      if (out.textContent.includes('Traceback')) errors.push(`cell ${i}: ${out.textContent.slice(0, 2000)}`);
    });
  });
  return {prompts, errors};
}"""


def _wait_idle(page: Any, notebook: Any, indicator: Any, deadline: float) -> dict[str, Any]:
    """Wait until the kernel is idle with no cell queued (``[*]``) and either every code cell
    has an execution count, an error is shown, or nothing has changed for 5 s; return the cells' state."""
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        state = notebook.evaluate(_CELLS_STATE_JS)
        idle = indicator.get_attribute("data-status") == "idle" and "[*]:" not in state["prompts"]
        if state != last:
            last, since = state, time.monotonic()
        done = all(p[1:-2].isdigit() for p in state["prompts"])
        if idle and (done or state["errors"] or time.monotonic() - since >= 5.0):
            return state
        page.wait_for_timeout(250)
    raise TimeoutError(f"notebook still running; prompts {last and last['prompts']}")


def _wait_kernel_ready(page: Any, panel: Any, lab: ServerProcess, name: str, timeout_s: float = 120.0) -> None:
    """Wait until the server has a session for notebook ``name`` whose kernel is idle and the
    page's kernel indicator has said idle for 1 s in a row (it says idle before the kernel starts;
    "Run All Cells" then runs nothing)."""
    deadline, since = time.monotonic() + timeout_s, None
    indicator = panel.locator(".jp-Notebook-ExecutionIndicator").first
    sessions_url = f"{lab.url}api/sessions?token={lab.token}"
    while time.monotonic() < deadline:
        with urllib.request.urlopen(sessions_url, timeout=5) as response:  # noqa: S310 - loopback
            states = [s["kernel"]["execution_state"] for s in json.load(response)
                      if s.get("path") == name and s.get("kernel")]
        if states == ["idle"] and indicator.get_attribute("data-status") == "idle":
            since = since or time.monotonic()
            if time.monotonic() - since >= 1.0:
                return
        else:
            since = None
        page.wait_for_timeout(100)
    raise TimeoutError(f"the kernel of {name} did not become idle within {timeout_s:.0f} s")


def _run_menu(page: Any, item: str) -> None:
    """Click the Run menu, then its item ``item`` (the real mouse)."""
    page.locator("#jp-MainMenu .lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item:visible", has_text=item).first.click()


def run_notebook(page: Any, lab: ServerProcess, name: str, *, timeout_s: float = 300.0) -> list[str]:
    """Open notebook ``name`` (a path under ``lab.root_dir``) in JupyterLab, run all its cells
    (the Run menu's "Run All Cells", clicked with the mouse) and wait until the kernel is idle,
    no cell is queued and every code cell has an execution count (or an error stopped the run).
    Cells a run skipped without an error (seen when "Run All Cells" races the kernel's start
    under load) are run again from the first of them ("Run Selected Cell and All Below", at most
    twice); the kernel dying is reported.

    Returns:
        One string per problem found: each error output (a traceback: the saved notebook's
        ``error`` outputs and any stderr output with a traceback), each code cell left unrun,
        each "Error displaying widget" on the page and each kernel restart in the server log.
        Empty when the notebook ran cleanly.

    Raises:
        TimeoutError: not finished within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    page.goto(f"{lab.url}lab/tree/{name}?token={lab.token}")
    panel = page.locator(".jp-NotebookPanel:visible").first
    notebook, indicator = panel.locator(".jp-Notebook").first, panel.locator(".jp-Notebook-ExecutionIndicator").first
    notebook.wait_for(timeout=120_000)
    _wait_kernel_ready(page, panel, lab, name)
    _run_menu(page, "Run All Cells")
    for _attempt in range(2):
        state = _wait_idle(page, notebook, indicator, deadline)
        unrun = [i for i, p in enumerate(state["prompts"]) if not p[1:-2].isdigit()]
        if not unrun or state["errors"]:
            break
        print(f"run_notebook: {name}: code cells {unrun} skipped without an error; running again from {unrun[0]}")
        _wait_kernel_ready(page, panel, lab, name)
        notebook.locator(".jp-CodeCell .jp-InputArea-prompt").nth(unrun[0]).click()
        _run_menu(page, "Run Selected Cell and All Below")
        page.wait_for_timeout(1000)
    else:
        state = _wait_idle(page, notebook, indicator, deadline)
    page.wait_for_timeout(500)  # let widget views finish rendering
    state = notebook.evaluate(_CELLS_STATE_JS)
    problems = list(state["errors"])
    problems += [f"code cell {i}: not run ({p})" for i, p in enumerate(state["prompts"]) if not p[1:-2].isdigit()]
    path = Path(lab.root_dir) / name
    before = path.stat().st_mtime_ns
    page.keyboard.press("Control+s")  # the saved file's outputs: errors a renderer might not show
    for _ in range(100):
        if path.stat().st_mtime_ns != before:
            break
        page.wait_for_timeout(100)
    else:
        raise TimeoutError(f"{name} was not saved within 10 s of Ctrl+S")
    page.wait_for_timeout(300)  # the write may still be under way
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                problems.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
    problems += [f"widget: {t}" for t in page.get_by_text("Error displaying widget").all_inner_texts()]
    problems += [f"server: {line}" for line in lab.log_tail(400).splitlines()
                 if "restarting kernel" in line.lower() or "kernel died" in line.lower()]
    return problems


def drag_slider(page: Any, slider_locator: Any, fraction: float) -> str | None:
    """Drag an ipywidgets 8 slider's handle (noUiSlider ``.noUi-handle``) with the real mouse to
    ``fraction`` (0 = left end, 1 = right end) of its track and release it there.

    ``slider_locator``: the slider widget (``.widget-slider``) or anything containing one handle.
    Returns the handle's ``aria-valuenow`` after the release (the widget's kernel-side value
    follows on release for ``continuous_update=False`` sliders).

    Raises:
        ValueError: ``fraction`` outside [0, 1].
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    handle = slider_locator.locator(".noUi-handle").first
    handle.scroll_into_view_if_needed()
    track = slider_locator.locator(".noUi-base").first.bounding_box()
    box = handle.bounding_box()
    if track is None or box is None:
        raise RuntimeError("the slider is not visible (no bounding box)")
    x0, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move(track["x"] + fraction * track["width"], y, steps=8)
    page.mouse.up()
    return handle.get_attribute("aria-valuenow")


def choose_dropdown(page: Any, select_locator: Any, label: str) -> None:
    """Choose the option ``label`` of an ipywidgets Dropdown with the keyboard: click its
    ``<select>`` (the option list opens), press ArrowDown / ArrowUp to ``label``, then Enter.
    Labels compare with no-break spaces as plain spaces (ipywidgets renders spaces as U+00A0).

    Raises:
        ValueError: ``label`` is not one of the options (the message lists them).
    """
    select = select_locator if select_locator.evaluate("e => e.tagName") == "SELECT" else \
        select_locator.locator("select").first
    options, current = select.evaluate("s => [[...s.options].map(o => o.text.replaceAll('\\u00a0', ' ')), "
                                       "s.selectedIndex]")
    label = label.replace("\xa0", " ")
    if label not in options:
        raise ValueError(f"label {label!r} is not an option of the dropdown (options: {options})")
    select.click()  # opens the option list; focusing alone is not enough: in a notebook in command mode
    steps = options.index(label) - current  # JupyterLab takes the arrow keys (they move the active cell)
    for _ in range(abs(steps)):
        page.keyboard.press("ArrowDown" if steps > 0 else "ArrowUp")
    page.keyboard.press("Enter")
    chosen = select.evaluate("s => s.options[s.selectedIndex].text.replaceAll('\\u00a0', ' ')")
    if chosen != label:
        raise RuntimeError(f"the keyboard selected {chosen!r}, not {label!r}")


#: In-page: the rendered drawing of the chart under ``el`` (its vega-embed): the SVG's markup, or
#: the canvas's pixels as a data URL.
_SNAPSHOT_JS = """el => {
  const root = el.matches('.vega-embed') ? el : (el.querySelector('.vega-embed') || el);
  const svg = root.querySelector('svg.marks') || root.querySelector('.chart-wrapper svg');
  if (svg) return svg.outerHTML;
  const canvas = root.querySelector('canvas.marks') || root.querySelector('canvas');
  return canvas ? canvas.toDataURL() : '';
}"""


#: A chart: a vega-embed, or whatever directly holds a Vega view's ``svg.marks`` / ``canvas.marks``.
CHART_SELECTOR = ".vega-embed, :has(> svg.marks), :has(> canvas.marks)"


def chart_locator(output: Any) -> Any:
    """The chart of a panel: the first :data:`CHART_SELECTOR` match (a ``.vega-embed``) inside
    ``output`` (the panel's output area)."""
    return output.locator(CHART_SELECTOR).first


def chart_snapshot(locator: Any) -> str:
    """The chart's rendered drawing: the vega-embed's SVG markup, or ``canvas.toDataURL()``
    when it renders on a canvas; ``""`` when nothing is drawn. It changes when the drawing
    changes. ``locator``: the ``.vega-embed`` or an element containing it."""
    return locator.evaluate(_SNAPSHOT_JS)


_WATCH_JS = """([el, snap]) => {
  const take = new Function('return (' + snap + ')')();
  const w = {last: take(el), changes: [], release: null, stop: false};
  window.__kvlabWatch = w;
  const onRelease = () => { w.release = performance.now(); w.changes = []; };
  window.addEventListener('mouseup', onRelease, true);
  window.addEventListener('keyup', onRelease, true);
  w.cleanup = () => { w.stop = true; window.removeEventListener('mouseup', onRelease, true);
                      window.removeEventListener('keyup', onRelease, true); };
  const tick = () => {
    if (w.stop) return;
    const now = take(el);
    if (now !== w.last) { w.last = now; w.changes.push(performance.now()); }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


def time_repaint(page: Any, chart_locator: Any, act: Callable[[], object], *, stable_s: float = 0.5,
                 timeout_s: float = 60.0) -> float:
    """Seconds from the release of the mouse button (or key) in ``act`` to the chart's last
    repaint, measured in the page.

    An in-page ``requestAnimationFrame`` loop compares :func:`chart_snapshot` every frame and
    records when it changed; the release is the last ``mouseup``/``keyup`` seen (capturing, on
    ``window``). Once the drawing has changed after the release and then stayed the same for
    ``stable_s`` (a re-embed first clears the chart, then draws it), the time of the last change
    minus the release is returned.

    Raises:
        TimeoutError: no change, or no stable drawing, within ``timeout_s`` of the release.
        RuntimeError: ``act`` released no mouse button or key.
    """
    handle = chart_locator.element_handle()
    page.evaluate(_WATCH_JS, [handle, _SNAPSHOT_JS])
    try:
        act()
        deadline = time.monotonic() + timeout_s
        while True:
            state = page.evaluate("() => { const w = window.__kvlabWatch; "
                                  "return [w.release, w.changes.slice(-1)[0] ?? null, performance.now()]; }")
            release, last_change, now = state
            if release is None:
                raise RuntimeError("act() released no mouse button or key")
            if last_change is not None and (now - last_change) / 1e3 >= stable_s:
                return (last_change - release) / 1e3
            if time.monotonic() > deadline:
                raise TimeoutError(f"the chart did not {'settle' if last_change else 'change'} within "
                                   f"{timeout_s:.0f} s of the release")
            page.wait_for_timeout(50)
    finally:
        page.evaluate("() => window.__kvlabWatch && window.__kvlabWatch.cleanup()")
