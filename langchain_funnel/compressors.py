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
Scores go to ``Document.metadata["score"]``; earlier scores stay in ``metadata["scores"]``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

from langchain_core.documents import BaseDocumentTransformer, Document
from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from funnel_core.funnel import Stage
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.monot5 import DEFAULT_MONOT5, MonoT5Scorer
from funnel_core.text import LaterChunking
from langchain_funnel._base import StageCompressor, documents_to_units, units_to_documents

__all__ = ["CrossEncoderReranker", "MonoT5Reranker", "LaterChunkingTransformer"]


class _ModelReranker(StageCompressor):
    # Runnable annotates ``name`` without a default; pydantic would make it a required field.
    name: Optional[str] = None
    top_n: Optional[int] = Field(default=None, description="Documents to keep (None: all).")
    batch_size: int = Field(default=32, description="Pairs per forward pass.")
    device: Optional[str] = Field(default=None, description="cpu / cuda / mps; None = automatic.")
    max_length: int = Field(default=512, description="Tokens per (query, passage) pair; the "
                            "passage is truncated, never the query.")
    fp16: Optional[bool] = Field(default=None, description="Half precision, CUDA only.")
    sort_by_length: bool = Field(default=True, description="Batch pairs of similar length.")
    normalize: bool = Field(default=False, description="Sigmoid scores into (0, 1).")
    score_threshold: Optional[float] = Field(default=None,
                                             description="Drop documents scoring below this.")

    def model_post_init(self, __context: Any) -> None:
        # Build the stage now: it validates every setting (the model itself still loads lazily).
        self._stage = self._build_stage()


class CrossEncoderReranker(_ModelReranker):
    """Rerank documents with a cross-encoder.

    Example::

        reranker = CrossEncoderReranker(model="BAAI/bge-reranker-v2-m3", backend="flagembedding",
                                        top_n=8)
        chain = rerank_chain(retriever, reranker)
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

    def _build_stage(self) -> Stage:
        return CrossEncoderScorer(self.model, backend=self.backend, batch_size=self.batch_size,
                                  device=self.device, max_length=self.max_length, fp16=self.fp16,
                                  sort_by_length=self.sort_by_length, normalize=self.normalize,
                                  top_n=self.top_n, score_threshold=self.score_threshold,
                                  fuse_weight=self.fuse_weight, bf16=self.bf16,
                                  window_words=self.window_words,
                                  window_overlap=self.window_overlap)


class MonoT5Reranker(_ModelReranker):
    """Rerank documents with monoT5 (``castorini/monot5-base-msmarco`` by default)."""

    model: str = Field(default=DEFAULT_MONOT5, description="Hub name or local folder.")
    batch_size: int = Field(default=16, description="Prompts per forward pass.")

    def _build_stage(self) -> Stage:
        return MonoT5Scorer(self.model, batch_size=self.batch_size, device=self.device,
                            max_length=self.max_length, fp16=self.fp16,
                            sort_by_length=self.sort_by_length, normalize=self.normalize,
                            top_n=self.top_n, score_threshold=self.score_threshold)


class LaterChunkingTransformer(BaseModel, BaseDocumentTransformer,
                               Runnable[Sequence[Document], list[Document]]):
    """Split documents into ~``words``-word passages (FunnelRAG section 3.1.3).

    Each passage keeps a copy of its document's metadata plus ``parent_id``, ``parent_score``
    (the document's ``metadata["score"]``, if any), ``position`` and ``level``. As a ``Runnable`` it
    maps a list of documents to a list of passages, so ``retriever | LaterChunkingTransformer()``
    works in LCEL.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    name: Optional[str] = None
    words: int = Field(default=100, description="Target passage size in words.")
    overlap: int = Field(default=0, description="Words repeated between consecutive passages.")
    sentence_aware: bool = Field(default=True, description="End passages at sentence ends.")
    level: str = Field(default="passage", description="Granularity name of the passages.")
    _stage: Optional[LaterChunking] = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        self._stage = LaterChunking(words=self.words, overlap=self.overlap, level=self.level,
                                    sentence_aware=self.sentence_aware)

    @property
    def stage(self) -> LaterChunking:
        """The ``funnel_core`` stage this transformer runs (used by ``FunnelRetriever``)."""
        return self._stage

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        """Documents -> passages, parent by parent, in the input order."""
        units = documents_to_units(list(documents))
        return units_to_documents([c for u in units for c in self._stage.split(u)])

    async def atransform_documents(self, documents: Sequence[Document],
                                   **kwargs: Any) -> list[Document]:
        return await asyncio.to_thread(self.transform_documents, documents)

    def invoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        return self.transform_documents(input)

    async def ainvoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
                      **kwargs: Any) -> list[Document]:
        return await self.atransform_documents(input)
