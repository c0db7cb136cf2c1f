"""LiveChart: the spec/datasets split, the in-place path and the Vega runtime by message."""

from __future__ import annotations

import json

import altair as alt
import polars as pl
import pytest

from kvlab.viz import LiveChart, split_spec, use_offline_rendering, with_datasets
from kvlab.viz import live as live_module


def line(frame: pl.DataFrame, title: str = "t") -> alt.LayerChart:
    base = alt.Chart(frame).mark_line().encode(x="x:Q", y="y:Q")
    return alt.layer(base, alt.Chart(pl.DataFrame({"y": [frame["y"].max()]})).mark_rule().encode(y="y:Q"),
                     title=title)


def test_split_names_datasets_in_order_of_appearance() -> None:
    one = line(pl.DataFrame({"x": [1, 2], "y": [3, 4]})).to_dict(validate=False)
    two = line(pl.DataFrame({"x": [5], "y": [6]})).to_dict(validate=False)
    bare1, data1, renaming = split_spec(one)
    bare2, data2, _ = split_spec(two)
    assert bare1 == bare2 and "datasets" not in bare1  # other rows, the same spec
    assert [layer["data"]["name"] for layer in bare1["layer"]] == ["d0", "d1"]
    assert data1 == {"d0": {"x": [1, 2], "y": [3, 4]}, "d1": {"y": [4]}}
    assert data2 == {"d0": {"x": [5], "y": [6]}, "d1": {"y": [6]}}
    assert sorted(renaming.values()) == ["d0", "d1"] and all(k.startswith("data-") for k in renaming)
    assert "datasets" in one  # the input is not changed
    with pytest.raises(ValueError, match="spec must be a Vega-Lite spec dict, got list"):
        split_spec([])
    with pytest.raises(ValueError, match=r"spec\['datasets'\] must map dataset names to lists of rows"):
        split_spec({"datasets": {"a": 1}})


def test_a_data_change_sends_rows_only_and_a_new_spec_re_embeds() -> None:
    live = LiveChart(line(pl.DataFrame({"x": [1, 2], "y": [3, 4]})))
    spec = live.spec
    assert live.embeds == 1 and live.revision == 1
    live.chart = line(pl.DataFrame({"x": [7, 8, 9], "y": [1, 2, 3]}))
    assert live.spec is spec and live.embeds == 1 and live.revision == 2
    assert live.columns("d0") == {"x": [7, 8, 9], "y": [1, 2, 3]} and live.columns("d1") == {"y": [3]}
    assert live.datasets["d0"] == {"x": "[7,8,9]", "y": "[1,2,3]"}  # one JSON text per column
    live.chart = line(pl.DataFrame({"x": [7], "y": [1]}), title="other")
    assert live.embeds == 2 and live.spec["title"] == "other" and live.revision == 3
    assert live.chart.to_dict()["title"] == "other"
    with pytest.raises(ValueError, match="chart must be an altair chart, got dict"):
        live.chart = {}


def test_show_sends_polars_columns_without_altair() -> None:
    template = alt.Chart(alt.NamedData(name="rows")).mark_point().encode(x="a:Q", y="b:Q")
    live = LiveChart()
    live.show(template, {"rows": pl.DataFrame({"a": [1, 2], "b": [0.5, None]})})
    assert live.spec["data"] == {"name": "d0"} and live.columns("d0") == {"a": [1, 2], "b": [0.5, None]}
    spec = live.spec
    live.show(template, {"rows": pl.DataFrame({"a": [3], "b": [1.5]})})
    assert live.spec is spec and live.embeds == 1 and live.columns("d0") == {"a": [3], "b": [1.5]}
    live.show(template, {"rows": pl.DataFrame({"a": [1.0], "b": [float("nan")]})})
    assert live.datasets["d0"] == {"a": "[1.0]", "b": "[null]"}
    with pytest.raises(ValueError, match=r"no dataset 'd7'; have \['d0'\]"):
        live.columns("d7")
    live.show(template, {"rows": pl.DataFrame({"a": [3], "b": [1.5]})})
    assert live.chart.to_dict()["datasets"] == {"rows": [{"a": 3, "b": 1.5}]}  # the altair chart, rows inside
    assert with_datasets(template, {"rows": pl.DataFrame({"a": [3], "b": [1.5]})}).to_dict() == live.chart.to_dict()
    with pytest.raises(ValueError, match=r"frames\['rows'\] must be a polars DataFrame, got list"):
        live.show(template, {"rows": []})


def test_the_vega_runtime_goes_by_message_not_in_the_saved_state(monkeypatch) -> None:
    live = LiveChart(line(pl.DataFrame({"x": [1], "y": [2]})))
    state = json.dumps(live.get_state(), default=str)
    assert len(state) < 12_000  # our ESM and the spec: the ~0.9 MB Vega runtime is never a trait
    sent = []
    monkeypatch.setattr(live_module, "vega_runtime", lambda: "export const vegaEmbed = 1;")
    monkeypatch.setattr(live, "send", sent.append)
    live._on_custom_message(live, {"type": "kvlab-need-vega"}, [])
    live._on_custom_message(live, {"type": "other"}, [])
    assert sent == [{"type": "kvlab-vega-runtime", "source": "export const vegaEmbed = 1;"}]


def test_offline_rendering_shows_plain_charts_as_live_charts() -> None:
    before = alt.renderers.active
    try:
        use_offline_rendering()
        assert alt.renderers.active == "kvlab"
        bundle = line(pl.DataFrame({"x": [1], "y": [2]}))._repr_mimebundle_()
        bundle = bundle[0] if isinstance(bundle, tuple) else bundle
        assert "application/vnd.jupyter.widget-view+json" in bundle
    finally:
        alt.renderers.enable(before)
        alt.JupyterChart.enable_offline(False)
