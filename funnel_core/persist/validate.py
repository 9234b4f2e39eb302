"""Validators for settings read from a manifest (untrusted input): numbers finite and in range,
model names of bounded length. Each raises naming the setting and the value."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_number", "check_model_name"]


def check_number(value: Any, name: str, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, integer: bool = False) -> float | int:
    """A finite number (int when ``integer``) within [lo, hi] (``lo_open``: (lo, hi]); raise
    ``TypeError``/``ValueError`` naming ``name`` and the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        kind = "an int" if integer else "a number"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__} {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}.")
    if lo is not None and (value <= lo if lo_open else value < lo) or hi is not None and value > hi:
        rng = f"{'(' if lo_open else '['}{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise ValueError(f"{name} must be in {rng}, got {value!r}.")
    return value


def check_model_name(value: Any) -> str:
    """A model name or folder read from a manifest: a non-empty str of at most 4,096 characters;
    raise ``ValueError`` naming the value otherwise."""
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ValueError(f"invalid embedder name {value!r:.80}")
    return value
