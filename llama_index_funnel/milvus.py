"""LlamaIndex over the Milvus backend (:mod:`funnel_core.backends.milvus`): what the retrievers
(``backend=`` in ``from_defaults``, ``from_backend``) need, and :func:`to_milvus_filter`."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import MetadataFilters

from funnel_core.backends.milvus import filter_expression, is_milvus_index
from funnel_core.filters import combine_filters
from funnel_core.units import Unit
from llama_index_funnel.filters import to_core_filter

__all__ = ["to_milvus_filter", "is_milvus", "with_shells", "restore_nodes",
           "search_filter"]


def to_milvus_filter(filters: Optional[MetadataFilters]) -> Optional[str]:
    """``MetadataFilters`` as a Milvus boolean expression, through the core filter tree (the
    semantics of :func:`~llama_index_funnel.filters.to_predicate`; ``None``: no constraint)."""
    if filters is None:
        return None
    return filter_expression(to_core_filter(filters))


#: The key of a unit's stored metadata (inside Milvus only) that holds its node's structure;
#: ``funnel_`` keys are ours (see :data:`funnel_core.units.FUNNEL_PREFIX`).
_SHELL = "funnel_node"


def with_shells(units: Sequence[Unit], nodes: Sequence[BaseNode]) -> list[Unit]:
    """Units for a Milvus build, each carrying its node's structure (type, relationships,
    excluded keys, templates) under the ``funnel_node`` key, so that a retriever re-opened from
    Milvus hands back the same nodes (same hash, relationships intact)."""
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


#: Whether an index keeps its data in Milvus (its results carry the node structure that
#: :func:`restore_nodes` takes out).
is_milvus = is_milvus_index


def search_filter(index: Any, floor: Any, call: Any) -> Any:
    """A retriever's ``filters`` (a floor) AND the per-query ones
    (:func:`funnel_core.filters.combine_filters`), ``MetadataFilters`` as the core filter tree;
    ``index`` is not consulted: every index takes the same filter forms."""
    return combine_filters(*(to_core_filter(f) if isinstance(f, MetadataFilters) else f for f in (floor, call)))
