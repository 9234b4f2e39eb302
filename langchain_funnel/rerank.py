"""LangChain document compressors and a document transformer for FunnelRAG's pre-ranking
stage; each stage's score also stays as ``metadata["funnel_score_<stage>"]``."""

from __future__ import annotations

from typing import Any, Sequence

from langchain_core.documents import BaseDocumentTransformer, Document
from langchain_core.runnables import Runnable, RunnableConfig

from funnel_core.funnelrag.fields import LaterChunkingFields
from funnel_core.rerank.fields import CrossEncoderFields, MonoT5Fields
from langchain_funnel._base import StageCompressor, StageModel, documents_to_units, units_to_documents

__all__ = ["CrossEncoderReranker", "MonoT5Reranker", "LaterChunkingTransformer"]


class CrossEncoderReranker(CrossEncoderFields, StageCompressor):
    """Rerank documents with a cross-encoder: a
    :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer`; ``relevance_score`` is on the
    scale of LangChain's ``HuggingFaceCrossEncoder`` (a sigmoid, unless ``normalize=False``).

    Example::

        reranker = CrossEncoderReranker(model="BAAI/bge-reranker-v2-m3", library="flagembedding",
                                        top_n=8)
        retriever = FunnelRetriever.from_stages(bm25_retriever, reranker, k=4)
    """


class MonoT5Reranker(MonoT5Fields, StageCompressor):
    """Rerank documents with monoT5 (the ``true``/``false`` logits of a T5 model,
    ``castorini/monot5-base-msmarco`` by default): a :class:`~funnel_core.rerank.monot5.MonoT5Scorer`."""


class TransformerBase(StageModel, BaseDocumentTransformer, Runnable[Sequence[Document], list[Document]]):
    """A document transformer holding one core stage that needs no query; as a ``Runnable``,
    documents -> documents (``retriever | transformer``)."""

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        documents = list(documents)
        return units_to_documents(self.stage.run("", documents_to_units(documents)), documents)

    def invoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        if not isinstance(input, (list, tuple)):
            raise TypeError(f"{type(self).__name__} takes a list of Documents, got {type(input).__name__}.")
        return self._call_with_config(self.transform_documents, input, config)


class LaterChunkingTransformer(LaterChunkingFields, TransformerBase):
    """Split documents into passages (FunnelRAG section 3.1.3): a
    :class:`~funnel_core.funnelrag.chunking.LaterChunking` stage."""
