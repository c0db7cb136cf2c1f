"""The CacheBlend savings panel, driven headlessly: move the sliders, read the text and the result."""

from __future__ import annotations

import pytest

from kvlab.traces import rag
from kvlab.ui import SavingsPanel, savings_panel, savings_text

CORPUS = {"num_documents": 3, "document_tokens": 512, "system_prompt_tokens": 256, "seed": 0}
PROMPT_1 = 256 + 512  # one document: 3 chunks of 256 tokens


def prefix_saved_fraction(num_requests: int) -> float:
    """One document per request, unbounded cache, computed by hand: after the first request the system
    prompt is a prefix hit, and the whole prompt when its document came before (whole-prompt hits count)."""
    docs = [ids[0] for ids in rag(num_requests, docs_per_request=1, **CORPUS).frame["document_ids"].to_list()]
    saved = [0 if r == 0 else PROMPT_1 if d in docs[:r] else 256 for r, d in enumerate(docs)]
    return sum(saved) / (num_requests * PROMPT_1)


def test_sliders_rerun_the_replay_and_update_the_text() -> None:
    panel = savings_panel(8, **CORPUS)
    assert (panel.docs.value, panel.docs.max, panel.shuffle.value) == (3, 3, 0.0)
    panel.docs.value = 1  # as a user moving the slider
    expected = prefix_saved_fraction(8)
    s = panel.result.summary
    assert s.prefix_only_saved_fraction == pytest.approx(expected) and s.saved_fraction == pytest.approx(expected)
    assert s.blended_tokens == 0  # one document: nothing to blend
    assert panel.summary.value == (f"prefix only saves <b>{expected:.1%}</b> of prefill tokens, "
                                   f"prefix + blend <b>{expected:.1%}</b>")
    panel.docs.value, panel.shuffle.value = 3, 1.0
    shuffled = panel.result.summary
    assert shuffled.saved_fraction > shuffled.prefix_only_saved_fraction  # blend wins back the reordered documents
    assert panel.result.requests.height == 8 and panel.summary.value == savings_text(shuffled)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_requests must be an integer >= 1, got 0"):
        SavingsPanel(0)
    with pytest.raises(ValueError, match="summary must be a replay_rag RagSummary"):
        savings_text({"saved_fraction": 0.5})
