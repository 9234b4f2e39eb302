"""Process-wide counts of model work, kept by the stages that do it.

Every :class:`~funnel_core.rerank.base.Reranker` adds one *call* and the number of (query, text)
pairs it scored each time its :meth:`~funnel_core.rerank.base.Reranker.score` runs (warm-up
batches included), and every :class:`~funnel_core.llm.LLM` adds its calls and, where the provider
knows them, its prompt and completion tokens. The evaluation harness reads :func:`snapshot`
before and after each query and keeps the difference, so its cost columns are counted, not
estimated. Counting is a few integer additions under a lock; it never touches a model.
"""

from __future__ import annotations

import threading

__all__ = ["COUNTER_NAMES", "add", "snapshot", "difference"]

#: What is counted: reranker calls and (query, text) pairs, LLM calls and tokens. ``fid_passages``
#: is the share of ``pairs_scored`` that a FiD reader's cross-attention scored (a FiD passage costs
#: an encoder pass plus its share of the decoder's, unlike a cross-encoder pair).
COUNTER_NAMES = ("model_calls", "pairs_scored", "fid_passages", "llm_calls", "llm_prompt_tokens",
                 "llm_completion_tokens")

_lock = threading.Lock()
_totals = dict.fromkeys(COUNTER_NAMES, 0)


def add(**counts: int) -> None:
    """Add to the process-wide totals, e.g. ``add(model_calls=1, pairs_scored=10)``."""
    unknown = set(counts) - set(COUNTER_NAMES)
    if unknown:
        raise KeyError(f"unknown counter(s) {sorted(unknown)}; the counters are {COUNTER_NAMES}.")
    with _lock:
        for name, n in counts.items():
            _totals[name] += int(n)


def snapshot() -> dict[str, int]:
    """The totals so far in this process (a copy)."""
    with _lock:
        return dict(_totals)


def difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """``after - before`` per counter (what ran between two snapshots)."""
    return {name: after.get(name, 0) - before.get(name, 0) for name in COUNTER_NAMES}
