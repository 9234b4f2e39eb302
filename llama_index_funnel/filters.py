"""LlamaIndex ``MetadataFilters`` -> the core filter tree (:mod:`funnel_core.filters`, where what
a comparison means is written once): only the mapping of LlamaIndex's operators."""

from __future__ import annotations

from typing import Callable

from llama_index.core.vector_stores.types import (
    ExactMatchFilter,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from funnel_core.filters import Comparison, Condition, filter_predicate

__all__ = ["is_empty_metadata_filters", "to_core_filter", "to_predicate"]

#: LlamaIndex's operators as the core's (:data:`funnel_core.filters.COMPARISONS`).
OPERATORS: dict[FilterOperator, str] = {
    FilterOperator.EQ: "eq", FilterOperator.NE: "ne", FilterOperator.GT: "gt",
    FilterOperator.GTE: "gte", FilterOperator.LT: "lt", FilterOperator.LTE: "lte",
    FilterOperator.IN: "in", FilterOperator.NIN: "nin", FilterOperator.CONTAINS: "contains",
    FilterOperator.ANY: "any", FilterOperator.ALL: "all", FilterOperator.TEXT_MATCH: "like",
    FilterOperator.TEXT_MATCH_INSENSITIVE: "ilike", FilterOperator.IS_EMPTY: "is_empty",
}


def _one(f: MetadataFilter | ExactMatchFilter) -> Comparison:
    op = getattr(f, "operator", FilterOperator.EQ)
    core = OPERATORS.get(op)
    if core is None:  # pragma: no cover - operators LlamaIndex adds later
        raise NotImplementedError(
            f"the LlamaIndex filter operator {op!r} (key {f.key!r}) is not supported; use one of "
            f"{[o.value for o in OPERATORS]}.")
    return Comparison(f.key, core, f.value)


def to_core_filter(filters: MetadataFilters) -> Condition:
    """``MetadataFilters`` (nested, AND/OR/NOT) as a :class:`~funnel_core.filters.Condition`
    tree that every index takes as ``filter=``."""
    if not isinstance(filters, MetadataFilters):
        raise TypeError(f"filters must be llama_index MetadataFilters, got {type(filters).__name__}.")
    parts = tuple(to_core_filter(f) if isinstance(f, MetadataFilters) else _one(f)
                  for f in filters.filters)
    return Condition((filters.condition or FilterCondition.AND).value, parts)


def is_empty_metadata_filters(filters: MetadataFilters) -> bool:
    """Whether ``filters`` constrains nothing: no filters under AND or NOT (``MetadataFilters(
    filters=[])``). An empty OR matches nothing, so it is not empty."""
    return not filters.filters and filters.condition != FilterCondition.OR


def to_predicate(filters: MetadataFilters | None) -> Callable[[dict], bool] | None:
    """Convert LlamaIndex ``MetadataFilters`` (nested, AND/OR/NOT) into ``f(metadata) -> bool``."""
    if filters is None:
        return None
    return filter_predicate(to_core_filter(filters))
