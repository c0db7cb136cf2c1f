"""An executed notebook with charts and a panel stays small (issue 18: teachers share them)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import kvlab
from kvlab.viz.live import vega_runtime

CELLS = [
    "import altair as alt\nimport polars as pl\nfrom kvlab.traces import load_trace\nfrom kvlab.ui import ReplayPanel\n"
    "from kvlab.ui.design_explorer import DesignExplorer\nfrom kvlab.viz import use_offline_rendering\n\n"
    "use_offline_rendering()\ntrace = load_trace('synthetic').head(2_000)",
    *[f"alt.Chart(pl.DataFrame({{'x': list(range({n})), 'y': [i % 7 for i in range({n})]}}))"
      ".mark_line().encode(x='x:Q', y='y:Q')" for n in (10, 100, 1_000)],
    "ReplayPanel(trace, capacity_blocks=1_000)",
    "DesignExplorer(trace)",
]


def test_an_executed_notebook_holds_no_vega_runtime(tmp_path, monkeypatch) -> None:
    """Three plain charts, a replay panel and a design explorer, executed with widget state
    saved (as JupyterLab and nbclient save it): 5.3 MB with altair's offline renderer and
    JupyterChart (the ~0.93 MB Vega bundle in every chart), 0.26 MB with LiveChart."""
    monkeypatch.setenv("PYTHONPATH", str(Path(kvlab.__file__).resolve().parent.parent))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "executed.ipynb"
    nbformat.write(nb, path)
    text = path.read_text()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    live = [m for m in state.values() if m["state"].get("_anywidget_id") == "kvlab.viz.live.LiveChart"]
    assert len(live) == 5  # three plain charts (the kvlab renderer) and the two panels' charts
    runtime = vega_runtime()
    for start in range(0, len(runtime), len(runtime) // 8):
        assert runtime[start:start + 64] not in text
    assert len(text.encode()) < 300_000, f"executed notebook is {len(text.encode()):,} bytes"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
