"""LangChain's structured-query filters (``Comparison``/``Operation``, what a self-query retriever
produces) as the core filter tree (:mod:`funnel_core.filters`) and as Milvus expressions, pushed
down by the retrievers (``filter=``)."""

from __future__ import annotations

from typing import Any, Optional

from langchain_core.structured_query import (
    Comparator,
    Comparison,
    FilterDirective,
    Operation,
    Operator,
    StructuredQuery,
    Visitor,
)

from funnel_core.backends.milvus import UnsupportedFilterError, filter_expression, is_milvus_index
from funnel_core.filters import Comparison as CoreComparison
from funnel_core.filters import Condition, combine_filters
from funnel_core.settings import checked_keywords

__all__ = ["MilvusTranslator", "to_core_filter", "to_milvus_filter", "push_down", "search_filter"]

#: LangChain's comparators as the core's (:data:`funnel_core.filters.COMPARISONS`).
_OPS = {Comparator.EQ: "eq", Comparator.NE: "ne", Comparator.GT: "gt", Comparator.GTE: "gte",
        Comparator.LT: "lt", Comparator.LTE: "lte", Comparator.IN: "in", Comparator.NIN: "nin",
        Comparator.CONTAIN: "contains", Comparator.LIKE: "like"}


def to_core_filter(directive: FilterDirective) -> CoreComparison | Condition:
    """A ``Comparison``/``Operation`` as the core filter tree every index takes as ``filter=``."""
    if isinstance(directive, Comparison):
        if directive.comparator not in _OPS:
            raise UnsupportedFilterError(
                f"the LangChain comparator {directive.comparator!r} (attribute "
                f"{directive.attribute!r}) is not supported; use one of {[c.value for c in _OPS]}.")
        return CoreComparison(directive.attribute, _OPS[directive.comparator], directive.value)
    if isinstance(directive, Operation):
        return Condition(directive.operator.value,
                         tuple(to_core_filter(arg) for arg in directive.arguments))
    raise TypeError(f"expected a langchain_core.structured_query Comparison or Operation, got "
                    f"{type(directive).__name__}.")


class MilvusTranslator(Visitor):
    """``langchain_core.structured_query`` objects -> Milvus expressions
    (:func:`funnel_core.backends.milvus.filter_expression`)."""

    allowed_comparators = tuple(_OPS)
    allowed_operators = (Operator.AND, Operator.OR, Operator.NOT)

    @checked_keywords
    def __init__(self) -> None:  # takes no settings; a keyword given names that
        super().__init__()

    def visit_comparison(self, comparison: Comparison) -> Optional[str]:
        self._validate_func(comparison.comparator)
        return filter_expression(to_core_filter(comparison))

    def visit_operation(self, operation: Operation) -> Optional[str]:
        self._validate_func(operation.operator)
        return filter_expression(to_core_filter(operation))

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
    """A structured-query filter as a Milvus expression for a Milvus index (refused in memory)."""
    if isinstance(flt, FilterDirective):
        if is_milvus_index(index):
            return to_milvus_filter(flt)
        raise UnsupportedFilterError(
            "a structured-query filter (Comparison/Operation) is translated for the Milvus "
            "backend only; with the in-memory index pass a dict such as {'topic': 'geo'} or a "
            "predicate, or build the retriever with backend=MilvusBackend(...).")
    return flt


def search_filter(index: Any, floor: Any, call: Any) -> Any:
    """The retriever's ``filter`` (a floor) AND the per-call one, each pushed down."""
    return combine_filters(push_down(index, floor), push_down(index, call))
