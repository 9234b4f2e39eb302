"""LlamaIndex ``MetadataFilters`` -> a ``funnel_core`` metadata predicate (per query)."""

from __future__ import annotations

import operator
from typing import Any, Callable

from llama_index.core.vector_stores.types import (
    ExactMatchFilter,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

__all__ = ["is_empty_metadata_filters", "to_predicate"]

_MISSING = object()


def _contains(value: Any, wanted: Any) -> bool:
    return isinstance(value, (list, tuple, set)) and wanted in value


_OPS: dict[FilterOperator, Callable[[Any, Any], bool]] = {
    FilterOperator.EQ: operator.eq,
    FilterOperator.NE: operator.ne,
    FilterOperator.GT: operator.gt,
    FilterOperator.LT: operator.lt,
    FilterOperator.GTE: operator.ge,
    FilterOperator.LTE: operator.le,
    FilterOperator.IN: lambda v, w: v in w,
    FilterOperator.NIN: lambda v, w: v not in w,
    FilterOperator.CONTAINS: _contains,
    FilterOperator.ANY: lambda v, w: isinstance(v, (list, tuple, set)) and any(x in v for x in w),
    FilterOperator.ALL: lambda v, w: isinstance(v, (list, tuple, set)) and all(x in v for x in w),
    FilterOperator.TEXT_MATCH: lambda v, w: isinstance(v, str) and str(w) in v,
    FilterOperator.TEXT_MATCH_INSENSITIVE: lambda v, w: isinstance(v, str) and str(w).lower() in v.lower(),
}


def _one(f: MetadataFilter | ExactMatchFilter) -> Callable[[dict], bool]:
    op = getattr(f, "operator", FilterOperator.EQ)
    key, wanted = f.key, f.value
    if op == FilterOperator.IS_EMPTY:
        return lambda m: m.get(key) in (None, [], "", ())
    fn = _OPS.get(op)
    if fn is None:  # pragma: no cover - future operators
        raise NotImplementedError(f"metadata filter operator {op!r} is not supported.")

    def check(m: dict) -> bool:
        value = m.get(key, _MISSING)
        if value is _MISSING:
            return op in (FilterOperator.NE, FilterOperator.NIN)
        try:
            return bool(fn(value, wanted))
        except TypeError:  # e.g. "a" > 3: the unit does not match
            return False

    return check


def is_empty_metadata_filters(filters: MetadataFilters) -> bool:
    """Whether ``filters`` constrains nothing: no filters under AND or NOT (``MetadataFilters(
    filters=[])``). An empty OR matches nothing, so it is not empty."""
    return not filters.filters and filters.condition != FilterCondition.OR


def to_predicate(filters: MetadataFilters | None) -> Callable[[dict], bool] | None:
    """Convert LlamaIndex ``MetadataFilters`` (nested, AND/OR/NOT) into ``f(metadata) -> bool``."""
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise TypeError(f"filters must be llama_index MetadataFilters, got {type(filters).__name__}.")
    parts: list[Callable[[dict], bool]] = [
        to_predicate(f) if isinstance(f, MetadataFilters) else _one(f)  # type: ignore[misc]
        for f in filters.filters]
    cond = filters.condition or FilterCondition.AND
    if cond == FilterCondition.OR:
        return lambda m: any(p(m) for p in parts)
    if cond == FilterCondition.NOT:
        return lambda m: not any(p(m) for p in parts)
    return lambda m: all(p(m) for p in parts)
