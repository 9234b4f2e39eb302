"""BM25 over `bm25s <https://github.com/xhluca/bm25s>`_: the in-memory index and its stage.

* :mod:`~funnel_core.bm25.index`: :class:`BM25Index` (build, search (batched, filtered), add,
  delete, save/load that remember every tokenizer setting), :class:`BM25Retrieve`,
  :func:`bm25_scores`;
* :mod:`~funnel_core.bm25.counts`: term counts and BM25 weights from counts (the build path of
  :meth:`BM25Index.index_counts`);
* ``funnel_core.bm25._numba``: the compiled batch search (``engine="numba"``), imported only when
  an index uses it.

The public names are re-exported here (``from funnel_core.bm25 import BM25Index``).
"""

from funnel_core.bm25.counts import COUNT_METHODS, TermCounts, bm25_weights, count_terms
from funnel_core.bm25.index import FILTER_CACHE_SIZE, METHODS, BM25Index, BM25Retrieve, bm25_scores, validate_config

__all__ = [
    "BM25Index",
    "BM25Retrieve",
    "bm25_scores",
    "METHODS",
    "FILTER_CACHE_SIZE",
    "validate_config",
    "TermCounts",
    "count_terms",
    "bm25_weights",
    "COUNT_METHODS",
]
