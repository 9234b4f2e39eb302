"""The user's nodes as index units: what every retriever's ``from_defaults`` indexes."""

from __future__ import annotations

from typing import Optional, Sequence

from llama_index.core.schema import BaseNode, MetadataMode
from llama_index.core.storage.docstore import BaseDocumentStore

from funnel_core.units import Unit

__all__ = ["nodes_from", "units_of"]


def nodes_from(nodes: Optional[Sequence[BaseNode]], docstore: Optional[BaseDocumentStore]) -> list[BaseNode]:
    if nodes is None and docstore is None:
        raise ValueError("pass nodes=[...] or docstore=...; there is nothing to index.")
    nodes = list(nodes) if nodes is not None else list(docstore.docs.values())  # type: ignore[union-attr]
    if not nodes:
        raise ValueError("cannot build a retriever over an empty corpus: nodes/docstore is empty.")
    for n in nodes:
        if not isinstance(n, BaseNode):
            raise TypeError(f"expected LlamaIndex nodes, got {type(n).__name__}; parse documents "
                            "into nodes first (e.g. SentenceSplitter().get_nodes_from_documents).")
    return nodes


def units_of(nodes: Sequence[BaseNode], level: str) -> list[Unit]:
    return [Unit(id=n.node_id, text=n.get_content(metadata_mode=MetadataMode.NONE),
                 metadata=dict(n.metadata), level=level) for n in nodes]
