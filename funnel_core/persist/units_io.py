"""Units on disk: one JSON object per line (``units.jsonl``), metadata in the tagged JSON of
:mod:`funnel_core.persist.tagged_json`; and the copies of units an index keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from funnel_core.persist.tagged_json import from_json_safe, json_safe, metadata_copy
from funnel_core.units import Unit

__all__ = ["prepare_units", "write_json", "write_units", "read_units"]


def prepare_units(units: Sequence[Any], what: str) -> list[Unit]:
    """Own copies of ``units`` with JSON-safe metadata, for an index to keep.

    Checks types (``TypeError`` naming the position), converts numpy scalars in metadata to
    Python numbers, and raises ``TypeError`` naming the unit id and key for metadata that cannot
    be saved, at index time rather than at save time. Editing the caller's units afterwards does
    not change the index.
    """
    out = []
    for i, u in enumerate(units):
        if not isinstance(u, Unit):
            raise TypeError(f"{what} expects Unit objects, got {type(u).__name__} at position {i} "
                            f"({u!r:.60}); wrap texts with Unit(id=..., text=...).")
        if not isinstance(u.metadata, dict):
            raise TypeError(f"metadata of unit id={u.id!r} must be a dict, got {type(u.metadata).__name__}.")
        meta = metadata_copy(u.metadata, u.id)
        out.append(Unit(id=u.id, text=u.text, score=u.score, metadata=meta,
                        parent_id=None if u.parent_id is None else str(u.parent_id), level=str(u.level)))
    return out


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=True, allow_nan=False), encoding="ascii")


def write_units(path: Path, units: Sequence[Unit]) -> None:
    """One JSON object per line; ASCII-escaped, so lone surrogates in text survive."""
    with open(path, "w", encoding="ascii") as f:
        for u in units:
            d = u.to_dict()
            d["metadata"] = json_safe(d["metadata"], f"metadata of unit id={u.id!r}")
            f.write(json.dumps(d, ensure_ascii=True) + "\n")


def read_units(path: Path) -> list[Unit]:
    out = []
    with open(path, encoding="ascii") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            d = json.loads(line)
            if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not isinstance(d.get("text"), str):
                raise ValueError(f"line {n} of {path.name} is not a unit")
            if d.get("score") is not None and not isinstance(d["score"], (int, float)):
                raise ValueError(f"line {n} of {path.name} has a non-numeric score")
            if d.get("parent_id") is not None and not isinstance(d["parent_id"], str):
                raise ValueError(f"line {n} of {path.name} has a non-string parent_id")
            if not isinstance(d.get("level", "passage"), str):
                raise ValueError(f"line {n} of {path.name} has a non-string level")
            d["metadata"] = from_json_safe(d.get("metadata") or {})
            if not isinstance(d["metadata"], dict):
                raise ValueError(f"line {n} of {path.name} has non-dict metadata")
            out.append(Unit.from_dict(d))
    return out
