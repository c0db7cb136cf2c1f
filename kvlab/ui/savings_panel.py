"""An ipywidgets panel over CacheBlend's savings: documents per request and shuffling vs tokens saved."""

from __future__ import annotations

import ipywidgets as widgets

from kvlab.blend.replay import RagSummary, replay_rag
from kvlab.core import RunResult
from kvlab.core.validate import check_positive
from kvlab.traces import rag


def savings_text(summary: RagSummary) -> str:
    """The two saved fractions of a :func:`kvlab.blend.replay_rag` summary, as HTML.

    Raises:
        ValueError: not a :class:`~kvlab.blend.replay.RagSummary`.

    Example:
        >>> trace = rag(4, num_documents=3, document_tokens=512, system_prompt_tokens=256, docs_per_request=2,
        ...             order="shuffled", seed=0)
        >>> savings_text(replay_rag(trace).summary)
        'prefix only saves <b>35.0%</b> of prefill tokens, prefix + blend <b>60.5%</b>'
    """
    if not isinstance(summary, RagSummary):
        raise ValueError(f"summary must be a replay_rag RagSummary, got {type(summary).__name__}")
    return (f"prefix only saves <b>{summary.prefix_only_saved_fraction:.1%}</b> of prefill tokens, "
            f"prefix + blend <b>{summary.saved_fraction:.1%}</b>")


class SavingsPanel:
    """Documents-per-request and shuffle-probability sliders over :func:`kvlab.blend.replay_rag`.

    Each change generates Opal's RAG workload (:func:`kvlab.traces.rag`) with that many
    documents per request, shuffled with that probability, replays it through prefix-only and
    prefix + blend caching (:meth:`compute`, a pure function of the slider values) and shows
    both saved fractions (:func:`savings_text`). Display the panel itself, or ``panel.ui``.

    Args:
        num_requests: requests per replay (≥ 1).
        docs_per_request: the initial number of documents per request (1 .. ``num_documents``).
        rag_options: the other :func:`kvlab.traces.rag` arguments (``num_documents`` (default 10),
            ``document_tokens``, ``system_prompt_tokens``, ``seed`` ...).

    Raises:
        ValueError: a bad count, or a workload :func:`kvlab.traces.rag` refuses.

    Example:
        >>> panel = SavingsPanel(6, num_documents=3, document_tokens=512, system_prompt_tokens=256)
        >>> panel.docs.value, panel.shuffle.value
        (3, 0.0)
        >>> panel.shuffle.value = 1.0  # as a user moving the slider
        >>> panel.result.summary.saved_fraction > panel.result.summary.prefix_only_saved_fraction
        True
    """

    def __init__(self, num_requests: int = 200, *, docs_per_request: int = 4, **rag_options: object) -> None:
        self.num_requests = check_positive("num_requests", num_requests)
        self.rag_options = {"num_documents": 10, **rag_options}
        num_documents = check_positive("num_documents", self.rag_options["num_documents"])
        value = min(check_positive("docs_per_request", docs_per_request), num_documents)
        style, layout = {"description_width": "initial"}, widgets.Layout(width="360px")  # labels never clipped
        self.docs = widgets.IntSlider(value=value, min=1, max=num_documents, description="documents per request",
                                      continuous_update=False, style=style, layout=layout)
        self.shuffle = widgets.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.25, description="shuffle probability",
                                           continuous_update=False, style=style, layout=layout)
        self.summary = widgets.HTML()
        self.result: RunResult = self.compute()
        self.summary.value = savings_text(self.result.summary)
        self.ui = widgets.VBox([widgets.HBox([self.docs, self.shuffle]), self.summary])
        for control in (self.docs, self.shuffle):
            control.observe(self._on_change, names="value")

    def compute(self) -> RunResult:
        """Generate and replay the workload the sliders describe (no widget is changed)."""
        trace = rag(self.num_requests, docs_per_request=self.docs.value, order=self.shuffle.value, **self.rag_options)
        return replay_rag(trace)

    def refresh(self) -> None:
        """Recompute and show the saved fractions."""
        self.result = self.compute()
        self.summary.value = savings_text(self.result.summary)

    def _on_change(self, _change: dict) -> None:
        self.refresh()

    def _repr_mimebundle_(self, **kwargs: object) -> dict:
        return self.ui._repr_mimebundle_(**kwargs)


def savings_panel(num_requests: int = 200, **rag_options: object) -> SavingsPanel:
    """Build a :class:`SavingsPanel` (display it in a notebook cell)."""
    return SavingsPanel(num_requests, **rag_options)
