"""The user-facing settings of the FunnelRAG stages' adapters, declared once for LlamaIndex and LangChain.

Each model below lists the settings of one core stage as pydantic fields (name, type, default,
description); the LlamaIndex and the LangChain adapter of that stage both inherit it, so editors,
mypy and the docs see every field and each default is written once.
``tests/adapters/test_adapter_fields.py`` checks every field against the stage's constructor.
Imported only by the adapter packages: pydantic comes with both frameworks, and the stages
themselves do not need it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from pydantic import BaseModel, Field

from funnel_core.errors import check_positive_int
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.settings import field_defaults
from funnel_core.units import Unit

__all__ = ["LaterChunkingFields", "ClusteredRetrieverFields", "CLUSTERED_DEFAULTS", "clustered_search"]


class LaterChunkingFields(BaseModel):
    """The settings of :class:`~funnel_core.funnelrag.chunking.LaterChunking`, for both adapters."""

    stage_class: ClassVar[type] = LaterChunking

    words: int = Field(default=100, description='Target passage size in words.')
    overlap: int = Field(default=0, description='Words repeated between consecutive passages.')
    level: str = Field(default='passage', description='Granularity name of the passages.')
    sentence_aware: bool = Field(default=True, description='End passages at sentence ends.')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces (None: later_chunking(<words>w)).')


class ClusteredRetrieverFields(BaseModel):
    """The settings of both frameworks' ``ClusteredBM25Retriever`` beyond how many it returns
    (LangChain's ``k``, LlamaIndex's ``similarity_top_k``): what its core stage
    :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Retrieve` calls ``k`` and
    ``return_clusters`` (``tests/adapters/test_adapter_fields.py`` keeps the defaults equal).
    LangChain's inherits the fields, LlamaIndex's (not a pydantic model) takes their defaults
    (:data:`CLUSTERED_DEFAULTS`); both check an edit before it lands."""

    k_clusters: int = Field(
        default=10, description="Clusters retrieved by BM25 and opened into their documents.")
    return_clusters: bool = Field(
        default=False, description="Return the clusters themselves instead of their documents.")

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        check_clustered_setting("k_clusters", self.k_clusters)
        check_clustered_setting("return_clusters", self.return_clusters)

    def __setattr__(self, name: str, value: Any) -> None:
        check_clustered_setting(name, value)
        super().__setattr__(name, value)


#: The defaults of :class:`ClusteredRetrieverFields`, for LlamaIndex's signatures.
CLUSTERED_DEFAULTS: dict[str, Any] = field_defaults(ClusteredRetrieverFields)


def check_clustered_setting(name: str, value: Any) -> Any:
    """``value`` if it is valid for the clustered retrievers' setting ``name`` (others pass)."""
    if name == "k_clusters":
        return check_positive_int(value, "k_clusters")
    if name == "return_clusters" and not isinstance(value, bool):
        raise TypeError(f"return_clusters must be a bool (True: return the clusters), got {value!r}.")
    return value


def clustered_search(index: Any, query: str, k: int, k_clusters: int, return_clusters: bool,
                     filter: Any) -> list[Unit]:
    """The retrievers' search: the top ``k_clusters`` clusters opened into at most ``k``
    documents, or, with ``return_clusters``, at most ``k`` of those clusters."""
    n_clusters = min(k_clusters, k) if return_clusters else k_clusters
    return index.search(query, k=n_clusters, filter=filter, return_clusters=return_clusters,
                        max_documents=k)
