"""Where an index lives: :class:`MilvusBackend` (a Milvus URI and its credentials) and the
helpers that turn an adapter's ``backend=`` argument into one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    pass  # typing.Self from Python 3.11


from funnel_core.backends.milvus.bm25 import MilvusBM25Index
from funnel_core.backends.milvus.client import normalise_uri, split_credentials
from funnel_core.backends.milvus.clustered import MilvusClusteredBM25Index
from funnel_core.backends.milvus.collection import Collection
from funnel_core.backends.milvus.dense import MilvusDenseIndex
from funnel_core.settings import checked_keywords


def is_milvus_index(index: Any) -> bool:
    """Whether ``index`` keeps its data in Milvus (one of this package's indexes): the adapters
    ask it where their framework's filter objects must be compiled into Milvus expressions and
    where results carry the node structure stored with them. Every index, in memory or not, is a
    :class:`~funnel_core.index.SearchIndex`; this tells them apart by class, not by name."""
    return isinstance(index, Collection)


#: The settings of a Milvus dense index that come from the backend, not from ``**index_config``.
_CONNECTION = ("uri", "collection", "embedder", "token", "db_name", "timeout", "show_progress")


def build_dense(owner: str, backend: "MilvusBackend | None", embedder: Any, config: dict[str, Any]) -> Any:
    """An empty dense index for a retriever's ``from_documents`` / ``from_defaults`` (``owner``
    names it): on Milvus when ``backend`` is given, else the in-memory
    :class:`~funnel_core.embeddings.DenseIndex`. A key of ``config`` that the index does not
    take raises a ``TypeError`` naming ``owner`` and the accepted keys (not an internal class's
    ``__init__``)."""
    from funnel_core.embeddings import DenseIndex
    from funnel_core.settings import build_index, keyword_names

    if backend is None:
        accepted = [n for n in keyword_names(DenseIndex) if n != "embedder"]
        return build_index(owner, lambda **kw: DenseIndex(embedder, **kw), config, accepted)
    accepted = [n for n in keyword_names(MilvusDenseIndex) if n not in _CONNECTION]
    return build_index(owner, lambda **kw: backend.dense(embedder, **kw), config, accepted)


def build_bm25(owner: str, backend: Any, config: dict[str, Any], clustered: bool = False) -> Any:
    """An empty BM25 index (``clustered``: a clustered BM25 index) for a retriever's factory
    (``owner`` names it): in memory, or on Milvus when ``backend`` (a URI or a
    :class:`MilvusBackend`) is given. A key of ``config`` that the index does not take raises a
    ``TypeError`` naming ``owner`` and the accepted keys."""
    from funnel_core.bm25 import BM25Index
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
    from funnel_core.settings import build_index, keyword_names

    memory = ClusteredBM25Index if clustered else BM25Index
    b = as_backend(backend)
    factory = memory if b is None else b.clustered if clustered else b.bm25
    return build_index(owner, factory, config, keyword_names(memory))


@dataclass(frozen=True)
class MilvusBackend:
    """Where an index keeps its data when it is not in this process's memory: Milvus.

    The one argument the retrievers of both adapters take (``backend=``) to build into Milvus
    and re-open what is there::

        MilvusBackend("funnel.db")                              # Milvus Lite, a local file
        MilvusBackend("http://milvus:19530", token="user:pw", db_name="rag")   # a server/cluster

    Args:
        uri: A local path ending in ``.db`` (embedded Milvus Lite) or ``http(s)://host:port``.
        collection: Collection (alias) name; ``None``: the index class's default
            (``funnel_bm25``, ``funnel_clusters``, ``funnel_dense``).
        token: Milvus token (``"user:password"`` or an API key); never written to disk.
        db_name: Milvus database (server only).
        timeout: Seconds for each Milvus call (``None``: pymilvus default).
        show_progress: tqdm bars while inserting.
    """

    uri: str = "funnel.db"
    collection: str | None = None
    token: str | None = field(default=None, repr=False)
    db_name: str | None = None
    timeout: float | None = None
    show_progress: bool = False

    def __post_init__(self) -> None:
        uri, token = split_credentials(normalise_uri(self.uri))
        object.__setattr__(self, "uri", uri)  # credentials in the URI become the token
        if self.token is None and token is not None:
            object.__setattr__(self, "token", token)

    def with_collection(self, collection: str) -> "MilvusBackend":
        """The same connection, another collection."""
        return replace(self, collection=collection)

    def _kwargs(self) -> dict[str, Any]:
        return {"token": self.token, "db_name": self.db_name, "timeout": self.timeout,
                "show_progress": self.show_progress}

    def bm25(self, **bm25_config: Any) -> "MilvusBM25Index":
        """A :class:`MilvusBM25Index` on this connection (not built: call ``.index(...)``, or
        search to re-open an existing collection)."""
        return MilvusBM25Index(self.uri, self.collection or "funnel_bm25", **self._kwargs(),
                               **bm25_config)

    def clustered(self, **config: Any) -> "MilvusClusteredBM25Index":
        """A :class:`MilvusClusteredBM25Index` on this connection (clustering and BM25 settings
        as keyword arguments)."""
        return MilvusClusteredBM25Index(self.uri, self.collection or "funnel_clusters",
                                        **self._kwargs(), **config)

    def dense(self, embedder: Any = None, **config: Any) -> "MilvusDenseIndex":
        """A :class:`MilvusDenseIndex` on this connection (``index_type``, ``batch_size``, ...)."""
        return MilvusDenseIndex(self.uri, self.collection or "funnel_dense", embedder,
                                **self._kwargs(), **config)


#: What ``backend=`` means when it is not a Milvus URI: the in-memory default.
IN_MEMORY = ("memory", "bm25s", "numpy")


def as_backend(backend: Any) -> MilvusBackend | None:
    """``backend=`` as the adapters take it: ``None`` / ``"memory"`` -> ``None`` (in memory), a
    :class:`MilvusBackend` as is, a URI string (``"funnel.db"``, ``"http://host:19530"``) ->
    ``MilvusBackend(uri)``."""
    if backend is None or isinstance(backend, MilvusBackend):
        return backend
    if isinstance(backend, (str, os.PathLike)):
        if isinstance(backend, str) and backend in IN_MEMORY:
            return None
        try:
            return MilvusBackend(os.fspath(backend))
        except ValueError as exc:
            raise ValueError(f"backend={os.fspath(backend)!r} is neither 'memory' (the default, "
                             "in-process) nor a Milvus URI: pass a local path ending in '.db' "
                             "(Milvus Lite) or 'http://host:19530', or "
                             "funnel_core.backends.milvus.MilvusBackend(uri, token=..., db_name=...).") from exc
    raise TypeError(f"backend must be None/'memory', a Milvus URI string or a "
                    f"funnel_core.backends.milvus.MilvusBackend, got {type(backend).__name__}.")


@checked_keywords
def require_backend(backend: Any, where: str) -> MilvusBackend:
    """``backend`` as a :class:`MilvusBackend` for ``where`` (a ``from_backend`` that re-opens a
    collection); ``None``/``"memory"`` is an error naming ``where``."""
    b = as_backend(backend)
    if b is None:
        raise ValueError(f"{where} re-opens a Milvus collection: pass backend=MilvusBackend(uri, "
                         "collection=...) or a Milvus URI, not 'memory'.")
    return b


def hybrid_backends(backend: Any, reopen_for: str | None = None) -> tuple[Any, Any]:
    """The two collections of a hybrid retriever on ``backend`` (any form :func:`as_backend`
    takes): ``<collection>_bm25`` and ``<collection>_dense`` (``collection`` default
    ``funnel_hybrid``); ``(None, None)`` in memory, which ``reopen_for`` (the ``from_backend``
    that re-opens them) refuses, naming it."""
    backend = require_backend(backend, reopen_for) if reopen_for else as_backend(backend)
    if backend is None:
        return None, None
    base = backend.collection or "funnel_hybrid"
    return backend.with_collection(f"{base}_bm25"), backend.with_collection(f"{base}_dense")
