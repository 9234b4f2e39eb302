"""Dense retrieval for LlamaIndex: :class:`DenseRetriever` over a
:class:`~funnel_core.embeddings.DenseIndex` (in memory) or a
:class:`~funnel_core.backends.milvus.MilvusDenseIndex` (``backend=``), e.g. the dense side of
:class:`~llama_index_funnel.best_practices.HybridRetriever`."""

from __future__ import annotations

import asyncio
from typing import Any, List, Mapping, Optional, Sequence, Union

import numpy as np
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from funnel_core.backends.milvus import MilvusBackend, MilvusDenseIndex, as_backend, build_dense, require_backend
from funnel_core.embeddings import DenseIndex
from funnel_core.errors import check_positive_int, check_query
from funnel_core.settings import checked_keywords
from funnel_core.units import Unit
from llama_index_funnel._base import UnitRetriever, units_to_nodes
from llama_index_funnel.corpus import nodes_from, units_of
from llama_index_funnel.milvus import is_milvus, restore_nodes, search_filter, with_shells

__all__ = ["DenseRetriever"]


class DenseRetriever(UnitRetriever):
    """LlamaIndex retriever over a dense index (in memory or on Milvus); scores in metadata.

    Build with :meth:`from_defaults` (``backend=`` picks Milvus), re-open a built collection
    with :meth:`from_backend`.

    Args:
        index: A built :class:`~funnel_core.backends.milvus.MilvusDenseIndex` or
            :class:`~funnel_core.embeddings.DenseIndex`.
        nodes: Nodes the index was built from (results are copies of them); ``None``: results
            are ``TextNode``s rebuilt from the index (id, text, metadata).
        similarity_top_k: Nodes returned.
        filters: Default metadata filter (``MetadataFilters`` or a dict; on Milvus also an
            expression string, pushed down; in memory also a predicate), with the same
            meaning in memory and on Milvus. A floor: per-query filters passed to
            :meth:`search` are ANDed with it.
    """

    @checked_keywords
    def __init__(self, index: Union[DenseIndex, Any], nodes: Optional[Sequence[BaseNode]] = None,
                 similarity_top_k: int = 10, filters: Any = None,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False) -> None:
        if not isinstance(index, (DenseIndex, MilvusDenseIndex)):
            raise TypeError(f"index must be a MilvusDenseIndex or a DenseIndex, got {type(index).__name__}.")
        self.index = index
        self._nodes = {n.node_id: n for n in (nodes or ())}
        self.similarity_top_k = check_positive_int(similarity_top_k, "similarity_top_k")
        self.filters = filters
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @classmethod
    def from_defaults(cls, nodes: Sequence[BaseNode], embedder: Any = None,
                      backend: Union[MilvusBackend, str, None] = None, similarity_top_k: int = 10,
                      filters: Any = None, **index_config: Any) -> "DenseRetriever":
        """Embed ``nodes`` (``embedder``: a :class:`~funnel_core.embeddings.SentenceEmbedder`,
        default the packaged all-MiniLM-L6-v2) into Milvus (``backend=``) or memory."""
        b = as_backend(backend)
        index = build_dense(f"{cls.__name__}.from_defaults", b, embedder, index_config)
        nodes = nodes_from(nodes, None)
        units = units_of(nodes, "passage")
        index.index(with_shells(units, nodes) if b is not None else units)
        return cls(index, nodes, similarity_top_k=similarity_top_k, filters=filters)

    @classmethod
    @checked_keywords
    def from_backend(cls, backend: Union[MilvusBackend, str], embedder: Any = None,
                     similarity_top_k: int = 10, filters: Any = None) -> "DenseRetriever":
        """Re-open a dense collection built before (no re-embedding); pass the ``embedder`` it
        was built with (default: the packaged all-MiniLM-L6-v2)."""
        b = require_backend(backend, f"{cls.__name__}.from_backend")
        return cls(b.dense(embedder).open(), None, similarity_top_k=similarity_top_k, filters=filters)

    def _originals(self) -> Mapping[str, BaseNode]:
        return self._nodes

    def _search(self, query: str, filters: Any = None, k: Optional[int] = None,
                vector: Any = None) -> list[Unit]:
        k = self.similarity_top_k if k is None else check_positive_int(k, "k")
        flt = search_filter(self.index, self.filters, filters)
        embeddings = None if vector is None else np.asarray(vector, dtype=np.float32)[None, :]
        hits = self.index.search_many([query], k, query_embeddings=embeddings, filter=flt)[0]
        return restore_nodes(hits, self._nodes) if is_milvus(self.index) else hits

    def _bundle_vector(self, query_bundle: QueryBundle) -> Any:
        """The vector a query bundle asks for, as LlamaIndex's vector retrievers read it: its
        ``embedding`` (e.g. from :class:`~llama_index_funnel.best_practices.HyDETransform`), else
        the mean embedding of its ``custom_embedding_strs`` (``HyDEQueryTransform``), else ``None``
        (the query string is embedded)."""
        if query_bundle.embedding is not None:
            return np.asarray(query_bundle.embedding, dtype=np.float32)
        if query_bundle.custom_embedding_strs:
            return self.index.embedder.encode(list(query_bundle.custom_embedding_strs)).mean(axis=0)
        return None

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        units = self._search(query, vector=self._bundle_vector(query_bundle))
        return units_to_nodes(units, self._originals(), self.annotate)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        units = await asyncio.to_thread(
            lambda: self._search(query, vector=self._bundle_vector(query_bundle)))
        return units_to_nodes(units, self._originals(), self.annotate)

    def search(self, query: str, filters: Any = None, k: Optional[int] = None) -> List[NodeWithScore]:
        """Retrieve with a per-query filter and ``k``."""
        query = check_query(query)
        if not query:
            return []
        return units_to_nodes(self._search(query, filters, k), self._originals(), self.annotate)
