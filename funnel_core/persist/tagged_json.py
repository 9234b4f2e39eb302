"""JSON that keeps what plain JSON loses: tuples and dicts with non-string keys survive a round
trip through a tagged form (``{"$tuple": [...]}``, ``{"$dict": [[key, value], ...]}``), numpy
scalars and arrays become Python numbers and lists. Used for the metadata of saved units."""

from __future__ import annotations

from typing import Any

__all__ = ["json_safe", "from_json_safe"]  # metadata_copy: for units_io

_TAGS = ("$tuple", "$dict", "$set")
_PLAIN = (str, int, float, bool)


def json_safe(value: Any, where: str = "value") -> Any:
    """A JSON-representable copy of ``value`` that :func:`from_json_safe` turns back into it.

    Tuples and dicts with non-string keys (int, float, bool, None, tuples) are kept through a
    tagged form; numpy scalars become Python numbers, numpy arrays lists. Anything JSON cannot
    hold (datetime, bytes, sets of objects, custom classes) raises ``TypeError`` naming
    ``where`` (the unit id and key path) and the fix.
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, list):
        return [json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"$tuple": [json_safe(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (len(value) == 1 and next(iter(value)) in _TAGS):
            return {k: json_safe(v, f"{where}[{k!r}]") for k, v in value.items()}
        for k in value:
            if not (k is None or isinstance(k, (str, bool, int, float, tuple))):
                raise TypeError(f"{where} has a key {k!r} of type {type(k).__name__} that cannot be "
                                "saved; use str, int, float, bool or tuple keys.")
        return {"$dict": [[json_safe(k, f"{where} key"), json_safe(v, f"{where}[{k!r}]")]
                          for k, v in value.items()]}
    mod = type(value).__module__
    if mod == "numpy" or mod.startswith("numpy."):
        import numpy as np

        if isinstance(value, np.generic):
            return json_safe(value.item(), where)
        if isinstance(value, np.ndarray):
            return json_safe(value.tolist(), where)
    raise TypeError(
        f"{where} is a {type(value).__name__} ({value!r:.60}), which cannot be saved with the "
        "index; convert it to str, int, float, bool, None, list, tuple or dict first (e.g. "
        "datetime -> value.isoformat(), bytes -> value.decode(), set -> sorted(list(value))).")


def from_json_safe(value: Any) -> Any:
    """Invert :func:`json_safe`."""
    if isinstance(value, list):
        return [from_json_safe(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag == "$tuple" and isinstance(inner, list):
                return tuple(from_json_safe(v) for v in inner)
            if tag == "$dict" and isinstance(inner, list):
                return {_hashable(from_json_safe(k)): from_json_safe(v) for k, v in inner}
        return {k: from_json_safe(v) for k, v in value.items()}
    return value


def _hashable(key: Any) -> Any:
    if isinstance(key, list):  # pragma: no cover - only from hand-edited files
        return tuple(key)
    return key


def metadata_copy(metadata: dict[str, Any], unit_id: str) -> dict[str, Any]:
    """A copy of a unit's ``metadata`` that a JSON round trip (:func:`json_safe`, then
    :func:`from_json_safe`) gives back unchanged: flat metadata of plain values is copied as it
    is; anything else is converted (numpy scalars to Python numbers), and what cannot be saved
    raises ``TypeError`` naming ``unit_id`` and the key."""
    m = metadata
    if all(type(k) is str and (v is None or type(v) in _PLAIN) for k, v in m.items()) and not (
            len(m) == 1 and next(iter(m)) in _TAGS):
        return dict(m)  # fast path: flat metadata of plain values
    return from_json_safe(json_safe(m, f"metadata of unit id={unit_id!r}"))
