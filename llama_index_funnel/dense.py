"""Dense retrieval for LlamaIndex: :class:`DenseRetriever`."""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional, Sequence, Union

import numpy as np
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from funnel_core.backends.milvus import MilvusBackend, MilvusDenseIndex, as_backend, build_dense, require_backend
from funnel_core.embeddings import DenseIndex
from funnel_core.errors import check_query
from funnel_core.settings import checked_keywords
from funnel_core.units import Unit
from llama_index_funnel._base import TOP_K
from llama_index_funnel.milvus import search_filter
from llama_index_funnel.retrievers import IndexRetriever, nodes_from

__all__ = ["DenseRetriever"]


class DenseRetriever(IndexRetriever):
    """LlamaIndex retriever over a built :class:`~funnel_core.embeddings.DenseIndex` or
    :class:`~funnel_core.backends.milvus.MilvusDenseIndex` (``index``) of ``nodes`` (``None``:
    ``TextNode``s rebuilt from the index); ``similarity_top_k`` and ``filters`` as in
    :class:`~llama_index_funnel.retrievers.BM25Retriever` (on Milvus a filter may also be an
    expression string). A query bundle's ``embedding`` (e.g. from
    :class:`~llama_index_funnel.best_practices.HyDETransform`), else the mean embedding of its
    ``custom_embedding_strs``, is searched instead of the query string, as LlamaIndex's vector
    retrievers do.
    """

    @checked_keywords
    def __init__(self, index: Union[DenseIndex, Any], nodes: Optional[Sequence[BaseNode]] = None,
                 similarity_top_k: int = TOP_K, filters: Any = None,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False) -> None:
        if not isinstance(index, (DenseIndex, MilvusDenseIndex)):
            raise TypeError(f"index must be a MilvusDenseIndex or a DenseIndex, got {type(index).__name__}.")
        super().__init__(index, nodes, similarity_top_k, filters, callback_manager, verbose)

    @classmethod
    def from_defaults(cls, nodes: Sequence[BaseNode], embedder: Any = None,
                      backend: Union[MilvusBackend, str, None] = None, similarity_top_k: int = TOP_K,
                      filters: Any = None, **index_config: Any) -> "DenseRetriever":
        """Embed ``nodes`` (``embedder``: a :class:`~funnel_core.embeddings.SentenceEmbedder`,
        default the packaged all-MiniLM-L6-v2) into Milvus (``backend=``) or memory."""
        index = build_dense(f"{cls.__name__}.from_defaults", as_backend(backend), embedder, index_config)
        nodes = nodes_from(nodes, None)
        return cls(cls._build(index, nodes, "passage"), nodes, similarity_top_k=similarity_top_k,
                   filters=filters)

    @classmethod
    @checked_keywords
    def from_backend(cls, backend: Union[MilvusBackend, str], embedder: Any = None,
                     similarity_top_k: int = TOP_K, filters: Any = None) -> "DenseRetriever":
        """Re-open a dense collection built before (no re-embedding); pass the ``embedder`` it
        was built with (default: the packaged all-MiniLM-L6-v2)."""
        b = require_backend(backend, f"{cls.__name__}.from_backend")
        return cls(b.dense(embedder).open(), None, similarity_top_k=similarity_top_k, filters=filters)

    def _search(self, query: str, filters: Any = None, k: Optional[int] = None,
                vector: Any = None) -> list[Unit]:
        flt = search_filter(self.index, self.filters, filters)
        embeddings = None if vector is None else np.asarray(vector, dtype=np.float32)[None, :]
        return self._restore(self.index.search_many([query], self._k(k), query_embeddings=embeddings,
                                                    filter=flt)[0])

    def _bundle_search(self, query_bundle: QueryBundle) -> list[Unit]:
        """Search with the bundle's vector (see the class docstring), else its query string."""
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        vector = query_bundle.embedding
        if vector is None and query_bundle.custom_embedding_strs:
            vector = self.index.embedder.encode(list(query_bundle.custom_embedding_strs)).mean(axis=0)
        return self._search(query, vector=vector)

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return self._to_nodes(self._bundle_search(query_bundle))

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return self._to_nodes(await asyncio.to_thread(self._bundle_search, query_bundle))
