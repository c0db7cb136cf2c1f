"""A chart widget that follows its controls: new data update the drawn Vega view in place.

:class:`LiveChart` is a small anywidget (our ESM, ``live.js``, a few KB) holding an altair
chart as two synced traits: ``spec``, the Vega-Lite spec without its rows (every named
dataset renamed ``d0``, ``d1``, … in order of appearance, so the same chart over other data
gives the same spec), and ``datasets``, the rows (name → ``{column: JSON text of its
values}``: columnar, and one string per column, so the message is small and a saved
notebook, which nbformat indents one value per line, stays small too). Assigning
``live.chart = chart`` serialises the chart without schema validation; when its data-free
spec equals the one shown only ``datasets`` is sent and the browser replaces the rows of the
existing view (``view.data``, i.e. ``view.change`` with a remove-all/insert changeset, then
``runAsync``), otherwise the chart is embedded anew. Charts draw as SVG.

The hot path of a panel skips altair altogether: a chart *template* reads named datasets
(``alt.NamedData``) and :meth:`LiveChart.show` takes the template and the polars frames by
name; with the template on display, a move converts the frames to columns and sends them
(building and serialising an altair chart costs ~100 ms of CPU per move on the run charts).
:func:`with_datasets` gives the self-contained altair chart (template + rows).

The Vega runtime (vega-embed, Vega-Lite, Vega; ~0.9 MB) is never a synced trait, so a saved
notebook stays small: the first LiveChart on a page asks the kernel for it by custom message
(not part of saved widget state), the kernel answers with
``vl_convert.javascript_bundle`` (built once per process, ~1 s), and the page imports it once
and shares it with every LiveChart. With no kernel answering within 15 s (an executed notebook
opened without a kernel, or whose kernel did not create these widgets; a kernel busy with
later cells answers once they finish, and 15 s covers a smoke run's cells) the page imports
vega-embed from ``esm.sh`` instead, which needs internet access; whichever arrives first is
used (a kernel answering late still wins when esm.sh cannot be reached). The first LiveChart
of a process builds the runtime on a background thread, so the request is usually answered at
once.
"""

from __future__ import annotations

import functools
import json
import math
import threading
from pathlib import Path
from typing import Any

import altair as alt
import anywidget
import polars as pl
import traitlets

_ESM = Path(__file__).with_name("live.js")
_NEED_VEGA = "kvlab-need-vega"


@functools.lru_cache(maxsize=1)
def vega_runtime() -> str:
    """The Vega runtime the browser side imports: one ES module exporting ``vegaEmbed``,
    ``vega`` and ``vegaLite`` (vl-convert's bundle of the Vega-Lite version altair emits),
    built once per process (~0.9 MB of text)."""
    import vl_convert as vlc

    version = "v" + ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return vlc.javascript_bundle("export { vegaEmbed, vega, vegaLite };", vl_version=version)


@functools.lru_cache(maxsize=1)
def _prepare_runtime() -> None:
    """Build :func:`vega_runtime` on a background thread once per process, so the first
    page's request is answered without the ~1 s build."""
    threading.Thread(target=vega_runtime, name="kvlab-vega-runtime", daemon=True).start()


def split_spec(spec: dict, names: tuple[str, ...] = ()) -> tuple[dict, dict[str, dict[str, list]], dict[str, str]]:
    """Split a Vega-Lite spec dict into (spec without rows, datasets by deterministic name, renaming).

    Every ``{"name": …}`` data reference to a top-level dataset (or to one of ``names``,
    datasets supplied apart) is renamed ``d0``, ``d1``, … in order of first appearance (a
    depth-first walk of the spec, keys in their order); the rows of each top-level dataset
    become columns (``{column: [values]}``, columns in order of first appearance; a row
    without a column gives ``None``). Datasets nothing refers to are dropped. ``spec`` is not
    changed.

    Returns:
        ``(bare, datasets, renaming)``; ``renaming`` maps each original name to ``d<i>``.

    Raises:
        ValueError: ``spec`` is not a dict, or its ``datasets`` is not a dict of row lists.

    Example:
        >>> spec = {"datasets": {"data-9f": [{"x": 1}, {"x": 2, "y": 3}]}, "data": {"name": "data-9f"},
        ...         "mark": "point"}
        >>> split_spec(spec)
        ({'data': {'name': 'd0'}, 'mark': 'point'}, {'d0': {'x': [1, 2], 'y': [None, 3]}}, {'data-9f': 'd0'})
    """
    if not isinstance(spec, dict):
        raise ValueError(f"spec must be a Vega-Lite spec dict, got {type(spec).__name__}")
    rows_by_name = spec.get("datasets", {})
    if not isinstance(rows_by_name, dict) or not all(isinstance(r, list) for r in rows_by_name.values()):
        raise ValueError("spec['datasets'] must map dataset names to lists of rows")
    known = set(rows_by_name) | set(names)
    renaming: dict[str, str] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "data" and isinstance(value, dict) and value.get("name") in known:
                    new = renaming.setdefault(value["name"], f"d{len(renaming)}")
                    out[key] = {**value, "name": new}
                else:
                    out[key] = walk(value)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    bare = walk({k: v for k, v in spec.items() if k != "datasets"})
    datasets = {new: _columns(rows_by_name[old]) for old, new in renaming.items() if old in rows_by_name}
    return bare, datasets, renaming


def with_datasets(template: alt.TopLevelMixin, frames: dict[str, pl.DataFrame]) -> alt.TopLevelMixin:
    """``template`` (a chart over ``alt.NamedData`` names) with the rows of ``frames`` as its
    top-level ``datasets``: a self-contained chart (save it, display it, read its data).

    Raises:
        ValueError: a value of ``frames`` is not a polars DataFrame.
    """
    for name, frame in frames.items():
        if not isinstance(frame, pl.DataFrame):
            raise ValueError(f"frames[{name!r}] must be a polars DataFrame, got {type(frame).__name__}")
    return template.properties(datasets={name: frame.to_dicts() for name, frame in frames.items()})


def _columns(rows: list[dict]) -> dict[str, list]:
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return {k: [row.get(k) for row in rows] for k in keys}


def _packed(columns: dict[str, list]) -> dict[str, str]:
    """Columns as the ``datasets`` trait holds them: one JSON text per column (NaN and ±inf →
    ``null``, as Vega reads a missing value)."""
    return {k: json.dumps([None if isinstance(x, float) and not math.isfinite(x) else x for x in v],
                          allow_nan=False, separators=(",", ":")) for k, v in columns.items()}


class LiveChart(anywidget.AnyWidget):
    """An altair chart as a widget whose data updates redraw in place (see the module doc).

    Args:
        chart: the altair chart to show first (any top-level chart; ``None``: empty).

    Attributes:
        chart: the altair chart shown; assign a new one to update the widget.
        spec: the synced data-free Vega-Lite spec (datasets named ``d0``, ``d1``, …).
        datasets: the synced rows, ``{name: {column: values}}``.
        revision: bumped once per assignment; the browser redraws once per revision.
        embeds: how many assignments sent a new spec (the others sent data only).

    Raises:
        ValueError: ``chart`` is not an altair chart.

    Example:
        >>> import altair as alt, polars as pl
        >>> live = LiveChart(alt.Chart(pl.DataFrame({"x": [1, 2]})).mark_line().encode(x="x:Q", y="x:Q"))
        >>> live.chart = alt.Chart(pl.DataFrame({"x": [5, 7, 9]})).mark_line().encode(x="x:Q", y="x:Q")
        >>> live.datasets, live.embeds   # the same spec: only the rows were sent
        ({'d0': {'x': '[5,7,9]'}}, 1)
        >>> live.columns("d0")
        {'x': [5, 7, 9]}
    """

    _esm = _ESM
    spec = traitlets.Dict().tag(sync=True)
    datasets = traitlets.Dict().tag(sync=True)
    revision = traitlets.Int(0).tag(sync=True)

    def __init__(self, chart: alt.TopLevelMixin | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._chart: alt.TopLevelMixin | None = None
        self._template: tuple[alt.TopLevelMixin, dict[str, str]] | None = None
        self._frames: dict[str, pl.DataFrame] = {}
        self.embeds = 0
        self.on_msg(self._on_custom_message)
        _prepare_runtime()
        if chart is not None:
            self.chart = chart

    @property
    def chart(self) -> alt.TopLevelMixin | None:
        """The altair chart on display (after :meth:`show`: the template with its rows,
        built on first read)."""
        if self._chart is None and self._template is not None:
            self._chart = with_datasets(self._template[0], self._frames)
        return self._chart

    @chart.setter
    def chart(self, chart: alt.TopLevelMixin) -> None:
        if not isinstance(chart, alt.TopLevelMixin):
            raise ValueError(f"chart must be an altair chart, got {type(chart).__name__}")
        self.show_spec(chart.to_dict(validate=False))
        self._chart = chart

    def show(self, template: alt.TopLevelMixin, frames: dict[str, pl.DataFrame]) -> None:
        """Show ``template`` (a chart reading ``alt.NamedData`` datasets named as the keys of
        ``frames``) over the rows of ``frames``. With the same template object on display only
        the rows are sent (columns straight from polars, no altair call); a new template is
        serialised once (no validation) and embedded unless its spec equals the one shown.

        Raises:
            ValueError: ``template`` not an altair chart, a frame not a polars DataFrame.
        """
        if not isinstance(template, alt.TopLevelMixin):
            raise ValueError(f"template must be an altair chart, got {type(template).__name__}")
        for name, frame in frames.items():
            if not isinstance(frame, pl.DataFrame):
                raise ValueError(f"frames[{name!r}] must be a polars DataFrame, got {type(frame).__name__}")
        bare = None
        if self._template is None or self._template[0] is not template:
            bare, _, renaming = split_spec(template.to_dict(validate=False), tuple(frames))
            self._template = (template, renaming)
        renaming = self._template[1]
        self._frames, self._chart = dict(frames), None
        self._set(bare, {renaming[name]: _packed(frame.to_dict(as_series=False))
                         for name, frame in frames.items() if name in renaming})

    def show_spec(self, spec: dict) -> None:
        """Show a Vega-Lite spec dict (as :func:`split_spec` splits it): data only when its
        data-free spec equals the one on display."""
        bare, datasets, _ = split_spec(spec)
        self._template = None
        self._set(bare, {name: _packed(columns) for name, columns in datasets.items()})

    def columns(self, name: str) -> dict[str, list]:
        """The rows of dataset ``name`` (``"d0"``, …) as sent: ``{column: values}``.

        Raises:
            ValueError: no dataset of that name.
        """
        if name not in self.datasets:
            raise ValueError(f"no dataset {name!r}; have {sorted(self.datasets)}")
        return {k: json.loads(v) for k, v in self.datasets[name].items()}

    def _set(self, bare: dict | None, datasets: dict | None) -> None:
        """Send a new spec (``None``: keep) and/or datasets (``None``: keep); the browser
        redraws once per call that sends datasets."""
        with self.hold_sync():
            if bare is not None and bare != self.spec:
                self.spec = bare
                self.embeds += 1
            if datasets is not None:
                self.datasets = datasets
                self.revision += 1

    def _on_custom_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == _NEED_VEGA:
            self.send({"type": "kvlab-vega-runtime", "source": vega_runtime()})


def live_renderer(spec: dict, **_metadata: Any) -> dict:
    """An altair renderer (``alt.renderers.register``) that shows every chart as a
    :class:`LiveChart`: the widget's mimebundle (a few KB of state plus the rows; the Vega
    runtime comes from the kernel)."""
    live = LiveChart()
    live.show_spec(spec)
    return live._repr_mimebundle_()


__all__ = ["LiveChart", "live_renderer", "split_spec", "vega_runtime", "with_datasets"]
