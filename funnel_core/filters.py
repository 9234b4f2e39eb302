"""The in-memory metadata filter language: what ``filter=`` means on every in-memory index.

``{"key": value}`` (equality; a list-valued metadata field matches when it contains the value),
``{"key": [v1, v2]}`` (any of them), all keys must match; a predicate ``f(metadata) -> bool``; or
a boolean array aligned with the indexed units. Milvus compiles the same dict form into its own
boolean expressions (:mod:`funnel_core.backends.milvus.expressions`).

Filters narrow, never widen: a retriever's construction filter is a floor, and a per-call filter
is combined with it by AND (:func:`combine_filters`); an empty one (``None``, ``{}``, a blank
string) adds nothing. Only a filter that means the same after a reload (a dict of JSON values, a
Milvus expression string) can be saved; :func:`persistable_filter` refuses the others.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from funnel_core.cache import LRUCache
from funnel_core.units import Unit

__all__ = ["AllOf", "COMPARISONS", "Comparison", "Condition", "MetadataFilter", "combine_filters",
           "filter_predicate", "is_empty_filter", "metadata_mask", "persistable_filter"]

#: A per-query filter: ``{"key": value}`` / ``{"key": [v1, v2]}`` (equality / membership, all
#: keys must match; a list-valued metadata field matches when it contains the value), a
#: predicate ``f(metadata) -> bool``, a boolean array aligned with the indexed units, or an
#: :class:`AllOf` of them (all must hold).
MetadataFilter = Union[Mapping[str, Any], Callable[[dict], bool], np.ndarray, "AllOf", "Comparison",
                       "Condition", None]

_LISTLIKE = (list, tuple, set, frozenset)


@dataclass(frozen=True)
class AllOf:
    """Filters that must all hold (AND): what :func:`combine_filters` returns when a floor and a
    per-call filter cannot be written as one dict (a predicate, a mask, a Milvus expression, or
    two dicts with different conditions on the same key). In memory each part is a mask and the
    masks are ANDed; on Milvus each part is compiled and joined as ``(a) and (b)``."""

    parts: tuple

    def __post_init__(self) -> None:
        if not isinstance(self.parts, tuple) or len(self.parts) < 2:
            raise TypeError(f"AllOf takes a tuple of at least two filters, got {self.parts!r:.80}.")


#: The comparison operators of :class:`Comparison`, what the frameworks' filter objects map onto
#: (LlamaIndex ``FilterOperator``, LangChain ``structured_query.Comparator``). Milvus compiles all
#: but ``ilike`` and ``is_empty`` (:func:`funnel_core.backends.milvus.comparison_expression`).
COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "any", "all", "like",
               "ilike", "is_empty")

_MISSING = object()


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple, set))


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda v, w: v == w,
    "ne": lambda v, w: v != w,
    "gt": lambda v, w: v > w,
    "gte": lambda v, w: v >= w,
    "lt": lambda v, w: v < w,
    "lte": lambda v, w: v <= w,
    "in": lambda v, w: v in w,
    "nin": lambda v, w: v not in w,
    "contains": lambda v, w: _is_list(v) and w in v,
    "any": lambda v, w: _is_list(v) and any(x in v for x in w),
    "all": lambda v, w: _is_list(v) and all(x in v for x in w),
    "like": lambda v, w: isinstance(v, str) and str(w) in v,
    "ilike": lambda v, w: isinstance(v, str) and str(w).lower() in v.lower(),
}


@dataclass(frozen=True)
class Comparison:
    """One metadata comparison, framework-free: ``metadata[key] <op> value``.

    ``op`` is one of :data:`COMPARISONS`. A unit whose metadata lacks ``key`` fails every
    operator but ``ne`` and ``nin`` (which it passes); a comparison between values of different
    types (``"a" > 3``) fails; ``contains``/``any``/``all`` test a list-valued field, ``like``
    /``ilike`` a substring of a string field, ``is_empty`` a missing, null or empty value. The
    adapters map their framework's filter objects onto these; in memory
    :func:`filter_predicate` runs them, on Milvus they compile to one expression each.
    """

    key: str
    op: str
    value: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise TypeError(f"a metadata filter key must be a non-empty str, got {self.key!r}.")
        if self.op not in COMPARISONS:
            raise ValueError(f"unknown comparison operator {self.op!r} (key {self.key!r}); use one "
                             f"of {COMPARISONS}.")


@dataclass(frozen=True)
class Condition:
    """Filters joined by ``"and"`` (all hold), ``"or"`` (any holds) or ``"not"`` (none holds).

    An empty ``"and"`` or ``"not"`` constrains nothing (:func:`is_empty_filter`); an empty
    ``"or"`` matches nothing. Parts are :class:`Comparison`, :class:`Condition` or dict filters.
    """

    condition: str
    parts: tuple = ()

    def __post_init__(self) -> None:
        if self.condition not in ("and", "or", "not"):
            raise ValueError(f"condition must be 'and', 'or' or 'not', got {self.condition!r}.")
        if not isinstance(self.parts, tuple):
            raise TypeError(f"Condition parts must be a tuple, got {type(self.parts).__name__}.")


def filter_predicate(filter: Comparison | Condition | Mapping[str, Any]) -> Callable[[dict], bool]:
    """``filter`` as ``f(metadata) -> bool`` (the semantics :class:`Comparison` states)."""
    if isinstance(filter, Condition):
        parts = [filter_predicate(p) for p in filter.parts]
        if filter.condition == "or":
            return lambda m: any(p(m) for p in parts)
        if filter.condition == "not":
            return lambda m: not any(p(m) for p in parts)
        return lambda m: all(p(m) for p in parts)
    if isinstance(filter, Mapping):
        wanted = dict(filter)
        return lambda m: all(_dict_matches(m.get(key), w) for key, w in wanted.items())
    if not isinstance(filter, Comparison):
        raise TypeError(f"expected a Comparison, a Condition or a dict filter, got "
                        f"{type(filter).__name__}.")
    key, op, wanted = filter.key, filter.op, filter.value
    if op == "is_empty":
        return lambda m: m.get(key) in (None, [], "", ())
    fn = _COMPARE[op]

    def check(m: dict) -> bool:
        value = m.get(key, _MISSING)
        if value is _MISSING:
            return op in ("ne", "nin")
        try:
            return bool(fn(value, wanted))
        except TypeError:  # e.g. "a" > 3: the unit does not match
            return False

    return check


def is_empty_filter(filter: Any) -> bool:
    """Whether ``filter`` constrains nothing: ``None``, an empty dict, a blank string (a blank
    Milvus expression), or a :class:`Condition` ``"and"``/``"not"`` without parts. A boolean
    array is never empty (it is a mask, even all ``True``)."""
    if filter is None:
        return True
    if isinstance(filter, Condition):
        return not filter.parts and filter.condition != "or"
    if isinstance(filter, Mapping):
        return len(filter) == 0
    if isinstance(filter, str):
        return not filter.strip()
    return False


def _same_condition(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


def combine_filters(floor: Any, call: Any) -> Any:
    """The filter a search runs with: the retriever's ``floor`` (its construction filter) AND the
    per-call filter ``call``; never wider than ``floor``.

    An empty filter (:func:`is_empty_filter`) adds nothing, so ``combine_filters(floor, {})`` is
    ``floor`` (``None`` when both are empty). Two dicts merge into one dict when they set no key
    to different conditions; otherwise, and for predicates, boolean masks and Milvus expression
    strings, the result is :class:`AllOf` ``((floor, call))``: both must hold. (Two dicts that
    disagree on a key are not intersected value by value: for a list-valued metadata field,
    ``{"tags": "a"}`` AND ``{"tags": "b"}`` keeps a unit tagged ``["a", "b"]``.) Framework
    filter objects (LlamaIndex ``MetadataFilters``, LangChain ``Comparison``) are converted by the
    adapters into one of these forms first.
    """
    if is_empty_filter(call):
        return None if is_empty_filter(floor) else floor
    if is_empty_filter(floor):
        return call
    if isinstance(floor, Mapping) and isinstance(call, Mapping):
        merged = dict(floor)
        for key, wanted in call.items():
            if key in merged and not _same_condition(merged[key], wanted):
                return AllOf((floor, call))
            merged[key] = wanted
        return merged
    return AllOf((floor, call))


def persistable_filter(filter: Any, where: str) -> Any:
    """``filter`` as a retriever's save writes it, or a ``ValueError`` when it cannot be written
    and read back with the same meaning (``where`` names the call, e.g. ``"BM25Retriever.save"``).

    Saved: ``None``, a dict whose values are JSON (str, int, float, bool, None, or lists of
    them), a Milvus expression string. Refused: a predicate, a boolean mask, an :class:`AllOf`,
    anything else. Dropping such a filter would make the loaded retriever wider than the saved
    one (every tenant's documents instead of one), so the save fails before writing anything."""
    if filter is None or isinstance(filter, str):
        return filter
    if isinstance(filter, Mapping):
        try:
            if not all(isinstance(key, str) for key in filter):
                raise TypeError("its keys must be str")
            json.dumps(dict(filter), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{where}: the filter {filter!r:.120} cannot be saved ({exc}); a dict filter is "
                "saved as JSON: use str keys and str/int/float/bool values or lists of them.") from None
        return dict(filter)
    if isinstance(filter, np.ndarray):
        what = "a boolean-mask filter (aligned with this index's units)"
    elif isinstance(filter, AllOf):
        what = "a combined filter (AllOf)"
    elif callable(filter):
        what = f"a predicate filter ({getattr(filter, '__name__', type(filter).__name__)})"
    else:
        what = f"a {type(filter).__name__} filter"
    raise ValueError(
        f"{where}: {what} cannot be saved, and a retriever loaded without it would return the "
        "documents it excludes. Use a dict filter such as {'tenant': 'acme'} (or, on Milvus, an "
        "expression string) as the retriever's filter, or pass the predicate per call "
        "(invoke(q, filter=...) / search(q, filters=...)) and save the retriever without it.")


def _matches(value: Any, wanted: Any) -> bool:
    """Equality, or membership when the metadata value is a list (``tags: ["a", "b"]``)."""
    if isinstance(value, _LISTLIKE):
        return any(_eq(v, wanted) for v in value)
    return _eq(value, wanted)


def _dict_matches(value: Any, wanted: Any) -> bool:
    """One key of a dict filter on one value (the rule :func:`metadata_mask` vectorises)."""
    if isinstance(wanted, _LISTLIKE):
        return any(_matches(value, w) for w in wanted)
    return _matches(value, wanted)


def _eq(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # numpy arrays and other odd values: not equal
        return False


def metadata_mask(units: Sequence[Unit], filter: MetadataFilter,
                  columns: "LRUCache[str, np.ndarray] | dict[str, np.ndarray] | None" = None) -> np.ndarray | None:
    """Boolean array: which ``units`` pass ``filter`` (``None`` when there is no filter).

    ``{"key": value}`` keeps units whose ``metadata[key] == value``, or whose ``metadata[key]`` is
    a list/tuple/set containing ``value``; ``{"key": [v1, v2]}`` keeps units matching any of the
    values. ``columns`` caches one object array per metadata key (a bounded
    :class:`~funnel_core.cache.LRUCache` inside an index), so repeated dict filters are
    vectorised comparisons instead of Python loops over metadata dicts.
    """
    if filter is None:
        return None
    n = len(units)
    if isinstance(filter, AllOf):  # every part must hold
        mask = np.ones(n, dtype=bool)
        for part in filter.parts:
            part_mask = metadata_mask(units, part, columns)
            if part_mask is not None:
                mask &= part_mask
        return mask
    if isinstance(filter, np.ndarray):
        if filter.dtype != bool or filter.shape != (n,):
            raise ValueError(f"a mask filter must be a boolean array of shape ({n},), got "
                             f"{filter.dtype} {filter.shape}.")
        return filter
    if isinstance(filter, (Comparison, Condition)):
        filter = filter_predicate(filter)
    if callable(filter):
        return np.fromiter((bool(filter(u.metadata)) for u in units), dtype=bool, count=n)
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a dict of metadata values, a callable or a boolean "
                        f"array, got {type(filter).__name__}.")
    mask = np.ones(n, dtype=bool)
    for key, wanted in filter.items():
        col = None if columns is None else columns.get(key)
        if col is None:
            col = np.empty(n, dtype=object)
            col[:] = [u.metadata.get(key) for u in units]
            if columns is not None:
                columns[key] = col
        if isinstance(wanted, _LISTLIKE):
            wanted = list(wanted)
            try:
                wanted_set = set(wanted)
                hashable = True
            except TypeError:
                hashable = False

            def ok(v: Any) -> bool:
                if isinstance(v, _LISTLIKE):
                    return any(ok(x) for x in v)
                if hashable:
                    try:
                        return v in wanted_set
                    except TypeError:
                        return False
                return any(_eq(v, w) for w in wanted)

            mask &= np.fromiter((ok(v) for v in col), dtype=bool, count=n)
        else:
            mask &= np.fromiter((_matches(v, wanted) for v in col), dtype=bool, count=n)
    return mask
