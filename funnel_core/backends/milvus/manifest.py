"""Persisted Milvus indexes: the small manifest folder and re-opening an index from it."""


from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    pass  # typing.Self from Python 3.11


from funnel_core.backends.milvus.bm25 import MilvusBM25Index
from funnel_core.backends.milvus.clustered import MilvusClusteredBM25Index
from funnel_core.backends.milvus.dense import MilvusDenseIndex
from funnel_core.errors import PersistError

_KINDS: dict[str, Any] = {c.kind: c for c in (MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex)}


def is_milvus_entry(meta: Any) -> bool:
    """Whether a persisted index entry (``index._write`` output) is a Milvus manifest."""
    return isinstance(meta, Mapping) and meta.get("backend") == "milvus"


def open_index(meta: Mapping[str, Any], uri: Any = None, token: str | None = None,
               **kwargs: Any) -> Any:
    """Re-open the Milvus index described by a manifest entry that ``index._write`` returned
    (stored inside a retriever's snapshot manifest): no data is read from disk, the collection
    is opened and its settings checked. ``uri`` (a URI or a :class:`MilvusBackend`) and
    ``token`` are the caller's; the entry records only a fingerprint of the URI to check."""
    kind = meta.get("format") if isinstance(meta, Mapping) else None
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None or not is_milvus_entry(meta):
        raise PersistError(f"the saved index entry names {kind!r}, which is no Milvus index of "
                           f"this funnel-rag ({sorted(_KINDS)}); save it again.")
    return cls._from_manifest(meta, uri=uri, token=token, **kwargs)


def load_index(path: str | os.PathLike, default: Any = None, **kwargs: Any) -> Any:
    """Load whatever index was saved at ``path``: a Milvus manifest re-opens its collection
    (``kwargs``: ``uri=``, ``token=``, ...), anything else goes to ``default.load(path, **kwargs)`` (e.g.
    ``BM25Index``)."""
    from funnel_core.persist import snapshot_info

    try:
        fmt = snapshot_info(path).get("format")
    except Exception:
        fmt = None
    cls = _KINDS.get(fmt) if isinstance(fmt, str) else None
    if cls is not None:
        return cls.load(path, **kwargs)
    if default is None:
        raise PersistError(f"{str(path)!r} holds no saved Milvus index ({fmt!r}); pass "
                           "default=<index class> to load other indexes.")
    return default.load(path, **kwargs)
