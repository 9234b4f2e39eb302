"""Ready-made funnels.

:func:`funnelrag` builds the paper's three-stage funnel in one call::

    clustered BM25 (top-k clusters, opened into documents)
      >> pre-ranker on documents % k_documents        (cross-encoder in the paper)
      >> later chunking into ~passage_words passages
      >> post-ranker on passages % k_passages          (FiD cross-attention in the paper)
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.funnel import Funnel, Stage
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
from funnel_core.units import Unit

__all__ = ["funnelrag", "renamed"]


def renamed(stage: Stage, name: str) -> Stage:
    """A shallow copy of ``stage`` under another name (to use one model at two funnel stages
    without their scores overwriting each other in the score history, ``Unit.scores``)."""
    new = copy.copy(stage)
    new.name = name
    return new


def _ranker(spec: Any, name: str, **kwargs: Any) -> Stage:
    if isinstance(spec, Stage):
        return renamed(spec, name)
    if isinstance(spec, str):
        from funnel_core.rerank.cross_encoder import CrossEncoderScorer

        return CrossEncoderScorer(model=spec, name=name, **kwargs)
    raise TypeError(f"{name} must be a funnel_core Stage or a cross-encoder name/folder, got "
                    f"{type(spec).__name__}.")


def funnelrag(documents: Sequence[Unit] | ClusteredBM25Index, pre_ranker: Stage | str,
              post_ranker: Stage | str | None = None, *, k_clusters: int = 10,
              k_documents: int = 8, k_passages: int = 4, passage_words: int = 100,
              max_tokens: int = 4096, k_retrieved: int | None = None,
              **ranker_kwargs: Any) -> Funnel:
    """The FunnelRAG pipeline: retrieval -> pre-ranking -> post-ranking.

    Args:
        documents: The corpus (clustered here) or an already built :class:`ClusteredBM25Index`
            (or :class:`~funnel_core.backends.milvus.MilvusClusteredBM25Index`).
        pre_ranker: Document scorer: a stage (e.g. ``CrossEncoderScorer``) or a cross-encoder
            hub name / local folder.
        post_ranker: Passage scorer (e.g. ``FiDAttentionScorer``); defaults to the pre-ranker.
        k_clusters: Clusters retrieved by BM25.
        k_documents: Documents kept by the pre-ranker.
        k_passages: Passages kept by the post-ranker.
        passage_words: Size of the passages cut by later chunking.
        max_tokens: Cluster size S when clustering ``documents``.
        k_retrieved: Documents kept from the opened clusters, best first, before pre-ranking
            (``None``: all of them); the retrieval stage is cut with ``% k_retrieved``.
        **ranker_kwargs: Passed to ``CrossEncoderScorer`` when a ranker is given by name.
    """
    for value, name in ((k_clusters, "k_clusters"), (k_documents, "k_documents"),
                        (k_passages, "k_passages"), (passage_words, "passage_words")):
        check_positive_int(value, name)
    # an index with the clustered search interface (ClusteredBM25Index, or
    # funnel_core.backends.milvus.MilvusClusteredBM25Index) is used as is
    built = isinstance(documents, ClusteredBM25Index) or callable(getattr(documents, "search", None))
    index: Any = documents if built else \
        ClusteredBM25Index(max_tokens=max_tokens).index(documents)  # type: ignore[arg-type]
    retrieve: Stage = ClusteredBM25Retrieve(index, k=k_clusters, name="retrieval")
    if k_retrieved is not None:
        retrieve = retrieve % check_positive_int(k_retrieved, "k_retrieved")
    pre = _ranker(pre_ranker, "pre_ranking", **ranker_kwargs)
    post = renamed(pre, "post_ranking") if post_ranker is None else \
        _ranker(post_ranker, "post_ranking", **ranker_kwargs)  # a shallow copy shares the model
    return Funnel([retrieve, pre % k_documents, LaterChunking(words=passage_words, name="later_chunking"),
                   post % k_passages])
