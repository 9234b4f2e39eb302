"""LangChain over the Milvus backend (:mod:`funnel_core.backends.milvus`).

* The BM25 retrievers of :mod:`langchain_funnel.retrievers` take ``backend=`` (a
  :class:`~funnel_core.backends.milvus.MilvusBackend` or a URI) in ``from_documents``/``from_texts`` to
  build into Milvus, and re-open a built collection with ``from_backend`` (no re-indexing).
* :class:`DenseRetriever` — dense retrieval over a :class:`~funnel_core.backends.milvus.MilvusDenseIndex`
  (or the in-memory :class:`~funnel_core.embeddings.DenseIndex`), e.g. the dense side of
  :class:`~langchain_funnel.best_practices.HybridRetriever`.
* :class:`MilvusTranslator` / :func:`to_milvus_filter` — LangChain's filter objects
  (``langchain_core.structured_query``: ``Comparison``/``Operation``, what a self-query
  retriever produces) -> a Milvus boolean expression, pushed down to Milvus. The retrievers
  accept such an object as ``filter=`` directly.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

from langchain_core.documents import Document
from langchain_core.structured_query import (
    Comparator,
    Comparison,
    FilterDirective,
    Operation,
    Operator,
    StructuredQuery,
    Visitor,
)
from pydantic import Field

from funnel_core.backends.milvus import (
    MilvusBackend,
    MilvusDenseIndex,
    UnsupportedFilterError,
    as_backend,
    build_dense,
    combine_expressions,
    comparison_expression,
    search_dense,
)
from funnel_core.embeddings import DenseIndex
from funnel_core.filters import combine_filters
from funnel_core.settings import check_kwargs, checked_keywords
from funnel_core.units import Unit
from langchain_funnel._base import UnitRetriever
from langchain_funnel.corpus import units_from_documents

__all__ = ["DenseRetriever", "MilvusTranslator", "to_milvus_filter", "push_down", "search_filter"]

_OPS = {Comparator.EQ: "eq", Comparator.NE: "ne", Comparator.GT: "gt", Comparator.GTE: "gte",
        Comparator.LT: "lt", Comparator.LTE: "lte", Comparator.IN: "in", Comparator.NIN: "nin",
        Comparator.CONTAIN: "contains", Comparator.LIKE: "like"}


class MilvusTranslator(Visitor):
    """Translate ``langchain_core.structured_query`` objects into Milvus boolean expressions on
    funnel-rag's JSON ``metadata`` field (a missing key fails ``eq``/``gt``/... and passes
    ``ne``/``nin``; ``contain`` = a list-valued field holds the value; ``like`` = substring)."""

    allowed_comparators = tuple(_OPS)
    allowed_operators = (Operator.AND, Operator.OR, Operator.NOT)

    @checked_keywords
    def __init__(self) -> None:  # takes no settings; a keyword given names that
        super().__init__()

    def visit_comparison(self, comparison: Comparison) -> Optional[str]:
        self._validate_func(comparison.comparator)
        return comparison_expression(comparison.attribute, _OPS[comparison.comparator],
                                     comparison.value)

    def visit_operation(self, operation: Operation) -> Optional[str]:
        self._validate_func(operation.operator)
        parts = [arg.accept(self) for arg in operation.arguments]
        return combine_expressions(parts, operation.operator.value)

    def visit_structured_query(self, structured_query: StructuredQuery) -> tuple[str, dict]:
        if structured_query.filter is None:
            return structured_query.query, {}
        return structured_query.query, {"filter": structured_query.filter.accept(self)}


def to_milvus_filter(directive: Optional[FilterDirective]) -> Optional[str]:
    """A ``Comparison``/``Operation`` -> a Milvus expression (``None``: no constraint)."""
    if directive is None:
        return None
    if not isinstance(directive, FilterDirective):
        raise TypeError(f"expected a langchain_core.structured_query Comparison or Operation, got "
                        f"{type(directive).__name__}.")
    return directive.accept(MilvusTranslator())


def push_down(index: Any, flt: Any) -> Any:
    """The filter a retriever hands its index: structured-query objects become Milvus
    expressions for a Milvus index (an in-memory index cannot run them: an error names the fix)."""
    if isinstance(flt, FilterDirective):
        if getattr(index, "kind", "").startswith("funnel-rag.milvus"):
            return to_milvus_filter(flt)
        raise UnsupportedFilterError(
            "a structured-query filter (Comparison/Operation) is translated for the Milvus "
            "backend only; with the in-memory index pass a dict such as {'topic': 'geo'} or a "
            "predicate, or build the retriever with backend=MilvusBackend(...).")
    return flt


def search_filter(index: Any, floor: Any, call: Any) -> Any:
    """The filter a retriever searches with: its own ``filter`` (a floor) AND the per-call one
    (:func:`funnel_core.filters.combine_filters`; an empty or blank one adds nothing), each
    pushed down first (:func:`push_down`)."""
    return combine_filters(push_down(index, floor), push_down(index, call))


class DenseRetriever(UnitRetriever):
    """Dense retrieval over a Milvus (or in-memory) dense index; ``k`` and ``filter`` per call.

    Build with :meth:`from_documents` (``backend=`` picks Milvus), re-open a built collection
    with :meth:`from_backend`. ``filter`` is a dict (``{"source": "a.md"}``), a Milvus
    expression string or a structured-query ``Comparison``/``Operation``, pushed down to Milvus
    (the in-memory ``DenseIndex`` takes no filter); a per-call filter is ANDed with ``filter``. Scores (inner product of normalised
    embeddings) are in ``metadata["relevance_score"]``.
    """

    index: Union[MilvusDenseIndex, DenseIndex]
    filter: Any = Field(default=None, description="Metadata filter (Milvus only), a floor: a per-call filter is ANDed with it.")

    @classmethod
    def from_documents(cls, documents: Iterable[Document], embedder: Any = None,
                       backend: Union[MilvusBackend, str, None] = None, k: int = 4,
                       filter: Any = None, **index_config: Any) -> "DenseRetriever":
        """Embed ``documents`` (``embedder``: a :class:`~funnel_core.embeddings.SentenceEmbedder`,
        default the packaged all-MiniLM-L6-v2) into Milvus (``backend=``) or memory. ``k`` and
        ``filter`` are the retriever's; ``index_config`` goes to the index (an unknown key
        raises, naming this method and the accepted ones)."""
        index = build_dense(f"{cls.__name__}.from_documents", as_backend(backend), embedder, index_config)
        units = units_from_documents(documents, "passage")
        return cls(index=index.index(units), k=k, filter=filter)

    @classmethod
    def from_backend(cls, backend: Union[MilvusBackend, str], embedder: Any = None,
                     **settings: Any) -> "DenseRetriever":
        """Re-open a dense collection built before (no re-embedding); pass the ``embedder`` it
        was built with (default: the packaged all-MiniLM-L6-v2)."""
        check_kwargs(f"{cls.__name__}.from_backend", settings,
                     [n for n in cls.model_fields if n != "index"])  # before opening the collection
        b = require_milvus(backend, "DenseRetriever.from_backend")
        return cls(index=b.dense(embedder).open(), **settings)

    def _search(self, query: str, k: int, filter: Any = None) -> list[Unit]:
        return search_dense(self.index, query, k, search_filter(self.index, self.filter, filter))


def require_milvus(backend: Any, where: str) -> MilvusBackend:
    b = as_backend(backend)
    if b is None:
        raise ValueError(f"{where} re-opens a Milvus collection: pass backend=MilvusBackend(uri, "
                         "collection=...) or a Milvus URI, not 'memory'.")
    return b
