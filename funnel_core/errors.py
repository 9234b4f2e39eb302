"""Errors and argument checks shared by every component.

Every check names the offending value and says how to fix it, so a user never has to read the
stack trace to learn what went wrong.
"""

from __future__ import annotations

import re
from typing import Any, Literal, overload

_SURROGATE_RE = re.compile("[\ud800-\udfff]")

__all__ = [
    "FunnelError",
    "ModelIntegrityError",
    "ModelLoadError",
    "PersistError",
    "check_query",
    "check_positive_int",
    "BuiltSettingError",
    "check_probability",
]


class FunnelError(Exception):
    """Base class of the errors funnel-rag raises on purpose."""


class ModelLoadError(FunnelError, OSError):
    """A model could not be loaded (for example a hub name on a machine without network)."""


class ModelIntegrityError(FunnelError, ValueError):
    """A model folder's files do not match its ``MANIFEST.sha256`` (:mod:`funnel_core.train.card`)."""


class PersistError(FunnelError, OSError):
    """A persist folder is missing, incomplete or corrupt."""


class BuiltSettingError(FunnelError, ValueError):
    """An edit of a build-time setting of an index that is already built
    (:attr:`funnel_core.settings.Settings.build_settings`)."""


def check_query(query: Any) -> str:
    """Return the query stripped of surrounding whitespace.

    Raises ``TypeError`` for a non-string query. An empty or whitespace-only query is *not* an
    error: callers return an empty result for it (documented behaviour of every retriever).
    Lone surrogates (text decoded with ``errors="surrogateescape"``) become U+FFFD.
    """
    if not isinstance(query, str):
        raise TypeError(
            f"query must be a str, got {type(query).__name__} ({query!r:.80}); "
            "pass the question text as a str, e.g. 'what is BM25?'."
        )
    query = query.strip()
    if not query.isascii() and _SURROGATE_RE.search(query):
        # a lone surrogate (broken decoding) cannot be encoded for tokenizers: make it a
        # non-word character, so the rest of the query still works
        query = _SURROGATE_RE.sub("\ufffd", query)
    return query


@overload
def check_positive_int(value: Any, name: str) -> int: ...


@overload
def check_positive_int(value: Any, name: str, *, allow_none: Literal[False]) -> int: ...


@overload
def check_positive_int(value: Any, name: str, *, allow_none: bool) -> int | None: ...


def check_positive_int(value: Any, name: str, *, allow_none: bool = False) -> int | None:
    """Check that ``value`` is an int >= 1 (or ``None`` when allowed) and return it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 1, got {type(value).__name__} {value!r}.")
    if value <= 0:
        raise ValueError(f"{name} must be >= 1, got {value}; ask for at least one result.")
    return value


def check_probability(value: Any, name: str) -> float:
    """Check that ``value`` is a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number in [0, 1], got {type(value).__name__} {value!r}.")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}.")
    return float(value)
