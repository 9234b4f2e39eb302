"""The in-memory metadata filter language: what ``filter=`` means on every in-memory index.

``{"key": value}`` (equality; a list-valued metadata field matches when it contains the value),
``{"key": [v1, v2]}`` (any of them), all keys must match; a predicate ``f(metadata) -> bool``; or
a boolean array aligned with the indexed units. Milvus compiles the same dict form into its own
boolean expressions (:mod:`funnel_core.backends.milvus.expressions`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np

from funnel_core.cache import LRUCache
from funnel_core.units import Unit

__all__ = ["MetadataFilter", "metadata_mask"]

#: A per-query filter: ``{"key": value}`` / ``{"key": [v1, v2]}`` (equality / membership, all
#: keys must match; a list-valued metadata field matches when it contains the value), a
#: predicate ``f(metadata) -> bool``, or a boolean array aligned with the indexed units.
MetadataFilter = Union[Mapping[str, Any], Callable[[dict], bool], np.ndarray, None]

_LISTLIKE = (list, tuple, set, frozenset)


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
