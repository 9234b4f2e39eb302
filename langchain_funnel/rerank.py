"""LangChain document compressors and a transformer for FunnelRAG's pre-ranking stage.

* :class:`CrossEncoderReranker` — cross-encoder reranking (sentence-transformers, FlagEmbedding
  or plain transformers backend);
* :class:`MonoT5Reranker` — monoT5 reranking;
* :class:`LaterChunkingTransformer` — FunnelRAG's later chunking as a ``BaseDocumentTransformer``
  (and a ``Runnable`` over a list of documents): documents in, ~100-word passages out, each with
  ``parent_id``, ``parent_score`` and ``position`` in its metadata.

The rerankers are ``BaseDocumentCompressor`` objects (use them with
:class:`~langchain_funnel.compression.CompressionRetriever`) and ``Runnable`` objects over
``{"query", "documents"}`` (use them in LCEL, e.g. ``rerank_chain(retriever, reranker)``).
Scores go to ``Document.metadata["relevance_score"]`` (a float, as LangChain's own rerankers write it);
each stage's score also stays as ``metadata["funnel_score_<stage>"]``.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Optional, Sequence

from langchain_core.documents import BaseDocumentTransformer, Document
from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from funnel_core.funnel import Stage
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.monot5 import MonoT5Scorer
from funnel_core.settings import StageAdapter
from langchain_funnel._base import StageCompressor, documents_to_units, units_to_documents

__all__ = ["CrossEncoderReranker", "MonoT5Reranker", "LaterChunkingTransformer"]


class CrossEncoderReranker(StageCompressor):
    """Rerank documents with a cross-encoder: a
    :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer`.

    ``relevance_score`` is a sigmoid probability in (0, 1) by default (``normalize=True``), the
    scale of LangChain's ``HuggingFaceCrossEncoder`` behind ``CrossEncoderReranker``, so a 0.5
    threshold means "relevant"; ``normalize=False`` gives raw logits (the same order).

    Example::

        reranker = CrossEncoderReranker(model="BAAI/bge-reranker-v2-m3", library="flagembedding",
                                        top_n=8)
        retriever = FunnelRetriever.from_stages(bm25_retriever, reranker, k=4)
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


class MonoT5Reranker(StageCompressor):
    """Rerank documents with monoT5 (``castorini/monot5-base-msmarco`` by default): a
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


class TransformerBase(StageAdapter, BaseModel, BaseDocumentTransformer,
                      Runnable[Sequence[Document], list[Document]]):
    """A document transformer holding one core stage (see :class:`StageCompressor`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    name: Optional[str] = None
    _stage: Optional[Stage] = PrivateAttr(default=None)


class LaterChunkingTransformer(TransformerBase):
    """Split documents into ~``words``-word passages (FunnelRAG section 3.1.3).

    Each passage keeps a copy of its document's metadata; flat ``funnel_...`` keys hold
    ``parent_id``, ``parent_score``, ``position`` and ``level``. As a ``Runnable`` it maps a list
    of documents to a list of passages, so ``retriever | LaterChunkingTransformer()`` works in
    LCEL. It holds a :class:`~funnel_core.funnelrag.chunking.LaterChunking` stage.
    """

    stage_class: ClassVar[type] = LaterChunking

    words: int = Field(default=100, description='Target passage size in words.')
    overlap: int = Field(default=0, description='Words repeated between consecutive passages.')
    level: str = Field(default='passage', description='Granularity name of the passages.')
    sentence_aware: bool = Field(default=True, description='End passages at sentence ends.')

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        """Documents -> passages, parent by parent, in the input order."""
        units = documents_to_units(list(documents))
        return units_to_documents([c for u in units for c in self.stage.split(u)], list(documents))

    async def atransform_documents(self, documents: Sequence[Document],
                                   **kwargs: Any) -> list[Document]:
        return await asyncio.to_thread(self.transform_documents, documents)

    def invoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        return self._call_with_config(self.transform_documents, input, config)

    async def ainvoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
                      **kwargs: Any) -> list[Document]:
        return await self._acall_with_config(self.atransform_documents, input, config)
