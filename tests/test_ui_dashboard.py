"""The workshop dashboard, driven headlessly: pick and upload traces, open tabs, read the panels."""

from __future__ import annotations

import importlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kvlab.sim.cluster.mooncake_figures import MooncakeSetup
from kvlab.traces import TraceFormatError
from kvlab.ui.dashboard import TABS, Dashboard, Progress

# the modules, not the functions of the same name kvlab.ui exports
dashboard_module = importlib.import_module("kvlab.ui.dashboard")
replay_panel_module = importlib.import_module("kvlab.ui.replay_panel")

GOOD = [{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 10, "input_length": 1536, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 20, "input_length": 600, "output_length": 5, "hash_ids": [1, 4]}]
BAD = (b'{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]}\n'
       b'{"timestamp": 10, "input_length": 1024, "hash_ids": [1, 3]}\n')


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def upload(dash: Dashboard, name: str, content: bytes) -> None:
    """As the browser sets a FileUpload's value (ipywidgets 8: a tuple of dicts, content a memoryview,
    last_modified a datetime)."""
    dash.upload.value = ({"name": name, "type": "application/jsonl", "size": len(content),
                          "content": memoryview(content),
                          "last_modified": datetime(2026, 1, 1, tzinfo=UTC)},)


@pytest.fixture
def dash() -> Dashboard:
    return Dashboard("synthetic", cluster_requests=20, setup=MooncakeSetup(num_workers=2, cache_tokens=200_000))


def test_starts_on_the_trace_and_builds_only_the_open_tab(dash: Dashboard) -> None:
    assert dash.picker.value == "synthetic"
    assert dash.trace.frame.height == 3_993
    assert "<b>3,993</b> requests" in dash.info.value and "of 512 tokens" in dash.info.value
    assert list(dash._panels) == ["replay"]
    assert dash.tabs.titles == tuple(title for _, title, _ in TABS)
    assert dash.tabs.children[0].children[1] is dash.replay.ui
    assert dash.tabs.children[1].children == ()
    assert dash.error.value == "" and not dash.progress.shown


def test_picker_switches_the_trace_and_the_panels_follow(dash: Dashboard) -> None:
    dash.tabs.selected_index = 1  # the tiers tab: built when opened
    explorer = dash.explorer
    assert explorer.trace is dash.trace and list(dash._panels) == ["replay", "explorer"]
    old_replay_ui = dash.replay.ui
    dash.picker.value = "conversation"
    assert dash.trace.frame.height == 12_031 and "<b>12,031</b> requests" in dash.info.value
    assert list(dash._panels) == ["explorer"]  # the open tab at once, the others when opened
    assert dash.explorer is not explorer and dash.explorer.trace is dash.trace
    assert dash.tabs.children[0].children == ()
    assert old_replay_ui.comm is None  # the old panels' widgets are closed
    assert dash.replay.trace is dash.trace and dash.tabs.children[0].children[1] is dash.replay.ui
    assert "0.2116" in dash.replay.summary.value  # LRU, 10,000 blocks on conversation (traces.md §5.1)
    dash.picker.value = "synthetic"  # loaded once, kept
    assert dash.trace.frame.height == 3_993 and dash.explorer.trace is dash.trace


def test_cluster_tab_runs_the_head_of_the_trace(dash: Dashboard) -> None:
    dash.tabs.selected_index = 2
    cluster = dash._panels["cluster"]
    assert cluster.trace.frame.height == 20
    assert cluster.run_button.icon == ""
    cluster.workers.value = 3
    assert "press Run" in cluster.status.value
    cluster.run_button.click()
    assert cluster.shown.num_workers == 3 and cluster.status.value == ""
    assert not dash.progress.shown


def test_upload_of_a_good_file_adds_it_and_shows_it(dash: Dashboard) -> None:
    upload(dash, "mine.jsonl", jsonl(GOOD))
    assert dash.picker.value == "upload 1: mine.jsonl"
    assert dash.picker.options[-1] == ("mine.jsonl (uploaded)", "upload 1: mine.jsonl")
    assert dash.trace.frame.height == 3 and dash.replay.trace is dash.trace
    assert dash.trace.frame["input_tokens"].to_list() == [1024, 1536, 600]
    assert dash.upload.value == ()  # cleared: the same file can be uploaded again
    assert dash.error.value == ""


def test_bad_upload_shows_the_error_and_keeps_the_trace(dash: Dashboard) -> None:
    trace, replay, options = dash.trace, dash.replay, dash.picker.options
    upload(dash, "bad.jsonl", BAD)
    assert "Could not load the trace:</b> bad.jsonl:2: missing field &#x27;output_length&#x27;" in dash.error.value
    assert "kvlab-upload-" not in dash.error.value  # the file's name, not the temp folder
    assert dash.trace is trace and dash.replay is replay
    assert dash.picker.value == "synthetic" and dash.picker.options == options
    assert dash.upload.value == ()
    upload(dash, "mine.jsonl", jsonl(GOOD))  # a good file next clears the error
    assert dash.error.value == "" and dash.trace.frame.height == 3


def test_a_trace_that_fails_to_load_keeps_the_picker_and_the_trace(dash: Dashboard, monkeypatch) -> None:
    def refuse(path: object) -> None:
        raise TraceFormatError(f"{path}.jsonl", 7, "broken")

    monkeypatch.setattr(dashboard_module, "load_trace", refuse)
    trace = dash.trace
    dash.picker.value = "conversation"
    assert dash.picker.value == "synthetic" and dash.trace is trace
    assert "conversation.jsonl:7: broken" in dash.error.value
    assert not dash.progress.shown


def test_progress_is_shown_while_loading_and_replaying(dash: Dashboard, monkeypatch) -> None:
    seen: list[tuple[bool, str]] = []
    load, replay = dashboard_module.load_trace, replay_panel_module.replay

    def loading(path: object) -> object:
        seen.append((dash.progress.shown, dash.progress.label.value))
        return load(path)

    def replaying(*args: object, **kwargs: object) -> object:
        seen.append((dash.progress.shown, dash.progress.label.value))
        return replay(*args, **kwargs)

    monkeypatch.setattr(dashboard_module, "load_trace", loading)
    monkeypatch.setattr(replay_panel_module, "replay", replaying)
    dash.picker.value = "conversation"
    assert seen == [(True, "loading conversation (bundled)…"), (True, "replaying 12,031 requests…")]
    assert not dash.progress.shown and dash.progress.label.value == ""
    seen.clear()
    dash.replay.capacity.value = 1_000  # a student moving the slider
    assert seen == [(True, "replaying 12,031 requests…")]
    assert not dash.progress.shown


def test_progress_nests_and_steps() -> None:
    progress = Progress()
    with progress.task("outer", steps=3):
        assert (progress.bar.max, progress.bar.value) == (3, 0)
        with progress.task("inner"):
            assert progress.label.value == "inner" and progress.bar.max == 3
        assert progress.shown
        progress.step("next")
        progress.step("next")
        progress.step("next")
        progress.step("past the end")
        assert progress.bar.value == 3 and progress.label.value == "past the end"
    assert not progress.shown
    with pytest.raises(RuntimeError), progress.task("failing"):
        raise RuntimeError
    assert not progress.shown and progress._depth == 0
    with progress.task("one step"):
        assert (progress.bar.max, progress.bar.value) == (1, 1)


def test_starting_file_and_bad_arguments(tmp_path: Path) -> None:
    path = tmp_path / "start.jsonl"
    path.write_bytes(jsonl(GOOD))
    dash = Dashboard(str(path), cluster_requests=2)
    assert dash.picker.value == str(path.resolve())
    assert dash.picker.label == "start.jsonl (file)" and dash.trace.frame.height == 3
    with pytest.raises(ValueError, match="cluster_requests must be an integer >= 1, got 0"):
        Dashboard("synthetic", cluster_requests=0)
    with pytest.raises(FileNotFoundError, match="no trace file at nope.jsonl"):
        Dashboard("nope.jsonl")
    (tmp_path / "bad.jsonl").write_bytes(BAD)
    with pytest.raises(TraceFormatError, match=r"bad\.jsonl:2: missing field 'output_length'"):
        Dashboard(str(tmp_path / "bad.jsonl"))


def test_prepare_page_renders_offline() -> None:
    import altair as alt

    from kvlab.ui.dashboard import prepare_page

    active, options = alt.renderers.active, alt.renderers.options
    try:
        prepare_page()
        # altair's offline "jupyter" renderer, or kvlab's LiveChart one (kvlab.viz.live): not the CDN default
        assert alt.renderers.active in ("jupyter", "kvlab")
    finally:
        alt.renderers.enable(active, **options)
    if importlib.util.find_spec("kvlab.viz.live") is not None:  # LiveChart's runtime already built
        assert importlib.import_module("kvlab.viz.live").vega_runtime.cache_info().currsize == 1


def test_a_token_count_upload_is_explained_and_not_offered(dash: Dashboard) -> None:
    trace, options = dash.trace, dash.picker.options
    upload(dash, "azure.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    assert "azure.csv (azure-llm format) has arrivals and token counts only, no block keys" in dash.error.value
    assert "kvlab-upload-" not in dash.error.value
    assert dash.trace is trace and dash.picker.options == options


def test_the_picker_offers_the_bundled_traces_with_block_keys(dash: Dashboard) -> None:
    bundled = [value for label, value in dash.picker.options if label.endswith("(bundled)")]
    assert bundled == ["conversation", "synthetic", "claude-code", "ragpulse"]
