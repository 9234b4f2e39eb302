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

__all__ = ["AllOf", "MetadataFilter", "combine_filters", "is_empty_filter", "metadata_mask",
           "persistable_filter"]

#: A per-query filter: ``{"key": value}`` / ``{"key": [v1, v2]}`` (equality / membership, all
#: keys must match; a list-valued metadata field matches when it contains the value), a
#: predicate ``f(metadata) -> bool``, a boolean array aligned with the indexed units, or an
#: :class:`AllOf` of them (all must hold).
MetadataFilter = Union[Mapping[str, Any], Callable[[dict], bool], np.ndarray, "AllOf", None]

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


def is_empty_filter(filter: Any) -> bool:
    """Whether ``filter`` constrains nothing: ``None``, an empty dict, or a blank string (a blank
    Milvus expression). A boolean array is never empty (it is a mask, even all ``True``)."""
    if filter is None:
        return True
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
