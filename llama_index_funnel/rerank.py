"""LlamaIndex node postprocessors for FunnelRAG's pre-ranking stage.

* :class:`CrossEncoderRerank` — cross-encoder reranking (sentence-transformers, FlagEmbedding or
  plain transformers backend) with ``batch_size``, ``device``, ``max_length``, ``normalize``,
  ``score_threshold`` and ``top_n``;
* :class:`MonoT5Rerank` — monoT5 reranking (``true``/``false`` logits of a T5 model);
* :class:`LaterChunkingPostprocessor` — FunnelRAG's later chunking: splits retrieved nodes into
  ~100-word passages that point to their parent node (``NodeRelationship.PARENT``) and carry the
  parent's score, so a reranker placed after it scores finer units.

All three are plain ``BaseNodePostprocessor`` objects: put them in ``node_postprocessors`` of any
query engine. They copy nodes (never mutate the retriever's), keep earlier scores in
``metadata["scores"]``, emit ``ReRankStartEvent``/``ReRankEndEvent``, and have a real async path.
Models load lazily, on the first query.
"""

from __future__ import annotations

from typing import Any, Optional

from llama_index.core.bridge.pydantic import Field

from funnel_core.funnel import Stage
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.monot5 import DEFAULT_MONOT5, MonoT5Scorer
from funnel_core.text import LaterChunking
from llama_index_funnel._base import StagePostprocessor

__all__ = ["CrossEncoderRerank", "MonoT5Rerank", "LaterChunkingPostprocessor"]


class _ModelRerank(StagePostprocessor):
    top_n: Optional[int] = Field(default=None, description="Nodes to keep (None: all).")
    batch_size: int = Field(default=32, description="Pairs per forward pass.")
    device: Optional[str] = Field(default=None, description="cpu / cuda / mps; None = automatic.")
    max_length: int = Field(default=512, description="Tokens per (query, passage) pair; the "
                            "passage is truncated, never the query.")
    fp16: Optional[bool] = Field(default=None, description="Half precision, CUDA only.")
    sort_by_length: bool = Field(default=True, description="Batch pairs of similar length.")
    normalize: bool = Field(default=False, description="Sigmoid scores into (0, 1).")
    score_threshold: Optional[float] = Field(default=None,
                                             description="Drop nodes scoring below this.")

    def model_post_init(self, __context: Any) -> None:
        # Build the stage now: it validates every setting (the model itself still loads lazily).
        self._stage = self._build_stage()


class CrossEncoderRerank(_ModelRerank):
    """Rerank nodes with a cross-encoder (FunnelRAG's pre-ranker).

    Example::

        rerank = CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", backend="flagembedding",
                                    top_n=8, device="cuda")
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    model: Optional[str] = Field(default=None, description="Hub name or local folder; None = "
                                 "the backend's default model.")
    backend: str = Field(default="sentence-transformers",
                         description="sentence-transformers | flagembedding | transformers")
    fuse_weight: Optional[float] = Field(default=None, description="Weight of the previous "
                                         "score in a min-max interpolation; None = off.")
    bf16: bool = Field(default=False, description="bfloat16 autocast (transformers backend).")
    window_words: Optional[int] = Field(default=None, description="Score texts longer than this "
                                        "many words by their best window (MaxP); None = truncate.")
    window_overlap: int = Field(default=0, description="Words shared by consecutive windows.")

    @classmethod
    def class_name(cls) -> str:
        return "CrossEncoderRerank"

    def _build_stage(self) -> Stage:
        return CrossEncoderScorer(self.model, backend=self.backend, batch_size=self.batch_size,
                                  device=self.device, max_length=self.max_length, fp16=self.fp16,
                                  sort_by_length=self.sort_by_length, normalize=self.normalize,
                                  top_n=self.top_n, score_threshold=self.score_threshold,
                                  fuse_weight=self.fuse_weight, bf16=self.bf16,
                                  window_words=self.window_words,
                                  window_overlap=self.window_overlap)

    def _model_name(self) -> str:
        return self.stage.model_name  # type: ignore[attr-defined]


class MonoT5Rerank(_ModelRerank):
    """Rerank nodes with monoT5 (``castorini/monot5-base-msmarco`` by default)."""

    model: str = Field(default=DEFAULT_MONOT5, description="Hub name or local folder.")
    batch_size: int = Field(default=16, description="Prompts per forward pass.")

    @classmethod
    def class_name(cls) -> str:
        return "MonoT5Rerank"

    def _build_stage(self) -> Stage:
        return MonoT5Scorer(self.model, batch_size=self.batch_size, device=self.device,
                            max_length=self.max_length, fp16=self.fp16,
                            sort_by_length=self.sort_by_length, normalize=self.normalize,
                            top_n=self.top_n, score_threshold=self.score_threshold)


class LaterChunkingPostprocessor(StagePostprocessor):
    """Split retrieved nodes into ~``words``-word passages (FunnelRAG section 3.1.3).

    Each passage is a ``TextNode`` with a ``PARENT`` relationship to its node, the parent's score
    (as its score and in ``metadata["parent_score"]``) and its ``metadata["position"]``. Passages
    are emitted parent by parent in the parents' rank order.
    """

    words: int = Field(default=100, description="Target passage size in words.")
    overlap: int = Field(default=0, description="Words repeated between consecutive passages.")
    sentence_aware: bool = Field(default=True, description="End passages at sentence ends.")
    level: str = Field(default="passage", description="Granularity name of the passages.")

    def model_post_init(self, __context: Any) -> None:
        self._stage = self._build_stage()

    @classmethod
    def class_name(cls) -> str:
        return "LaterChunkingPostprocessor"

    def _build_stage(self) -> Stage:
        return LaterChunking(words=self.words, overlap=self.overlap, level=self.level,
                             sentence_aware=self.sentence_aware)
