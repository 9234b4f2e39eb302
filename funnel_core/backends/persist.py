"""A retriever's snapshot: its index (in memory or on Milvus) and its own settings, written and
read by one path for both adapter packages.

The manifest's ``meta`` holds ``"index"`` (what :func:`funnel_core.index.snapshot_writer`
returned: the in-memory index's settings with its files under ``index/``, or a Milvus index's
manifest entry, no data) and ``"settings"`` (the retriever's, as its constructor takes them), plus
what the caller's ``files`` hook adds (a LlamaIndex retriever's nodes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from funnel_core.backends.milvus.manifest import is_milvus_entry, load_index, open_index
from funnel_core.errors import PersistError
from funnel_core.filters import persistable_filter
from funnel_core.index import read_snapshot_part, snapshot_writer
from funnel_core.persist import load_snapshot, save_snapshot, snapshot_info, snapshot_owner

__all__ = ["save_retriever", "load_retriever", "retriever_settings", "load_retriever_or_index"]


def retriever_settings(obj: Any, names: Sequence[str], what: str,
                       convert: Callable[[Any], Any] = lambda flt: flt) -> dict[str, Any]:
    """``obj``'s settings ``names`` as a snapshot saves them. Its filter (``filter`` or
    ``filters``), first converted by ``convert`` (a framework's filter object -> a dict or an
    expression), must be persistable: a predicate or a mask refuses the save (``what`` names it)
    before anything is written, since the loaded retriever would be wider than this one."""
    settings = {n: getattr(obj, n) for n in names}
    for key in ("filter", "filters"):
        if key in settings:
            settings[key] = persistable_filter(convert(settings[key]), what)
    return settings


def save_retriever(path: str | os.PathLike, fmt: str, index: Any, settings: Mapping[str, Any], *,
                   files: Optional[Callable[[Path, bool], Mapping[str, Any]]] = None,
                   owner: Optional[str] = None, overwrite: bool = True) -> None:
    """Commit ``index`` and the retriever's ``settings`` to ``path`` (format ``fmt``, version 1).

    ``files(folder, on_milvus)`` writes the caller's own files into the snapshot folder and
    returns the manifest keys to add. The index state is taken now, so an empty index raises
    before anything is written; ``owner``/``overwrite`` as for
    :func:`funnel_core.persist.save_snapshot`."""
    write_index = snapshot_writer(index)
    settings = dict(settings)

    def write(folder: Path) -> dict[str, Any]:
        entry = write_index(folder / "index")
        extra = files(folder, is_milvus_entry(entry)) if files is not None else {}
        return {"index": entry, **extra, "settings": settings}

    save_snapshot(path, fmt, 1, write, owner=owner, overwrite=overwrite)


def load_retriever(path: str | os.PathLike, fmt: str, index_cls: Any, what: str, *,
                   files: Optional[Callable[[Path, Mapping[str, Any]], Any]] = None,
                   backend: Any = None, token: Optional[str] = None,
                   verify: bool = True) -> tuple[Any, dict[str, Any], Any, Optional[str]]:
    """Read what :func:`save_retriever` wrote: ``(index, settings, extra, owner)``.

    An in-memory index is read as ``index_cls``, and ``files(folder, meta)`` reads the caller's
    files (``extra``; ``None`` over Milvus). A Milvus index re-opens its collection at
    ``backend`` (a URI or a ``MilvusBackend``, with ``token``), after the snapshot is read, so
    its errors are its own."""
    def read(folder: Path, manifest: dict) -> tuple[Any, dict[str, Any], Any, Optional[str]]:
        meta = manifest["meta"]
        entry = meta.get("index") or {}
        settings = dict(meta.get("settings") or {})
        if is_milvus_entry(entry):
            return entry, settings, None, snapshot_owner(manifest)
        index = read_snapshot_part(index_cls, folder / "index", entry)
        return index, settings, files(folder, meta) if files is not None else None, snapshot_owner(manifest)

    index, settings, extra, owner = load_snapshot(path, fmt, 1, what, read, verify=verify)
    if isinstance(index, dict):
        index = open_index(index, uri=backend, token=token)
    return index, settings, extra, owner


def load_retriever_or_index(path: str | os.PathLike, fmt: str, index_cls: Any, what: str, *,
                            backend: Any = None, token: Optional[str] = None) -> tuple[Any, dict[str, Any]]:
    """``(index, settings)`` of what :func:`save_retriever` wrote in format ``fmt``, or of a bare
    index folder (``index.save(path)``: no settings; a Milvus one re-opens its collection at
    ``backend``). A snapshot of format ``fmt`` that fails to load raises as it is."""
    try:
        index, settings, _, _ = load_retriever(path, fmt, index_cls, what, backend=backend, token=token)
        return index, settings
    except PersistError:
        try:
            ours = snapshot_info(path).get("format") == fmt
        except Exception:
            ours = False
        if ours:
            raise
    milvus = {"uri": backend, "token": token} if backend is not None or token else {}
    return load_index(path, index_cls, **milvus), {}
