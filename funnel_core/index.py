"""What an index is: the one interface every index answers, in memory and on Milvus.

:class:`SearchIndex` is written from what the indexes share: :class:`~funnel_core.bm25.BM25Index`,
:class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`,
:class:`~funnel_core.embeddings.DenseIndex` and the Milvus indexes of
:mod:`funnel_core.backends.milvus` (``MilvusBM25Index``, ``MilvusClusteredBM25Index``,
``MilvusDenseIndex``). It is a structural :class:`typing.Protocol`: an index need not inherit
from it, and ``isinstance(x, SearchIndex)`` checks that the methods are there (not their
signatures: mypy checks those). ``tests/core/test_index_conformance.py`` runs one suite over
every implementation.

What every index does:

* ``index(units)`` builds over a list of :class:`~funnel_core.units.Unit` (replacing any previous
  content in one swap) and returns the index;
* ``search(query, k=..., filter=None)`` returns at most ``k`` scored copies of the indexed units,
  best first; an empty or whitespace-only query returns ``[]``;
* ``search_many(queries, k=..., filter=None)`` is ``[search(q) for q in queries]``, batched;
* ``filter`` is the in-memory filter language of :mod:`funnel_core.filters` (a dict of metadata
  values, a :class:`~funnel_core.filters.Comparison` / :class:`~funnel_core.filters.Condition`
  tree, an :class:`~funnel_core.filters.AllOf`; in memory also a predicate or a boolean mask; on
  Milvus also an expression string); it narrows and never pads;
* ``len(index)`` is the number of indexed units (documents for a clustered index);
* ``save(path)`` commits a snapshot and the class's ``load(path)`` reads it back.

Not in the protocol, because the indexes differ there: the list of indexed units (an in-memory
index holds it as ``units`` or ``documents``; a Milvus index keeps it on the server), the
per-index extras of ``search`` (``name=``, ``return_clusters=``, ``query_embeddings=``) and of
``load`` (``engine=``, ``uri=``/``token=``, ``embedder=``).

An object that persists an index inside its own snapshot (a retriever's ``persist``/``save``)
uses :func:`snapshot_writer` and :func:`read_snapshot_part`, never the index's private methods.

Settings: every index is a :class:`~funnel_core.settings.Settings` (validated keyword settings,
``to_dict``/``from_dict``; a build-time setting of a built index cannot be edited). Each in-memory
index saves them as ``"settings": index.to_dict()`` in its manifest and reads them back with
:func:`restore_settings`, which also reads the layouts written before (each index's
``_legacy_settings``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from funnel_core.errors import PersistError
from funnel_core.units import Unit

__all__ = ["SearchIndex", "snapshot_writer", "read_snapshot_part", "restore_settings"]


@runtime_checkable
class SearchIndex(Protocol):
    """The interface of every index (see the module docstring for the contract)."""

    def index(self, units: Sequence[Unit], /) -> Any:
        """Build over ``units`` (replaces the previous content); returns the index."""
        ...

    def search(self, query: str, /, *, k: int = 10, filter: Any = None) -> list[Unit]:
        """At most ``k`` units for ``query``, best first."""
        ...

    def search_many(self, queries: Sequence[str], /, *, k: int = 10,
                    filter: Any = None) -> list[list[Unit]]:
        """:meth:`search` for each query, in order."""
        ...

    def save(self, path: str | os.PathLike, /) -> None:
        """Commit a snapshot to ``path``."""
        ...

    @classmethod
    def load(cls, path: str | os.PathLike, /) -> Any:
        """Read back what :meth:`save` wrote."""
        ...

    def __len__(self) -> int:
        ...


def snapshot_writer(index: Any) -> Callable[[Path], dict[str, Any]]:
    """A function that writes ``index`` as it is *now* into a folder of another object's
    snapshot and returns the manifest entry to store for it (an in-memory index writes its
    files; a Milvus index writes none and returns its manifest: collection, settings, a
    fingerprint of the URI).

    The state is taken when this is called, so an empty index raises here, before the caller
    writes anything, and a concurrent ``index()``/``add()`` does not change what is written."""
    state = index._require_built()

    def write(folder: Path) -> dict[str, Any]:
        return index._write(folder, state)

    return write


def read_snapshot_part(index_cls: Any, folder: Path, entry: Mapping[str, Any]) -> Any:
    """The in-memory index of class ``index_cls`` that :func:`snapshot_writer` wrote into
    ``folder`` with the manifest ``entry`` (a Milvus entry is re-opened with
    :func:`funnel_core.backends.milvus.open_index` instead: it needs the caller's URI)."""
    return index_cls._read(folder, entry)


def restore_settings(index_cls: Any, folder: Path, meta: Mapping[str, Any], what: str,
                     **overrides: Any) -> Any:
    """A new, empty ``index_cls`` with the settings a manifest entry ``meta`` saved: its
    ``"settings"`` (``index.to_dict()``), or, in a layout written before, what the class's
    ``_legacy_settings(meta)`` reads from it; ``overrides`` (run-time settings such as
    ``engine=``, live objects such as ``embedder=``) replace saved values. A missing, unknown or
    invalid setting raises :class:`~funnel_core.errors.PersistError` naming ``what`` and
    ``folder``."""
    try:
        saved = meta.get("settings")
        if saved is None or "type" not in saved:  # a layout written before the settings were one dict
            saved = {"type": index_cls.__name__, **index_cls._legacy_settings(meta)}
        if not isinstance(saved, dict):
            raise TypeError(f"the settings are a {type(saved).__name__}, not a dict")
        return index_cls.from_dict(saved, **overrides)
    except (KeyError, TypeError, ValueError) as exc:
        raise PersistError(f"the {what} in {str(folder)!r} has an invalid or missing setting "
                           f"({type(exc).__name__}: {exc}); it was tampered with or is corrupt: "
                           "rebuild it.") from exc
