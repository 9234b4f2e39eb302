"""LlamaIndex node postprocessors for FunnelRAG's pre-ranking stage.

* :class:`CrossEncoderRerank` — cross-encoder reranking (sentence-transformers, FlagEmbedding or
  plain transformers backend) with ``batch_size``, ``device``, ``max_length``, ``normalize``,
  ``score_threshold`` and ``top_n``;
* :class:`MonoT5Rerank` — monoT5 reranking (``true``/``false`` logits of a T5 model);
* :class:`LaterChunkingPostprocessor` — FunnelRAG's later chunking: splits retrieved nodes into
  ~100-word passages that point to their parent node (``NodeRelationship.PARENT``) and carry the
  parent's score, so a reranker placed after it scores finer units.

All three are plain ``BaseNodePostprocessor`` objects: put them in ``node_postprocessors`` of any
query engine. They copy nodes (never mutate the retriever's), keep earlier scores in flat
``funnel_score_<stage>`` metadata keys (hidden from LLM and embedder), emit
``ReRankStartEvent``/``ReRankEndEvent``, and have a real async path. Models load lazily, on the
first query. Each field is a setting of the ``funnel_core`` stage the postprocessor holds
(``.stage``); an edit is forwarded to it and honoured at the next call.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from llama_index.core.bridge.pydantic import Field

from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.monot5 import MonoT5Scorer
from llama_index_funnel._base import StagePostprocessor

__all__ = ["CrossEncoderRerank", "MonoT5Rerank", "LaterChunkingPostprocessor"]


class CrossEncoderRerank(StagePostprocessor):
    """Rerank nodes with a cross-encoder (FunnelRAG's pre-ranker): a
    :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer`.

    Scores are sigmoid probabilities in (0, 1) by default (``normalize=True``), the scale of
    LlamaIndex's ``SentenceTransformerRerank``, so ``SimilarityPostprocessor(similarity_cutoff=0.5)``
    after it keeps the nodes the model calls relevant; ``normalize=False`` gives raw logits (the
    order is the same either way).

    Example::

        rerank = CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", library="flagembedding",
                                    top_n=8, device="cuda")
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    stage_class: ClassVar[type] = CrossEncoderScorer

    model: Optional[str] = Field(
        default=None, description="Hub name or local folder; None = the backend's default model.")
    library: str = Field(
        default="sentence-transformers",
        description="Model library: sentence-transformers | flagembedding | transformers.")
    batch_size: int = Field(default=32, description='Pairs per forward pass.')
    device: Optional[str] = Field(default=None, description='cpu / cuda / mps; None = automatic.')
    max_length: int = Field(
        default=512, description='Tokens per (query, passage) pair; the passage is truncated, never the query.')
    sort_by_length: bool = Field(default=True, description='Batch pairs of similar length.')
    normalize: bool = Field(
        default=True, description="Sigmoid scores into (0, 1), as the framework's own cross-encoder "
                                  "rerankers give them (so a 0.5 similarity cut-off means 'relevant'); "
                                  "False: the model's raw logits (the core CrossEncoderScorer's default).")
    top_n: Optional[int] = Field(default=None, description='Units to keep (None: all).')
    score_threshold: Optional[float] = Field(
        default=None, description='Drop units scoring below this.')
    window_words: Optional[int] = Field(
        default=None, description='Score texts longer than this many words by their best window (MaxP); None = truncate.')
    window_overlap: int = Field(default=0, description='Words shared by consecutive windows.')
    fuse_weight: Optional[float] = Field(
        default=None, description='Weight of the previous score in a min-max interpolation; None = off.')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces and score histories.')
    model_kwargs: Optional[dict[str, Any]] = Field(
        default=None, description='Extra keyword arguments of the model loader.')
    runtime: str = Field(
        default='auto', description='auto | torch | onnx | openvino (auto: torch on a GPU, the fastest runtime within 0.005 nDCG@10 of fp32 measured on a CPU).')
    export_dir: Optional[str] = Field(
        default=None, description='Folder of the ONNX export; None = next to the model or the user cache.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (torch runtime; auto: bf16 only where the hardware runs it natively).')

    @classmethod
    def class_name(cls) -> str:
        return "CrossEncoderRerank"

    def _model_name(self) -> str:
        return self.stage.model_name  # type: ignore[union-attr]


class MonoT5Rerank(StagePostprocessor):
    """Rerank nodes with monoT5 (``castorini/monot5-base-msmarco`` by default): a
    :class:`~funnel_core.rerank.monot5.MonoT5Scorer`."""

    stage_class: ClassVar[type] = MonoT5Scorer

    model: str = Field(
        default='castorini/monot5-base-msmarco', description='Hub name or local folder.')
    batch_size: int = Field(default=16, description='Prompts per forward pass.')
    device: Optional[str] = Field(default=None, description='cpu / cuda / mps; None = automatic.')
    max_length: int = Field(
        default=512, description='Tokens per prompt; the passage is truncated, never the query.')
    sort_by_length: bool = Field(default=True, description='Batch prompts of similar length.')
    template: str = Field(
        default='Query: {query} Document: {document} Relevant:', description='Prompt with {query} before {document}.')
    true_token: str = Field(default='true', description='Token whose probability is the relevance.')
    false_token: str = Field(default='false', description='The other token of the binary choice.')
    normalize: bool = Field(default=False, description='Sigmoid scores into (0, 1).')
    top_n: Optional[int] = Field(default=None, description='Units to keep (None: all).')
    score_threshold: Optional[float] = Field(
        default=None, description='Drop units scoring below this.')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces and score histories.')
    model_kwargs: Optional[dict[str, Any]] = Field(
        default=None, description='Extra keyword arguments of the model loader.')
    dtype: str = Field(
        default='auto', description='auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively, fp16 on older GPUs, else fp32).')

    @classmethod
    def class_name(cls) -> str:
        return "MonoT5Rerank"


class LaterChunkingPostprocessor(StagePostprocessor):
    """Split retrieved nodes into ~``words``-word passages (FunnelRAG section 3.1.3).

    Each passage is a ``TextNode`` with a ``PARENT`` relationship to its node (and the node's
    ``SOURCE``), the parent's score, its position as ``funnel_...`` metadata keys, and the
    parent's metadata and excluded keys. Passages are emitted parent by parent in the parents'
    rank order (a :class:`~funnel_core.funnelrag.chunking.LaterChunking` stage).
    """

    stage_class: ClassVar[type] = LaterChunking

    words: int = Field(default=100, description='Target passage size in words.')
    overlap: int = Field(default=0, description='Words repeated between consecutive passages.')
    level: str = Field(default='passage', description='Granularity name of the passages.')
    sentence_aware: bool = Field(default=True, description='End passages at sentence ends.')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces (None: later_chunking(<words>w)).')

    @classmethod
    def class_name(cls) -> str:
        return "LaterChunkingPostprocessor"
