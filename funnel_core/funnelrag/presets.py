"""Ready-made funnels.

:func:`funnelrag` builds the paper's three-stage funnel in one call::

    clustered BM25 (top-k clusters, opened into documents)
      >> pre-ranker on documents % k_documents        (cross-encoder in the paper)
      >> later chunking into ~passage_words passages
      >> post-ranker on passages % k_passages          (FiD cross-attention in the paper)

``preset="paper"`` takes the paper's Table 2 setting for NQ (600K -> 80 clusters -> 8 documents ->
4 passages of ~100 words, FiD post-ranking): ``k_clusters=80`` and a post-ranker that must be a FiD
reader, given as a checkpoint (hub name or folder, loaded by
:class:`~funnel_core.rerank.fid.FiDAttentionScorer`) or as a ``FiDAttentionScorer``.
``preset="paper-tqa"`` is Table 2's TQA row: the same, but 12 documents after pre-ranking
(80 clusters -> 12 documents -> 4 passages).
``preset="default"`` retrieves 10 clusters (a size for small corpora and CPUs) and post-ranks
with the pre-ranker when no post-ranker is given.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.funnel import Funnel, Stage
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
from funnel_core.units import Unit

__all__ = ["funnelrag", "renamed", "PRESETS", "FID_PRESETS"]

#: Cut-offs of each preset: clusters, documents, passages, passage words. ``"paper"`` is
#: FunnelRAG Table 2's NQ row (600K -> 80c -> 8d -> 4p, ~100-word passages); ``"paper-tqa"`` its
#: TQA row (80c -> 12d; passages as the NQ row).
PRESETS: dict[str, dict[str, int]] = {
    "default": {"k_clusters": 10, "k_documents": 8, "k_passages": 4, "passage_words": 100},
    "paper": {"k_clusters": 80, "k_documents": 8, "k_passages": 4, "passage_words": 100},
    "paper-tqa": {"k_clusters": 80, "k_documents": 12, "k_passages": 4, "passage_words": 100},
}

#: The presets of the paper's Table 2, which post-rank with a FiD reader.
FID_PRESETS = frozenset({"paper", "paper-tqa"})


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


def _fid_post_ranker(spec: Any, preset: str, **kwargs: Any) -> Stage:
    from funnel_core.rerank.fid import FiDAttentionScorer

    if isinstance(spec, FiDAttentionScorer):
        return renamed(spec, "post_ranking")
    if isinstance(spec, str) and spec:
        return FiDAttentionScorer(model=spec, name="post_ranking", **kwargs)
    raise ValueError(
        f"preset={preset!r} post-ranks with a FiD reader (FunnelRAG Table 2): pass post_ranker= a "
        "T5 / FiD checkpoint (hub name or folder) or a FiDAttentionScorer, got "
        f"{spec!r}; or use preset='default' to post-rank with the pre-ranker.")


def funnelrag(documents: Sequence[Unit] | ClusteredBM25Index, pre_ranker: Stage | str,
              post_ranker: Stage | str | None = None, *, preset: str = "default",
              k_clusters: int | None = None, k_documents: int | None = None,
              k_passages: int | None = None, passage_words: int | None = None,
              max_tokens: int = 4096, k_retrieved: int | None = None,
              fid_kwargs: dict[str, Any] | None = None, exit_margin: float | None = None,
              **ranker_kwargs: Any) -> Funnel:
    """The FunnelRAG pipeline: retrieval -> pre-ranking -> post-ranking.

    Args:
        documents: The corpus (clustered here) or an already built :class:`ClusteredBM25Index`
            (or :class:`~funnel_core.backends.milvus.MilvusClusteredBM25Index`).
        pre_ranker: Document scorer: a stage (e.g. ``CrossEncoderScorer``) or a cross-encoder
            hub name / local folder.
        post_ranker: Passage scorer (e.g. ``FiDAttentionScorer``); defaults to the pre-ranker
            (``preset="default"``). With ``preset="paper"`` or ``"paper-tqa"`` it is required and is
            a FiD reader: a checkpoint name / folder or a ``FiDAttentionScorer``.
        preset: ``"default"`` (10 clusters), ``"paper"`` (Table 2, NQ: 80 clusters, 8 documents,
            4 passages, FiD post-ranking) or ``"paper-tqa"`` (Table 2, TQA: 80 clusters,
            12 documents, 4 passages, FiD post-ranking); see :data:`PRESETS`.
        k_clusters: Clusters retrieved by BM25 (default: the preset's, 10 or 80).
        k_documents: Documents kept by the pre-ranker (preset: 8; 12 for ``"paper-tqa"``).
        k_passages: Passages kept by the post-ranker (preset: 4).
        passage_words: Size of the passages cut by later chunking (preset: 100).
        fid_kwargs: ``FiDAttentionScorer`` settings when a paper preset builds it from a
            checkpoint name (e.g. ``device``, ``batch_size``).
        max_tokens: Cluster size S when clustering ``documents``.
        k_retrieved: Documents kept from the opened clusters, best first, before pre-ranking
            (``None``: all of them); the retrieval stage is cut with ``% k_retrieved``.
        exit_margin: Skip the post-ranker for a query whose best pre-ranked document leads the
            next by at least this much (:class:`~funnel_core.funnelrag.early_exit.ConfidentExit`;
            ours, not the paper's); ``None`` (default): always post-rank.
        **ranker_kwargs: Passed to ``CrossEncoderScorer`` when a ranker is given by name.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}.")
    given = {"k_clusters": k_clusters, "k_documents": k_documents, "k_passages": k_passages,
             "passage_words": passage_words}
    cuts = {name: check_positive_int(PRESETS[preset][name] if value is None else value, name)
            for name, value in given.items()}
    k_clusters, k_documents = cuts["k_clusters"], cuts["k_documents"]
    k_passages, passage_words = cuts["k_passages"], cuts["passage_words"]
    # an index with the clustered search interface (ClusteredBM25Index, or
    # funnel_core.backends.milvus.MilvusClusteredBM25Index) is used as is
    built = isinstance(documents, ClusteredBM25Index) or callable(getattr(documents, "search", None))
    index: Any = documents if built else \
        ClusteredBM25Index(max_tokens=max_tokens).index(documents)  # type: ignore[arg-type]
    retrieve: Stage = ClusteredBM25Retrieve(index, k=k_clusters, name="retrieval")
    if k_retrieved is not None:
        retrieve = retrieve % check_positive_int(k_retrieved, "k_retrieved")
    pre = _ranker(pre_ranker, "pre_ranking", **ranker_kwargs)
    if preset in FID_PRESETS:
        post = _fid_post_ranker(post_ranker, preset, **(fid_kwargs or {}))
    else:
        post = renamed(pre, "post_ranking") if post_ranker is None else \
            _ranker(post_ranker, "post_ranking", **ranker_kwargs)  # a shallow copy shares the model
    if exit_margin is not None:
        from funnel_core.funnelrag.early_exit import ConfidentExit

        post = ConfidentExit(post, exit_margin)  # named as the post-ranker it wraps: post_ranking
    return Funnel([retrieve, pre % k_documents, LaterChunking(words=passage_words, name="later_chunking"),
                   post % k_passages])
