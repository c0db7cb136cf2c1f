"""Traces: real workloads (Mooncake, Claude Code, RAGPulse, Azure, Bailian …) and seeded synthetic
ones, as a :class:`Trace`.

==============================  ======================================================
name                            what
==============================  ======================================================
:class:`Trace`                  polars frame (one row per request) + block size + source
:meth:`Trace.from_arrays`       a trace from numpy arrays (object ids, or CSR block keys)
:func:`load_trace`              open any supported file or folder (dispatch on content)
:data:`FORMATS`                 the formats it knows (:class:`TraceFormat`), in detection order
:func:`load_mooncake`           Mooncake FAST'25 JSONL (512-token chained hash ids)
:func:`load_kv_cache_tester`    kv-cache-tester / WEKA Claude Code JSON (file or folder, 64-token local ids)
:func:`load_bailian`            Alibaba Bailian / Qwen JSONL (16-token per-block ids, re-chained)
:func:`load_servegen`           ServeGen offline batch JSONL (arrivals synthesized at a rate)
:func:`load_azure_llm`          Azure LLM inference CSV (token counts only: no block identity)
:func:`load_vidur`              Vidur processed trace CSV (token counts only: no block identity)
:func:`load_ragpulse`           RAGPulse folder (segment ids chained into block keys, segment lists kept)
:func:`chat_sessions`           shared system prompt + multi-turn chat sessions
:func:`zipf_objects`            one-object requests from a bounded Zipf distribution
:func:`synthesize_prefix`       a stated synthetic prefix-sharing model for token-count traces
:func:`rag`                     Opal's RAG workload: system prompt + k reused documents
:class:`FlatTrace`              CSR form for the kernels (offsets + dense block ids)
==============================  ======================================================
"""

from kvlab.traces.bailian import load_bailian
from kvlab.traces.errors import TraceFormatError
from kvlab.traces.flat import FlatTrace
from kvlab.traces.kv_cache_tester import load_kv_cache_tester
from kvlab.traces.load import FORMATS, detect_format, load_trace
from kvlab.traces.mooncake import MOONCAKE_BLOCK_SIZE, load_mooncake
from kvlab.traces.rag import rag
from kvlab.traces.ragpulse import load_ragpulse
from kvlab.traces.servegen import load_servegen
from kvlab.traces.sniff import Peek, TraceFormat
from kvlab.traces.stats import TraceStats
from kvlab.traces.synthesize import synthesize_prefix
from kvlab.traces.synthetic import ChatWorkload, chat_sessions, zipf_objects
from kvlab.traces.token_counts import load_azure_llm, load_vidur
from kvlab.traces.trace import Trace

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "FORMATS",
    "ChatWorkload",
    "FlatTrace",
    "Trace",
    "TraceFormatError",
    "TraceStats",
    "Peek",
    "TraceFormat",
    "chat_sessions",
    "detect_format",
    "load_azure_llm",
    "load_bailian",
    "load_kv_cache_tester",
    "load_mooncake",
    "load_ragpulse",
    "load_servegen",
    "load_vidur",
    "load_trace",
    "rag",
    "synthesize_prefix",
    "zipf_objects",
]
