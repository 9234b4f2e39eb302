"""LlamaIndex over the Milvus backend (:mod:`funnel_core.backends.milvus`).

* The BM25 retrievers of :mod:`llama_index_funnel.retrievers` take ``backend=`` (a
  :class:`~funnel_core.backends.milvus.MilvusBackend` or a URI) in ``from_defaults`` to build into Milvus,
  and re-open a built collection with ``from_backend`` (no re-indexing).
* :class:`DenseRetriever` — dense retrieval over a :class:`~funnel_core.backends.milvus.MilvusDenseIndex`
  (or the in-memory :class:`~funnel_core.embeddings.DenseIndex`), e.g. the dense side of
  :class:`~llama_index_funnel.best_practices.HybridRetriever`.
* :func:`to_milvus_filter` — LlamaIndex ``MetadataFilters`` (nested, AND/OR/NOT) -> a Milvus
  boolean expression with the semantics of :func:`llama_index_funnel.filters.to_predicate` (a
  missing key fails ``==``/``>``/... and passes ``!=``/``nin``). The retrievers translate
  ``filters=MetadataFilters(...)`` by themselves when their index is on Milvus.
"""

from __future__ import annotations

import asyncio
from typing import Any, List, Mapping, Optional, Sequence, Union

import numpy as np
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilters,
)

from funnel_core.backends.milvus import (
    MilvusBackend,
    UnsupportedFilterError,
    as_backend,
    build_dense,
    combine_expressions,
    comparison_expression,
    search_dense,
)
from funnel_core.embeddings import DenseIndex
from funnel_core.errors import check_positive_int, check_query
from funnel_core.filters import combine_filters
from funnel_core.settings import checked_keywords
from funnel_core.units import Unit
from llama_index_funnel._base import UnitRetriever, units_to_nodes
from llama_index_funnel.corpus import nodes_from, units_of
from llama_index_funnel.filters import is_empty_metadata_filters, to_predicate

__all__ = ["DenseRetriever", "to_milvus_filter", "is_milvus", "milvus_backend",
           "with_shells", "restore_nodes", "search_filter"]

_OPS = {FilterOperator.EQ: "eq", FilterOperator.NE: "ne", FilterOperator.GT: "gt",
        FilterOperator.GTE: "gte", FilterOperator.LT: "lt", FilterOperator.LTE: "lte",
        FilterOperator.IN: "in", FilterOperator.NIN: "nin", FilterOperator.CONTAINS: "contains",
        FilterOperator.ANY: "any", FilterOperator.ALL: "all", FilterOperator.TEXT_MATCH: "like"}


def _one(f: Any) -> Optional[str]:
    op = getattr(f, "operator", FilterOperator.EQ)
    if op not in _OPS:
        raise UnsupportedFilterError(
            f"the LlamaIndex filter operator {op!r} (key {f.key!r}) has no Milvus expression; "
            f"use one of {[o.value for o in _OPS]}, or pass the expression yourself as a string, "
            "e.g. filters='metadata[\"key\"] == \"value\"'.")
    return comparison_expression(f.key, _OPS[op], f.value)


def to_milvus_filter(filters: Optional[MetadataFilters]) -> Optional[str]:
    """Translate ``MetadataFilters`` into a Milvus boolean expression on funnel-rag's JSON
    ``metadata`` field (``None``: no constraint; ``"false"``: nothing passes)."""
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise TypeError(f"filters must be llama_index MetadataFilters, got {type(filters).__name__}.")
    parts = [to_milvus_filter(f) if isinstance(f, MetadataFilters) else _one(f)
             for f in filters.filters]
    cond = (filters.condition or FilterCondition.AND).value
    return combine_expressions(parts, cond)


#: The key of a unit's stored metadata (inside Milvus only) that holds its node's structure;
#: ``funnel_`` keys are ours (see :data:`funnel_core.units.FUNNEL_PREFIX`).
_SHELL = "funnel_node"


def with_shells(units: Sequence[Unit], nodes: Sequence[BaseNode]) -> list[Unit]:
    """Units for a Milvus build, each carrying its node's structure (type, relationships,
    excluded keys, templates; not its text, metadata or embedding, which Milvus stores anyway)
    under the stored metadata's ``funnel_node`` key, so that a retriever re-opened from Milvus hands back
    the same nodes (same hash, ``SOURCE``/``PARENT`` relationships intact)."""
    from llama_index.core.storage.docstore.utils import doc_to_json

    out = []
    for u, n in zip(units, nodes):
        j = doc_to_json(n)
        data = {k: v for k, v in j["__data__"].items() if k not in ("text", "metadata", "embedding", "id_")}
        shell = {"type": str(getattr(j["__type__"], "value", j["__type__"])), "data": data}
        u.metadata = {**u.metadata, _SHELL: shell}
        out.append(u)
    return out


def restore_nodes(units: Sequence[Unit], known: Mapping[str, BaseNode]) -> list[Unit]:
    """Take the node structure stored by :func:`with_shells` out of the units' metadata and,
    for units whose node is not in memory (``known``), rebuild that node as ``unit.source``."""
    from llama_index.core.storage.docstore.utils import json_to_doc

    for u in units:
        if _SHELL not in u.metadata:
            continue
        meta = dict(u.metadata)
        shell = meta.pop(_SHELL)
        u.metadata = meta
        if u.id in known or not isinstance(shell, dict):
            continue
        user = meta  # the node's own metadata, as stored
        try:
            u.source = json_to_doc({"__type__": shell.get("type"), "__data__": {
                **dict(shell.get("data") or {}), "id_": u.id, "text": u.text, "metadata": user}})
        except Exception:  # an unknown node type: a TextNode is rebuilt from id, text, metadata
            u.source = None
    return list(units)


def is_milvus(index: Any) -> bool:
    """Whether ``index`` keeps its data in Milvus."""
    return str(getattr(index, "kind", "")).startswith("funnel-rag.milvus")


@checked_keywords
def milvus_backend(backend: Any, where: str) -> MilvusBackend:
    """``backend`` as a :class:`MilvusBackend`; ``None``/``"memory"`` is an error naming ``where``."""
    b = as_backend(backend)
    if b is None:
        raise ValueError(f"{where} re-opens a Milvus collection: pass backend=MilvusBackend(uri, "
                         "collection=...) or a Milvus URI, not 'memory'.")
    return b


def push_down(index: Any, flt: Any) -> Any:
    """The filter handed to a Milvus index: ``MetadataFilters`` become an expression."""
    return to_milvus_filter(flt) if isinstance(flt, MetadataFilters) else flt


def _native(index: Any, flt: Any) -> Any:
    """``flt`` in the index's own form: ``MetadataFilters`` become a Milvus expression (pushed
    down) for a Milvus index, a predicate for an in-memory one; an empty one, ``None``."""
    if not isinstance(flt, MetadataFilters):
        return flt
    if is_empty_metadata_filters(flt):
        return None
    return push_down(index, flt) if is_milvus(index) else to_predicate(flt)


def search_filter(index: Any, floor: Any, call: Any) -> Any:
    """The filter a retriever searches with: its own ``filters`` (a floor) AND the per-query ones
    (:func:`funnel_core.filters.combine_filters`; ``None``, ``{}``, a blank string and
    ``MetadataFilters(filters=[])`` add nothing), each in the index's own form first."""
    return combine_filters(_native(index, floor), _native(index, call))


class DenseRetriever(UnitRetriever):
    """LlamaIndex retriever over a dense index (Milvus or in-memory); scores in metadata.

    Build with :meth:`from_defaults` (``backend=`` picks Milvus), re-open a built collection
    with :meth:`from_backend`.

    Args:
        index: A built :class:`~funnel_core.backends.milvus.MilvusDenseIndex` or
            :class:`~funnel_core.embeddings.DenseIndex`.
        nodes: Nodes the index was built from (results are copies of them); ``None``: results
            are ``TextNode``s rebuilt from the index (id, text, metadata).
        similarity_top_k: Nodes returned.
        filters: Default metadata filter (``MetadataFilters``, dict or Milvus expression
            string), pushed down; Milvus indexes only. A floor: per-query filters passed to
            :meth:`search` are ANDed with it.
    """

    @checked_keywords
    def __init__(self, index: Union[DenseIndex, Any], nodes: Optional[Sequence[BaseNode]] = None,
                 similarity_top_k: int = 10, filters: Any = None,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False) -> None:
        if not (is_milvus(index) or isinstance(index, DenseIndex)):
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
        b = milvus_backend(backend, f"{cls.__name__}.from_backend")
        return cls(b.dense(embedder).open(), None, similarity_top_k=similarity_top_k, filters=filters)

    def _originals(self) -> Mapping[str, BaseNode]:
        return self._nodes

    def _search(self, query: str, filters: Any = None, k: Optional[int] = None,
                vector: Any = None) -> list[Unit]:
        k = self.similarity_top_k if k is None else check_positive_int(k, "k")
        flt = search_filter(self.index, self.filters, filters)
        if vector is None:
            hits = search_dense(self.index, query, k, flt, argument="filters")
        elif isinstance(self.index, DenseIndex):
            if flt is not None:
                search_dense(self.index, query, k, flt, argument="filters")  # raises, naming the fix
            hits = self.index.search_many([query], k, query_embeddings=vector[None, :])[0]
        else:
            hits = self.index.search_many([query], k, query_embeddings=vector[None, :], filter=flt)[0]
        return hits if isinstance(self.index, DenseIndex) else restore_nodes(hits, self._nodes)

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
