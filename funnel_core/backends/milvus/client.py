"""Milvus connection: settings and error classes, URI handling, the shared client cache and :class:`MilvusBackend`."""


from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

if TYPE_CHECKING:  # pragma: no cover
    pass  # typing.Self from Python 3.11


from funnel_core.errors import FunnelError

FORMAT_VERSION = 1
META_KEY = "funnel_rag.meta"
#: Milvus VARCHAR limit (bytes).
MAX_VARCHAR = 65535
MAX_ID_BYTES = 1024
#: Milvus's largest ``limit`` for one search.
MAX_TOPK = 16384
BATCH_BYTES = 8 * 2**20
ESCAPE = "qx"
SAFE_TOKEN = re.compile(r"[a-z0-9]+\Z")


# -- errors ------------------------------------------------------------------------------------
class MilvusError(FunnelError):
    """Base class of the Milvus backend's errors."""


class MilvusConnectionError(MilvusError, ConnectionError):
    """The Milvus URI cannot be reached (or pymilvus/milvus-lite are missing)."""


class MilvusCollectionError(MilvusError, LookupError):
    """The collection does not exist, or is not one funnel-rag built."""


class MilvusSettingsError(MilvusError, ValueError):
    """The collection was built with other settings (tokenizer, dimension, format version)."""


class UnsupportedFilterError(MilvusError, TypeError):
    """A filter that cannot be pushed down to Milvus (a callable or a boolean mask)."""


# -- connection -----------------------------------------------------------------------------------
_CLIENTS: dict[tuple, Any] = {}
CLIENTS_LOCK = threading.Lock()


def is_local(uri: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*://", uri, flags=re.I)


def normalise_uri(uri: str | os.PathLike) -> str:
    if not isinstance(uri, (str, os.PathLike)):
        raise TypeError(f"uri must be a str (a local '.db' path for Milvus Lite, or "
                        f"'http://host:19530'), got {type(uri).__name__} {uri!r:.60}.")
    uri = os.fspath(uri)
    if not uri:
        raise ValueError("uri is empty; pass a local path ending in '.db' (Milvus Lite) or "
                         "'http://host:19530' (a Milvus server).")
    if is_local(uri):
        if not uri.endswith(".db"):
            raise ValueError(f"local Milvus Lite uri {uri!r} must end in '.db' (e.g. "
                             "'./funnel.db'); for a server pass 'http://host:19530'.")
        return str(Path(uri).expanduser().resolve())
    return uri


def split_credentials(uri: str) -> tuple[str, str | None]:
    """``(uri without credentials, "user:password" or None)``: pymilvus accepts
    ``http://user:password@host:19530``; we keep the credentials apart from the URI so that they
    are never written to a manifest or shown in an error message (they become the token)."""
    if is_local(uri):
        return uri, None
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, sep, password = userinfo.partition(":")
    token = f"{unquote(user)}:{unquote(password)}" if sep else unquote(user)
    return urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment)), token or None


def uri_fingerprint(uri: str) -> str:
    """SHA-256 of a (normalised, credential-free) URI: what a saved manifest records instead of
    the URI, so that loading can check the caller's URI without the folder saying where to go."""
    return hashlib.sha256(split_credentials(normalise_uri(uri))[0].encode("utf-8")).hexdigest()


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with every secret (token, password, credentials in a URI) replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
            user, sep, password = secret.partition(":")
            if sep and password:
                text = text.replace(password, "***")
    return re.sub(r"(://)[^/@\s'\"]*@", r"\1***@", text)


def get_client(uri: str, token: str | None, db_name: str | None, timeout: float | None) -> Any:
    """One ``MilvusClient`` per (uri, token, db_name) in this process (it is thread-safe)."""
    key = (uri, token or "", db_name or "")
    with CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is not None:
            return client
        try:
            from pymilvus import MilvusClient
        except ImportError as exc:
            raise MilvusConnectionError(
                "the Milvus backend needs pymilvus (and milvus-lite for a local '.db'): "
                "pip install 'funnel-rag[milvus]'  (or: pip install pymilvus milvus-lite)."
            ) from exc
        if is_local(uri):
            try:
                import milvus_lite  # noqa: F401
            except ImportError as exc:
                raise MilvusConnectionError(
                    f"uri {uri!r} is a local Milvus Lite database but milvus-lite is not "
                    "installed: pip install milvus-lite (or use 'http://host:19530')."
                ) from exc
            if not Path(uri).parent.is_dir():
                raise MilvusConnectionError(
                    f"the folder of the Milvus Lite database {uri!r} does not exist; create "
                    f"{str(Path(uri).parent)!r} first or pass another path.")
        kwargs: dict[str, Any] = {"uri": uri}
        if token:
            kwargs["token"] = token
        if db_name:
            kwargs["db_name"] = db_name
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            client = MilvusClient(**kwargs)
            client.list_collections()
        except Exception as exc:
            where = f"database {db_name!r} at " if db_name else ""
            raise MilvusConnectionError(redact(
                f"cannot reach Milvus {where}{uri!r} ({type(exc).__name__}: {exc}); start the "
                "server (or check host, port, token and db_name), or pass a local path such as "
                "'./funnel.db' to use embedded Milvus Lite.", token)) from None
        _CLIENTS[key] = client
        return client
