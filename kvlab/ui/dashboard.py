"""The workshop dashboard: one page with a trace picker over the replay panel, the design
explorer and the cluster panel (what ``kvlab dashboard`` serves on Voilà).

The picker offers the bundled traces with block keys (:data:`kvlab.paths.BUNDLED_TRACES`), the trace
the dashboard was started with, and files uploaded from the browser (any format
:func:`kvlab.traces.load_trace` reads, detected from the content). A file the loader
refuses shows its error (file name and line) on the page; the trace on display stays. The
panels are built for a trace when their tab is first shown, so switching traces costs one
panel, not three. While a trace loads, a panel is built or a replay / simulation runs, a
progress bar under the picker says what is running.
"""

from __future__ import annotations

import html
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import ipywidgets as widgets

from kvlab.core.result import RunResult
from kvlab.core.validate import check_positive
from kvlab.paths import BUNDLED_TRACES, TOKEN_COUNT_TRACES
from kvlab.sim.cluster.mooncake_figures import MooncakeSetup
from kvlab.tiers.result import TieredReplayResult
from kvlab.traces import Trace, load_trace
from kvlab.ui.design_explorer import DesignExplorer, ExplorerSettings
from kvlab.ui.global_cache_panel import GlobalCachePanel
from kvlab.ui.replay_panel import ReplayPanel

#: The tabs, in order: key, title, a sentence for the class.
TABS: tuple[tuple[str, str, str], ...] = (
    ("replay", "One cache", "A prefix cache replaying the trace: move the capacity slider and watch the hit ratio "
                            "and the occupancy over time."),
    ("explorer", "Tiers", "GPU, CPU and NVMe tiers sized in GiB for a model: where the hits come from and how many "
                          "bytes move between tiers."),
    ("cluster", "Cluster", "Mooncake's cluster of prefill nodes, each node's DRAM a local cache or one global pool: "
                           "choose the scheduler and the cluster, then press Run."),
)
#: Requests at the head of the trace the cluster panel simulates (a run takes seconds).
CLUSTER_REQUESTS = 300
#: File types the upload button offers (load_trace reads them all).
UPLOAD_ACCEPT = ".jsonl,.json,.csv,.gz,.parquet"


class Progress:
    """A progress bar and a line saying what runs, hidden when nothing does.

    :meth:`task` shows it for the duration of a ``with`` block; a task started inside another
    (a replay while a trace loads) only updates the line. Safe to use from the design
    explorer's timer thread.

    Example:
        >>> progress = Progress()
        >>> with progress.task("loading", steps=2):
        ...     progress.step("replaying")
        ...     progress.shown, progress.label.value, progress.bar.value
        (True, 'replaying', 1)
        >>> progress.shown
        False
    """

    def __init__(self) -> None:
        self.bar = widgets.IntProgress(value=0, min=0, max=1, bar_style="info", layout={"width": "260px"})
        self.label = widgets.Label(style={"font_style": "italic"})
        self.ui = widgets.HBox([self.bar, self.label], layout={"visibility": "hidden"})
        self._depth = 0
        self._lock = threading.RLock()

    @property
    def shown(self) -> bool:
        """Whether the bar is visible (a task is running)."""
        return self.ui.layout.visibility != "hidden"

    @contextmanager
    def task(self, label: str, steps: int = 1) -> Iterator[None]:
        """Show ``label`` and an empty bar of ``steps`` steps until the block ends (a full bar
        for a one-step task: it runs, there is nothing to count)."""
        with self._lock:
            self._depth += 1
            outer = self._depth == 1
            if outer:
                self.bar.max = max(1, steps)
                self.bar.value = self.bar.max if steps <= 1 else 0
                self.ui.layout.visibility = "visible"
            self.label.value = label
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self.ui.layout.visibility = "hidden"
                    self.label.value = ""

    def step(self, label: str) -> None:
        """One step of the running task done; ``label`` says what runs next."""
        with self._lock:
            self.bar.value = min(self.bar.value + 1, self.bar.max)
            self.label.value = label


class _ReplayPanel(ReplayPanel):
    """The replay panel, its replays under the dashboard's progress bar."""

    def __init__(self, trace: Trace, progress: Progress) -> None:
        self.progress = progress
        super().__init__(trace)

    def compute(self) -> RunResult:
        with self.progress.task(f"replaying {self.trace.frame.height:,} requests…"):
            return super().compute()


class _DesignExplorer(DesignExplorer):
    """The design explorer, its replays under the dashboard's progress bar."""

    def __init__(self, trace: Trace, progress: Progress) -> None:
        self.progress = progress
        super().__init__(trace)

    def compute(self, settings: ExplorerSettings | None = None) -> TieredReplayResult:
        with self.progress.task("replaying through the tiers…"):
            return super().compute(settings)


class _GlobalCachePanel(GlobalCachePanel):
    """The cluster panel, its runs under the dashboard's progress bar."""

    def __init__(self, trace: Trace, setup: MooncakeSetup | None, progress: Progress) -> None:
        self.progress = progress
        super().__init__(trace, setup)
        self.run_button.icon = ""  # Font Awesome is not served offline: no empty icon box

    def refresh(self) -> None:
        with self.progress.task("simulating the cluster twice (local and global cache)…"):
            super().refresh()


class Dashboard:
    """A trace picker over the replay panel, the design explorer and the cluster panel, in tabs
    under one header: the page ``kvlab dashboard`` serves to a class (Voilà, no code cells).

    Picking a trace (:attr:`picker`: a bundled name, the starting file, an upload) loads it and
    rebuilds the panel of the open tab; the other tabs are rebuilt when opened. An upload
    (:attr:`upload`) is loaded with :func:`kvlab.traces.load_trace`; when it fails, :attr:`error`
    shows the loader's message (the file's name and line) and the trace on display stays.
    :attr:`progress` is visible while a trace loads, a panel is built or a replay runs.

    Drive it without a browser as the panels: set ``picker.value``, ``upload.value`` or
    ``tabs.selected_index``, read :attr:`trace`, :attr:`replay`, :attr:`explorer`,
    :attr:`cluster` (built on first use) and :attr:`error`.

    Args:
        trace: the trace shown first: a bundled name, a file path (as :func:`kvlab.load_trace`)
            or a :class:`~kvlab.traces.Trace`.
        cluster_requests: requests at the head of the trace the cluster panel simulates.
        setup: the cluster panel's cluster (default: Mooncake's Figure 10, 10 nodes × 3 M tokens).

    Raises:
        ValueError: a bad ``cluster_requests``, a trace the loader refuses (file and line).
        FileNotFoundError: no such file nor bundled trace.

    Example:
        >>> dash = Dashboard("synthetic")
        >>> dash.trace.frame.height, dash.replay.trace is dash.trace
        (3993, True)
        >>> dash.picker.value = "conversation"   # as a user picking another trace
        >>> dash.replay.trace.frame.height, dash.error.value
        (12031, '')
    """

    def __init__(self, trace: str | Path | Trace = "conversation", *, cluster_requests: int = CLUSTER_REQUESTS,
                 setup: MooncakeSetup | None = None) -> None:
        self.cluster_requests = check_positive("cluster_requests", cluster_requests)
        self.setup = setup
        self.progress = Progress()
        self._sources: dict[str, Callable[[], Trace]] = {}
        self._loaded: dict[str, Trace] = {}
        self._panels: dict[str, object] = {}
        self._uploads = 0
        self._upload_dir: tempfile.TemporaryDirectory | None = None
        # the panels replay caches: bundled traces with token counts only are not offered
        names = [name for name in BUNDLED_TRACES if name not in TOKEN_COUNT_TRACES]
        options = [(f"{name} (bundled)", name) for name in names]
        for name in names:
            self._sources[name] = lambda name=name: load_trace(name)
        first = self._add_start(trace, options)
        self.picker = widgets.Dropdown(options=options, value=first, description="trace",
                                       layout={"width": "460px"})
        self.upload = widgets.FileUpload(accept=UPLOAD_ACCEPT, multiple=False, description="Upload a trace",
                                         icon="", layout={"width": "200px"})
        self.info = widgets.HTML()
        self.error = widgets.HTML()
        self.tabs = widgets.Tab(children=[widgets.VBox() for _ in TABS], titles=[title for _, title, _ in TABS])
        self.trace: Trace = self._load(first)  # raises for a bad starting trace: nothing to show yet
        self._show_info()
        header = widgets.HTML("<h1 style='margin:0.2em 0'>kvlab · KV-cache workshop</h1>")
        self.ui = widgets.VBox([header, widgets.HBox([self.picker, self.upload]), self.info, self.error,
                                self.progress.ui, self.tabs])
        self._build(TABS[0][0])
        self.picker.observe(self._on_pick, names="value")
        self.upload.observe(self._on_upload, names="value")
        self.tabs.observe(self._on_tab, names="selected_index")

    # ------------------------------------------------------------------ the panels

    @property
    def replay(self) -> ReplayPanel:
        """The replay panel of the current trace (built on first use)."""
        return self._panel("replay")

    @property
    def explorer(self) -> DesignExplorer:
        """The design explorer of the current trace (built on first use)."""
        return self._panel("explorer")

    @property
    def cluster(self) -> GlobalCachePanel:
        """The cluster panel of the current trace's first ``cluster_requests`` requests (built on first use)."""
        return self._panel("cluster")

    def _panel(self, key: str) -> object:
        if key not in self._panels:
            self._build(key)
        return self._panels[key]

    def _build(self, key: str) -> None:
        """Build the panel ``key`` for the current trace and put it in its tab."""
        index = [k for k, _, _ in TABS].index(key)
        with self.progress.task(f"building the {TABS[index][1].lower()} panel…"):
            if key == "replay":
                panel = _ReplayPanel(self.trace, self.progress)
            elif key == "explorer":
                panel = _DesignExplorer(self.trace, self.progress)
            else:
                panel = _GlobalCachePanel(self.trace.head(self.cluster_requests), self.setup, self.progress)
        self._panels[key] = panel
        intro = widgets.HTML(f"<p class='kvlab-intro'>{html.escape(TABS[index][2])}</p>")
        self.tabs.children[index].children = (intro, panel.ui)

    # ------------------------------------------------------------------ traces

    def _add_start(self, trace: str | Path | Trace, options: list[tuple[str, str]]) -> str:
        """Register the starting trace; its picker value."""
        if isinstance(trace, Trace):
            key = f"given: {trace.source}"
            options.append((Path(trace.source).name or "trace", key))
            self._sources[key] = lambda: trace
            return key
        text = str(trace)
        if text in BUNDLED_TRACES and not Path(text).exists():
            return text
        key = str(Path(text).resolve())
        options.append((f"{Path(text).name} (file)", key))
        self._sources[key] = lambda: load_trace(text)  # errors name the path as given
        return key

    def _load(self, key: str) -> Trace:
        if key not in self._loaded:
            with self.progress.task(f"loading {self._label(key)}…"):
                self._loaded[key] = self._sources[key]()
        return self._loaded[key]

    def _label(self, key: str) -> str:
        return next(label for label, value in self.picker.options if value == key)

    def _show_info(self) -> None:
        s = self.trace.describe()
        self.info.value = (f"<b>{s.requests:,}</b> requests over <b>{s.time_span_s:,.0f} s</b>, "
                           f"<b>{s.distinct_blocks:,}</b> distinct blocks of {s.block_size:,} tokens, "
                           f"{s.input_tokens_mean:,.0f} input tokens per request on average")

    def _show_error(self, message: str) -> None:
        self.error.value = (f"<div style='color:#b00020'><b>Could not load the trace:</b> "
                            f"{html.escape(message)}</div>")

    def _switch(self, key: str) -> None:
        """Show the trace ``key``: load it, build the open tab's panel for it, then drop the old
        panels (a failure on the way leaves the old trace and panels on display)."""
        trace = self._load(key)
        old_trace, old_panels = self.trace, self._panels
        self.trace, self._panels = trace, {}
        try:
            self._build(TABS[self.tabs.selected_index or 0][0])
        except BaseException:
            self.trace, self._panels = old_trace, old_panels
            raise
        for name, panel in old_panels.items():
            if name not in self._panels:
                self.tabs.children[[k for k, _, _ in TABS].index(name)].children = ()
            _close(panel.ui)
        self._show_info()
        self.error.value = ""

    def _on_pick(self, change: dict) -> None:
        if change["new"] is None or change["new"] == change["old"]:
            return
        try:
            with self.progress.task(f"switching to {self._label(change['new'])}…"):
                self._switch(change["new"])
        except (ValueError, OSError) as err:
            self._show_error(str(err))
            self.picker.unobserve(self._on_pick, names="value")
            self.picker.value = change["old"]  # the trace on display stays
            self.picker.observe(self._on_pick, names="value")

    def add_upload(self, name: str, content: bytes) -> None:
        """Load an uploaded file (``name``: its file name, ``content``: its bytes) and show it;
        on a loader error, show the error (naming ``name`` and the line) and keep the trace on
        display. Called by the upload button."""
        if self._upload_dir is None:
            self._upload_dir = tempfile.TemporaryDirectory(prefix="kvlab-upload-")
        self._uploads += 1
        folder = Path(self._upload_dir.name) / str(self._uploads)
        folder.mkdir()
        path = folder / (Path(name).name or "upload")
        path.write_bytes(content)
        try:
            with self.progress.task(f"loading {path.name}…"):
                trace = load_trace(path)
        except (ValueError, OSError) as err:
            self._show_error(str(err).replace(str(folder) + "/", ""))
            return
        if not trace.block_identity:  # the panels replay caches: nothing to show (and not offered)
            self._show_error(f"{path.name} ({trace.provenance.get('format', 'token counts')} format) has arrivals and "
                             "token counts only, no block keys, so these cache panels have nothing to replay. "
                             "Run it through the timed cluster (kvlab simulate) or give it a synthetic sharing "
                             "model (kvlab.traces.synthesize_prefix) in a notebook.")
            return
        key = f"upload {self._uploads}: {path.name}"
        self._sources[key] = lambda: trace
        self._loaded[key] = trace
        self.picker.options = [*self.picker.options, (f"{path.name} (uploaded)", key)]
        self.picker.value = key  # _on_pick switches

    def _on_upload(self, change: dict) -> None:
        files = change["new"]
        if not files:
            return
        for item in files:
            self.add_upload(item["name"], bytes(item["content"]))
        self.upload.value = ()  # the same file can be uploaded again after a fix

    def _on_tab(self, change: dict) -> None:
        key = TABS[change["new"] or 0][0]
        if key not in self._panels:
            self._build(key)

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.ui._repr_mimebundle_(**kwargs)


def prepare_page() -> None:
    """Make the kernel ready to draw charts on a page with no internet access, before the
    page asks: offline rendering (:func:`kvlab.viz.use_offline_rendering`) and the
    :class:`~kvlab.viz.live.LiveChart` Vega runtime built now (``vega_runtime()``, ~1 s of
    CPU), so the first chart's request is answered at once even on a loaded machine.
    ``kvlab dashboard``'s notebook calls this first; with a preheated kernel it runs before
    any visitor."""
    from kvlab.viz import use_offline_rendering
    from kvlab.viz.live import vega_runtime

    use_offline_rendering()
    vega_runtime()


def _close(widget: widgets.Widget) -> None:
    """Close ``widget`` and every widget inside it (their kernel-side comms)."""
    for child in getattr(widget, "children", ()):
        _close(child)
    widget.close()


def dashboard(trace: str | Path | Trace = "conversation", **kwargs: object) -> Dashboard:
    """Build a :class:`Dashboard` starting on ``trace`` (display it in a notebook cell)."""
    return Dashboard(trace, **kwargs)


__all__ = ["CLUSTER_REQUESTS", "TABS", "UPLOAD_ACCEPT", "Dashboard", "Progress", "dashboard", "prepare_page"]
