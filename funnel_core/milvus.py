"""The funnel's indexes on Milvus: flat BM25, FunnelRAG's clustered BM25, and dense (HNSW).

Three classes with the *same query interface and results* as the in-memory indexes:

* :class:`MilvusBM25Index` ~ :class:`funnel_core.bm25.BM25Index` (``search``/``search_many``)
* :class:`MilvusClusteredBM25Index` ~ :class:`funnel_core.clustered.ClusteredBM25Index`
* :class:`MilvusDenseIndex` ~ :class:`funnel_core.embeddings.DenseIndex`

One argument picks where the data lives: ``uri="funnel.db"`` is Milvus Lite (embedded, a local
folder, ``pip install funnel-rag[milvus]``), ``uri="http://host:19530"`` (plus ``token`` and
``db_name``) a Milvus server or cluster. The client code is the same.

How BM25 is kept identical to the bm25s backend
-----------------------------------------------
Milvus computes BM25 itself (a ``BM25`` function over a text field into a sparse inverted
index, metric ``BM25``, ``bm25_k1``/``bm25_b`` set from our config). Its analyzers differ from
ours (Milvus Lite 3.2 has no stemming or stopword filters that work), so we feed it text that is
*already tokenized by our tokenizer* (lower-casing, token pattern, stopwords, Snowball stemmer):
tokens joined by spaces, each token made safe for Milvus's ``standard`` tokenizer (``\\w+`` +
lower-casing): a token that is not plain ``[a-z0-9]+`` is written as ``qx`` + its UTF-8 hex, and
so is a token that starts with ``qx``; the mapping is one-to-one, so Milvus counts exactly our
terms and keeps its own BM25 statistics (N, df, average length), which equal bm25s's "lucene"
variant (the only one Milvus implements). The query is tokenized the same way. Milvus returns
``distance = -score`` for BM25 (smaller is better): we return ``score = -distance``.

Milvus scores carry the ``(k1 + 1)`` factor of textbook BM25 that bm25s's "lucene" variant
leaves out; we divide it out, so the scores are the same numbers.

Milvus Lite facts that matter (read from milvus-lite 3.2.2's source and measured here):
statistics are per *segment*, and rows still in the in-memory buffer are scored with statistics
of the *filtered* subset; so every build ends with a ``flush`` (one sealed segment up to
``MILVUS_LITE_MEMTABLE_MEMORY_LIMIT_BYTES``, 128 MiB by default). A Milvus server aggregates
BM25 statistics over the collection.

Filters are pushed down as Milvus boolean expressions (never padded): ``{"key": value}`` ->
``metadata["key"] == value`` (or a list-valued field containing it), ``{"key": [v1, v2]}`` ->
any of them; a ``str`` is used as a raw Milvus expression (e.g. ``'metadata["year"] >= 2015'``).
Callables and boolean masks cannot be pushed down: they raise :class:`UnsupportedFilterError`.

Builds are atomic: data goes into a fresh physical collection ``<name>__fr<hex>``; only when it is
complete does the alias ``<name>`` move to it (``alter_alias``) and the old one get dropped. A
failed build drops its half-written collection and leaves ``<name>`` as it was. Settings (format
version, tokenizer/BM25 settings, dimension, ...) are stored in the collection's properties and
checked when an index is re-opened. ``save(path)`` writes only a small manifest (URI, names,
settings; never the token, never the data); ``load(path)`` re-opens without re-indexing.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self  # typing.Self from Python 3.11

import numpy as np

from funnel_core.errors import FunnelError, PersistError, check_positive_int, check_query
from funnel_core.units import Unit, check_unique_ids, units_from_texts

__all__ = [
    "MilvusBM25Index",
    "MilvusClusteredBM25Index",
    "MilvusDenseIndex",
    "MilvusError",
    "MilvusConnectionError",
    "MilvusCollectionError",
    "MilvusSettingsError",
    "UnsupportedFilterError",
    "search_dense",
    "filter_expression",
    "comparison_expression",
    "combine_expressions",
    "milvus_tokens",
    "load_index",
    "open_index",
    "is_milvus_entry",
    "MilvusBackend",
    "as_backend",
    "hybrid_backends",
    "FORMAT_VERSION",
]

FORMAT_VERSION = 1
META_KEY = "funnel_rag.meta"
#: Milvus VARCHAR limit (bytes).
MAX_VARCHAR = 65535
MAX_ID_BYTES = 1024
#: Milvus's largest ``limit`` for one search.
MAX_TOPK = 16384
_BATCH_BYTES = 8 * 2**20
_ESCAPE = "qx"
_SAFE_TOKEN = re.compile(r"[a-z0-9]+\Z")


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
_CLIENTS_LOCK = threading.Lock()


def search_dense(index: Any, query: str, k: int, flt: Any, *, argument: str = "filter") -> list:
    """Search a dense index for the framework retrievers: a Milvus index gets ``flt`` pushed
    down; the in-memory :class:`~funnel_core.embeddings.DenseIndex` takes no filter, so one
    raises :class:`UnsupportedFilterError` naming the fix (``argument`` is the retriever's name
    for the filter)."""
    from funnel_core.embeddings import DenseIndex

    if not isinstance(index, DenseIndex):
        return index.search(query, k=k, filter=flt)
    if flt is not None:
        raise UnsupportedFilterError(
            "the in-memory DenseIndex takes no metadata filter; build the retriever with "
            f"backend=MilvusBackend(...) to filter, or drop {argument}=.")
    return index.search(query, k=k)


def _is_local(uri: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*://", uri, flags=re.I)


def _normalise_uri(uri: str | os.PathLike) -> str:
    if not isinstance(uri, (str, os.PathLike)):
        raise TypeError(f"uri must be a str (a local '.db' path for Milvus Lite, or "
                        f"'http://host:19530'), got {type(uri).__name__} {uri!r:.60}.")
    uri = os.fspath(uri)
    if not uri:
        raise ValueError("uri is empty; pass a local path ending in '.db' (Milvus Lite) or "
                         "'http://host:19530' (a Milvus server).")
    if _is_local(uri):
        if not uri.endswith(".db"):
            raise ValueError(f"local Milvus Lite uri {uri!r} must end in '.db' (e.g. "
                             "'./funnel.db'); for a server pass 'http://host:19530'.")
        return str(Path(uri).expanduser().resolve())
    return uri


def _client(uri: str, token: str | None, db_name: str | None, timeout: float | None) -> Any:
    """One ``MilvusClient`` per (uri, token, db_name) in this process (it is thread-safe)."""
    key = (uri, token or "", db_name or "")
    with _CLIENTS_LOCK:
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
        if _is_local(uri):
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
            raise MilvusConnectionError(
                f"cannot reach Milvus {where}{uri!r} ({type(exc).__name__}: {exc}); start the "
                "server (or check host, port, token and db_name), or pass a local path such as "
                "'./funnel.db' to use embedded Milvus Lite."
            ) from exc
        _CLIENTS[key] = client
        return client


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
        object.__setattr__(self, "uri", _normalise_uri(self.uri))

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
                             "funnel_core.milvus.MilvusBackend(uri, token=..., db_name=...).") from exc
    raise TypeError(f"backend must be None/'memory', a Milvus URI string or a "
                    f"funnel_core.milvus.MilvusBackend, got {type(backend).__name__}.")


def hybrid_backends(backend: MilvusBackend) -> tuple[MilvusBackend, MilvusBackend]:
    """The two collections of a hybrid retriever on ``backend``: ``<collection>_bm25`` and
    ``<collection>_dense`` (``collection`` default ``funnel_hybrid``)."""
    base = backend.collection or "funnel_hybrid"
    return backend.with_collection(f"{base}_bm25"), backend.with_collection(f"{base}_dense")


# -- tokens and filters ---------------------------------------------------------------------------
def _safe_token(tok: str) -> str:
    if _SAFE_TOKEN.match(tok) and not tok.startswith(_ESCAPE):
        return tok
    return _ESCAPE + tok.encode("utf-8").hex()


def milvus_tokens(tokens: Sequence[str]) -> str:
    """Our tokens as one string that Milvus's ``standard`` tokenizer splits back into exactly
    the same (one-to-one escaped) terms."""
    return " ".join(_safe_token(t) for t in tokens)


def _literal(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise UnsupportedFilterError(f"filter value {value!r} for key {key!r} is not finite; "
                                         "Milvus expressions need finite numbers.")
        return repr(float(value))
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    raise UnsupportedFilterError(
        f"filter value {value!r:.60} ({type(value).__name__}) for key {key!r} cannot be pushed "
        "down to Milvus; use str, int, float or bool values (or a list of them), or pass a raw "
        "Milvus expression string such as 'metadata[\"year\"] >= 2015'.")


def _json_path(field: str, key: str) -> str:
    return f"{field}[{json.dumps(key, ensure_ascii=False)}]"


def filter_expression(filter: Any, field: str = "metadata") -> str | None:
    """Translate a funnel-rag metadata filter into a Milvus boolean expression.

    ``None`` -> ``None``; a ``str`` is returned as is (a raw Milvus expression); a dict of
    ``key: value`` / ``key: [values]`` becomes ANDed equality / membership tests on the JSON
    ``metadata`` field, a list-valued metadata field matching when it contains the value (the
    same semantics as :func:`funnel_core.bm25.metadata_mask`). An empty list matches nothing
    (``"false"``). Callables and boolean arrays raise :class:`UnsupportedFilterError`.
    """
    if filter is None:
        return None
    if isinstance(filter, str):
        if not filter.strip():
            return None
        return filter
    if isinstance(filter, np.ndarray):
        raise UnsupportedFilterError(
            "a boolean-mask filter is aligned with an in-memory index and cannot be pushed down "
            "to Milvus; pass a dict such as {'source': 'a.md'} / {'year': [2020, 2021]} or a "
            "Milvus expression string such as 'metadata[\"year\"] >= 2015'.")
    if callable(filter):
        raise UnsupportedFilterError(
            f"a callable filter ({getattr(filter, '__name__', type(filter).__name__)}) cannot be "
            "pushed down to Milvus, which filters on the server; pass a dict such as "
            "{'source': 'a.md'} / {'year': [2020, 2021]} or a Milvus expression string such as "
            "'metadata[\"year\"] >= 2015 and metadata[\"lang\"] == \"en\"'. (LlamaIndex "
            "MetadataFilters: use llama_index_funnel.milvus.to_milvus_filter.)")
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a dict of metadata values or a Milvus expression "
                        f"string, got {type(filter).__name__}.")
    parts = []
    for key, wanted in filter.items():
        if not isinstance(key, str):
            raise TypeError(f"filter keys must be str, got {key!r}.")
        path = _json_path(field, key)
        values = list(wanted) if isinstance(wanted, (list, tuple, set, frozenset)) else [wanted]
        if not values:
            return "false"
        lits = [_literal(v, key) for v in values]
        if len(lits) == 1:
            parts.append(f"({path} == {lits[0]} or json_contains({path}, {lits[0]}))")
        else:
            eqs = " or ".join(f"{path} == {lit}" for lit in lits)
            parts.append(f"({eqs} or json_contains_any({path}, [{', '.join(lits)}]))")
    return " and ".join(parts) if parts else None


#: Comparison operators of :func:`comparison_expression` (the frameworks' filter objects map
#: onto these: LlamaIndex ``FilterOperator``, LangChain ``structured_query.Comparator``).
COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "any", "all", "like")
_CMP_OPS = {"eq": "==", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def comparison_expression(key: str, op: str, value: Any, field: str = "metadata") -> str | None:
    """One metadata comparison as a Milvus boolean expression, with the semantics of a Python
    predicate on the metadata dict: a unit whose metadata lacks ``key`` fails ``eq``/``gt``/...
    and passes ``ne``/``nin`` (Milvus alone would make both false), values of another type fail.

    ``op`` is one of :data:`COMPARISONS`: ``in``/``nin`` take a list of values; ``contains``
    (a list-valued field holds ``value``), ``any``/``all`` (holds any / all of a list);
    ``like`` (a string field contains ``value`` as a substring). Returns ``None`` for a
    comparison every unit passes (``nin []``) and ``"false"`` for one none passes (``in []``).
    """
    if not isinstance(key, str) or not key:
        raise TypeError(f"a metadata filter key must be a non-empty str, got {key!r}.")
    path = _json_path(field, key)
    guarded = f"exists {path} and "
    if op in _CMP_OPS:
        return f"({guarded}{path} {_CMP_OPS[op]} {_literal(value, key)})"
    if op == "ne":
        return f"not ({guarded}{path} == {_literal(value, key)})"
    if op in ("in", "nin", "any", "all"):
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise TypeError(f"the {op!r} filter on {key!r} takes a list of values, got "
                            f"{type(value).__name__} {value!r:.60}.")
        lits = [_literal(v, key) for v in value]
        if not lits:
            return {"in": "false", "any": "false", "nin": None, "all": None}[op]
        if op == "any":
            return f"({guarded}json_contains_any({path}, [{', '.join(lits)}]))"
        if op == "all":
            return f"({guarded}json_contains_all({path}, [{', '.join(lits)}]))"
        eqs = " or ".join(f"{path} == {lit}" for lit in lits)
        return f"({guarded}({eqs}))" if op == "in" else f"not ({guarded}({eqs}))"
    if op == "contains":
        return f"({guarded}json_contains({path}, {_literal(value, key)}))"
    if op == "like":
        text = str(value)
        if any(c in text for c in "%_\\"):
            raise UnsupportedFilterError(
                f"the substring filter {text!r} on {key!r} holds '%', '_' or a backslash, which "
                "Milvus LIKE patterns cannot escape; write the expression yourself (a Milvus "
                "expression string) or filter on another field.")
        return f"({guarded}{path} like {json.dumps('%' + text + '%', ensure_ascii=False)})"
    raise UnsupportedFilterError(
        f"the filter operator {op!r} (key {key!r}) has no Milvus expression; use one of "
        f"{COMPARISONS}, or pass a Milvus expression string such as 'metadata[\"year\"] >= 2015'.")


def combine_expressions(parts: Sequence[str | None], condition: str = "and") -> str | None:
    """Join expressions with ``and`` / ``or`` / ``not`` (= not any); a ``None`` part is one that
    every unit passes, ``"false"`` one that none passes."""
    if condition not in ("and", "or", "not"):
        raise ValueError(f"condition must be 'and', 'or' or 'not', got {condition!r}.")
    if condition == "and":
        live: list[str] = [p for p in parts if p is not None]
        if "false" in live:
            return "false"
        return " and ".join(f"({p})" for p in live) if live else None
    if any(p is None for p in parts):  # one part always true
        return None if condition == "or" else "false"
    live = [p for p in parts if p is not None and p != "false"]
    if not live:
        return "false" if condition == "or" else None
    joined = " or ".join(f"({p})" for p in live)
    return joined if condition == "or" else f"not ({joined})"


def _in_expr(field: str, values: Iterable[str]) -> str:
    return f"{field} in [{', '.join(json.dumps(v, ensure_ascii=False) for v in values)}]"


def _and(*exprs: str | None) -> str:
    return " and ".join(f"({e})" for e in exprs if e)


# -- shared collection mechanics ----------------------------------------------------------------
def _check_varchar(value: str, what: str, unit_id: str, fix: str) -> None:
    n = len(value.encode("utf-8"))
    if n > MAX_VARCHAR:
        raise ValueError(f"the {what} of {unit_id!r} is {n} bytes; a Milvus VARCHAR holds at "
                         f"most {MAX_VARCHAR}: {fix}")


def _check_id(unit_id: str) -> None:
    if len(unit_id.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(f"unit id {unit_id[:60]!r}... is longer than {MAX_ID_BYTES} bytes; "
                         "Milvus primary keys are bounded: use shorter ids.")


def _batches(rows: Iterable[dict], size_of: Callable[[dict], int],
             max_rows: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    nbytes = 0
    for row in rows:
        batch.append(row)
        nbytes += size_of(row)
        if nbytes >= _BATCH_BYTES or len(batch) >= max_rows:
            yield batch
            batch, nbytes = [], 0
    if batch:
        yield batch


def _row_bytes(row: dict) -> int:
    return sum(len(v) if isinstance(v, str) else 64 for v in row.values()) + 256


def _unit_from_row(row: Mapping[str, Any]) -> Unit:
    info = row.get("info") or {}
    return Unit(id=row["id"], text=row["text"], metadata=dict(row.get("metadata") or {}),
                parent_id=info.get("parent_id"), level=info.get("level", "passage"))


class _Collection:
    """A funnel-rag collection behind an alias: connect, open (check settings), build+swap."""

    kind = ""  # format name, e.g. "funnel-rag.milvus-bm25"

    def __init__(self, uri: str | os.PathLike, collection: str, token: str | None,
                 db_name: str | None, timeout: float | None, show_progress: bool) -> None:
        if not isinstance(collection, str) or not re.match(r"[A-Za-z_][A-Za-z0-9_]*\Z", collection):
            raise ValueError(f"collection name {collection!r} is not valid for Milvus; use letters, "
                             "digits and underscores, starting with a letter or underscore.")
        self.uri = _normalise_uri(uri)
        self.collection = collection
        self.token = token
        self.db_name = db_name
        self.timeout = timeout
        self.show_progress = show_progress
        self._meta: dict[str, Any] | None = None
        self._lock = threading.Lock()

    # connection ----------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        return _client(self.uri, self.token, self.db_name, self.timeout)

    def _where(self) -> str:
        db = f" (database {self.db_name!r})" if self.db_name else ""
        return f"{self.collection!r} at {self.uri!r}{db}"

    # meta ------------------------------------------------------------------------------------
    def _read_meta(self, name: str) -> dict[str, Any]:
        client = self.client
        if not client.has_collection(name):
            raise MilvusCollectionError(
                f"no collection {name!r} at {self.uri!r}; build it first with .index(...) "
                "(or check the collection name, uri and db_name).")
        desc = client.describe_collection(name)
        raw = (desc.get("properties") or {}).get(META_KEY)
        if raw is None:
            raise MilvusCollectionError(
                f"collection {name!r} at {self.uri!r} was not built by funnel-rag (no "
                f"{META_KEY!r} property); pass another collection name, or drop it first.")
        try:
            meta = json.loads(raw)
        except ValueError as exc:
            raise MilvusCollectionError(f"collection {name!r} has a corrupt {META_KEY!r} property; "
                                        "rebuild it with .index(...).") from exc
        return meta

    def _check_meta(self, meta: Mapping[str, Any]) -> None:
        if meta.get("format") != self.kind:
            raise MilvusSettingsError(
                f"collection {self._where()} holds a {meta.get('format')!r} index, not a "
                f"{self.kind!r}; open it with the matching class or pick another collection name.")
        if meta.get("version") != FORMAT_VERSION:
            raise MilvusSettingsError(
                f"collection {self._where()} has funnel-rag format version "
                f"{meta.get('version')!r}, this funnel-rag reads version {FORMAT_VERSION}; rebuild "
                "it with .index(...) (or use the funnel-rag version that built it).")

    def _check_settings(self, meta: Mapping[str, Any]) -> None:
        """Subclasses compare their settings with the stored ones (or adopt them)."""

    def _opened(self) -> dict[str, Any]:
        meta = self._meta
        if meta is None:
            with self._lock:
                meta = self._meta
                if meta is None:
                    meta = self._read_meta(self.collection)
                    self._check_meta(meta)
                    self._check_settings(meta)
                    self.client.load_collection(self.collection)
                    for extra in meta.get("companions", []):
                        self.client.load_collection(extra)
                    self._meta = meta
        return meta

    def refresh(self) -> None:
        """Forget the cached collection settings; the next search re-reads them (call it after
        another process rebuilt the collection; the clustered index does it by itself)."""
        with self._lock:
            self._meta = None

    def open(self) -> Self:
        """Connect and check the existing collection now (instead of at the first search)."""
        self._opened()
        return self

    def exists(self) -> bool:
        """Whether the collection (alias) exists at the URI."""
        return bool(self.client.has_collection(self.collection))

    def __len__(self) -> int:
        return int(self._opened().get("n_units", 0))

    # build -----------------------------------------------------------------------------------
    def _physical_name(self) -> str:
        return f"{self.collection}__fr{uuid.uuid4().hex[:12]}"

    def _create(self, name: str, schema: Any, index_params: Any, meta: Mapping[str, Any]) -> None:
        self.client.create_collection(
            name, schema=schema, index_params=index_params,
            properties={META_KEY: json.dumps(meta, sort_keys=True)},
            consistency_level="Strong")

    def _insert(self, name: str, rows: Iterable[dict], total: int, desc: str,
                max_rows: int = 2000) -> None:
        from tqdm.auto import tqdm

        client = self.client
        with tqdm(total=total, desc=desc, unit="row", disable=not self.show_progress) as bar:
            for batch in _batches(rows, _row_bytes, max_rows):
                client.insert(name, batch)
                bar.update(len(batch))
        client.flush(name)

    def _alias_target(self) -> str | None:
        """The physical collection behind the alias, or ``None`` (no alias of that name)."""
        client = self.client
        if not client.has_collection(self.collection):
            return None
        real = client.describe_collection(self.collection).get("collection_name")
        return real if real and real != self.collection else None

    def _swap(self, build: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
        """Run ``build(physical_name) -> meta`` into fresh collections, then point the alias."""
        client = self.client
        physical = self._physical_name()
        created: list[str] = []
        try:
            meta = build(physical)
            created = [physical, *meta.get("companions", [])]
        except BaseException:
            for name in [physical, f"{physical}_docs"]:
                try:
                    if client.has_collection(name):
                        client.drop_collection(name)
                except Exception:  # pragma: no cover - best effort cleanup
                    pass
            raise
        old: list[str] = []
        current = self._alias_target()
        if current is None and client.has_collection(self.collection):
            for name in created:
                client.drop_collection(name)
            raise MilvusCollectionError(
                f"a collection named {self.collection!r} already exists at {self.uri!r} and is not "
                "a funnel-rag alias; drop it (client.drop_collection) or pick another name.")
        if current is None:
            client.create_alias(physical, self.collection)
        else:
            try:
                old_meta = self._read_meta(current)
                old = [current, *old_meta.get("companions", [])]
            except MilvusError:
                old = [current]
            client.alter_alias(physical, self.collection)
        for name in old:
            try:
                client.drop_collection(name)
            except Exception:  # pragma: no cover - another reader may still hold it
                pass
        for name in created:
            client.load_collection(name)
        with self._lock:
            self._meta = meta
        return meta

    def drop(self) -> None:
        """Drop the alias and the collections behind it (the data is gone)."""
        client = self.client
        current = self._alias_target()
        if current is None:
            return
        try:
            names = [current, *self._read_meta(current).get("companions", [])]
        except MilvusError:
            names = [current]
        client.drop_alias(self.collection)
        for name in names:
            if client.has_collection(name):
                client.drop_collection(name)
        with self._lock:
            self._meta = None

    # manifest --------------------------------------------------------------------------------
    def _manifest(self) -> dict[str, Any]:
        meta = self._opened()
        return {"backend": "milvus", "format": self.kind, "version": FORMAT_VERSION,
                "uri": self.uri, "db_name": self.db_name, "collection": self.collection,
                "settings": meta.get("settings", {}), "n_units": meta.get("n_units")}

    def _require_built(self) -> dict[str, Any]:
        """The collection's stored settings (opens it; raises if it does not exist)."""
        return self._opened()

    def _write(self, folder: Path, st: Any = None) -> dict[str, Any]:
        """Persisting an index over Milvus writes no files: its manifest entry (uri, db_name,
        collection name, settings; never the token, never the data) is returned to be stored in
        the snapshot manifest of whoever persists it (see :func:`open_index`)."""
        return self._manifest()

    def save(self, path: str | os.PathLike) -> None:
        """Commit a small manifest (uri, db_name, collection name, settings) to the persist
        folder ``path`` through :func:`funnel_core.persist.save_snapshot`; the data stays in
        Milvus. The token is never written: pass it to :meth:`load`."""
        from funnel_core.persist import save_snapshot

        manifest = self._manifest()
        save_snapshot(path, self.kind, FORMAT_VERSION, lambda folder: manifest)

    @classmethod
    def _saved_manifest(cls, path: str | os.PathLike) -> dict[str, Any]:
        from funnel_core.persist import load_snapshot

        return load_snapshot(path, cls.kind, FORMAT_VERSION, f"{cls.__name__} manifest",
                             lambda folder, m: dict(m["meta"]))

    @classmethod
    def _from_manifest(cls, m: Mapping[str, Any], token: str | None = None,
                       **kwargs: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def load(cls, path: str | os.PathLike, token: str | None = None, **kwargs: Any) -> Any:
        """Re-open the collection named in the manifest saved at ``path`` (no re-indexing);
        ``kwargs`` go to the constructor (e.g. ``timeout``; a dense index takes ``embedder``)."""
        return cls._from_manifest(cls._saved_manifest(path), token=token, **kwargs)


# -- flat BM25 -------------------------------------------------------------------------------------
def _bm25_tokenizer(config: Mapping[str, Any]) -> Any:
    from funnel_core.bm25 import BM25Index

    cfg = dict(config)
    if cfg.get("method", "lucene") != "lucene":
        raise ValueError(f"Milvus implements the 'lucene' BM25 variant only, got method="
                         f"{cfg['method']!r}; use method='lucene' (default) or the bm25s backend.")
    return BM25Index(**cfg)


def _stored_config(tokenizer: Any) -> dict[str, Any]:
    return {k: v for k, v in tokenizer.config.items() if k not in ("backend",)}


def _index_params(params: dict[str, Any]) -> dict[str, Any]:
    """Index build parameters in both wire shapes: pymilvus 3 sends them as top-level keys (what
    a Milvus server reads), Milvus Lite 3.2 reads only a JSON ``params`` key (measured: without it
    ``bm25_k1`` was silently left at 1.5)."""
    return {**params, "params": dict(params)} if params else {}


def _bm25_schema(client: Any, config: Mapping[str, Any], extra_fields: Callable[[Any], None] | None,
                 with_text: bool = True) -> tuple[Any, Any]:
    from pymilvus import DataType, Function, FunctionType

    schema = client.create_schema(auto_id=False, enable_dynamic_field=False,
                                  description="funnel-rag BM25 (pre-tokenized text)")
    schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES, is_primary=True)
    if with_text:
        schema.add_field("text", DataType.VARCHAR, max_length=MAX_VARCHAR)
    schema.add_field("tokens", DataType.VARCHAR, max_length=MAX_VARCHAR, enable_analyzer=True,
                     analyzer_params={"tokenizer": "standard"})
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    schema.add_field("metadata", DataType.JSON)
    schema.add_field("info", DataType.JSON)
    if extra_fields is not None:
        extra_fields(schema)
    schema.add_function(Function(name="bm25", function_type=FunctionType.BM25,
                                 input_field_names=["tokens"], output_field_names=["sparse"]))
    index_params = client.prepare_index_params()
    index_params.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25",
                           params=_index_params({"inverted_index_algo": "TAAT_NAIVE",
                                                 "bm25_k1": config["k1"], "bm25_b": config["b"]}))
    return schema, index_params


class _BM25Common(_Collection):
    def __init__(self, uri, collection, token, db_name, timeout, show_progress,
                 bm25_config: Mapping[str, Any]) -> None:
        super().__init__(uri, collection, token, db_name, timeout, show_progress)
        self._explicit = dict(bm25_config)
        self._tokenizer = _bm25_tokenizer(bm25_config)

    @property
    def config(self) -> dict[str, Any]:
        """The tokenizer/BM25 settings (the collection's, once it is opened)."""
        return dict(self._tokenizer.config)

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """Tokenize exactly as the index does (our tokenizer, before Milvus escaping)."""
        return self._tokenizer.tokenize(texts)

    def _check_settings(self, meta: Mapping[str, Any]) -> None:
        stored = dict(meta.get("settings", {}).get("bm25", {}))
        if not self._explicit:  # adopt the collection's settings
            self._tokenizer = _bm25_tokenizer(stored)
            return
        mine = _stored_config(self._tokenizer)
        for key in sorted(set(mine) & set(stored)):
            if mine[key] != stored[key]:
                raise MilvusSettingsError(
                    f"collection {self._where()} was built with {key}={stored[key]!r}, this index "
                    f"asks for {key}={mine[key]!r}; pass {key}={stored[key]!r} (or no settings at "
                    "all to adopt the collection's), or rebuild the collection with .index(...).")

    def _query_tokens(self, queries: Sequence[str]) -> list[str]:
        return [milvus_tokens(t) for t in self.tokenize(list(queries))]

    def _bm25_search(self, name: str, queries: Sequence[str], k: int, expr: str | None,
                     output_fields: list[str]) -> list[list[tuple[float, dict]]]:
        """BM25 hits per query as (score, entity); queries without tokens get []."""
        if k > MAX_TOPK:
            raise ValueError(f"k={k} is more than Milvus returns in one search ({MAX_TOPK}); "
                             "ask for fewer results.")
        toks = self._query_tokens(queries)
        live = [i for i, t in enumerate(toks) if t]
        out: list[list[tuple[float, dict]]] = [[] for _ in queries]
        if not live or expr == "false":
            return out
        kwargs: dict[str, Any] = {}
        if expr:
            kwargs["filter"] = expr
        res = self.client.search(name, data=[toks[i] for i in live], anns_field="sparse", limit=k,
                                 output_fields=output_fields,
                                 search_params={"metric_type": "BM25"}, **kwargs)
        # Milvus returns distance = -score (smaller is better), and its score carries the
        # (k1 + 1) factor of the textbook BM25 that bm25s's "lucene" variant leaves out: a
        # constant factor, divided out so that scores equal the bm25s backend's.
        scale = 1.0 / (self.config["k1"] + 1.0)
        for row, qi in enumerate(live):
            hits = [(-float(h["distance"]) * scale, h["entity"]) for h in res[row]]
            hits.sort(key=lambda x: -x[0])
            out[qi] = [(s, e) for s, e in hits if s > 0.0]
        return out


class MilvusBM25Index(_BM25Common):
    """Flat BM25 over units in a Milvus collection; same results as :class:`BM25Index`.

    Args:
        uri: ``"path/to/funnel.db"`` (Milvus Lite, embedded) or ``"http://host:19530"``.
        collection: The collection (alias) name.
        token: Milvus token (``"user:password"`` or an API key) for a server.
        db_name: Milvus database name (server only).
        timeout: Seconds for each Milvus call (``None``: pymilvus default).
        show_progress: tqdm bar while inserting.
        **bm25_config: Tokenizer/BM25 settings as for :class:`~funnel_core.bm25.BM25Index`
            (``k1``, ``b``, ``stemmer``, ``stopwords``, ``token_pattern``, ``lower``; only
            ``method="lucene"``). Leave them out to adopt an existing collection's settings;
            given, they must equal the collection's (else :class:`MilvusSettingsError`).

    A collection that already exists is re-opened (no re-indexing) at the first search or at
    :meth:`open`; :meth:`index` builds a new one and swaps it in atomically.
    """

    kind = "funnel-rag.milvus-bm25"

    def __init__(self, uri: str | os.PathLike = "funnel.db", collection: str = "funnel_bm25", *,
                 token: str | None = None, db_name: str | None = None, timeout: float | None = None,
                 show_progress: bool = False, **bm25_config: Any) -> None:
        super().__init__(uri, collection, token, db_name, timeout, show_progress, bm25_config)

    def index(self, units: Iterable[Unit]) -> "MilvusBM25Index":
        """Build the collection over ``units`` (replaces any previous content atomically)."""
        units = list(units)
        if not units:
            raise ValueError("cannot build a BM25 index over an empty corpus; pass at least one unit/document.")
        for u in units:
            if not isinstance(u, Unit):
                raise TypeError(f"MilvusBM25Index.index expects Unit objects, got {type(u).__name__}.")
        check_unique_ids(units)
        config = _stored_config(self._tokenizer)

        def build(physical: str) -> dict[str, Any]:
            rows = _doc_rows(self, units)
            meta = {"format": self.kind, "version": FORMAT_VERSION, "n_units": len(units),
                    "settings": {"bm25": config}}
            schema, params = _bm25_schema(self.client, config, None)
            self._create(physical, schema, params, meta)
            self._insert(physical, rows, len(units), f"milvus insert {self.collection}")
            return meta

        self._swap(build)
        self._explicit = dict(config)
        return self

    @classmethod
    def from_texts(cls, texts: Sequence[str], ids: Sequence[str] | None = None,
                   metadatas: Sequence[dict] | None = None, level: str = "passage",
                   **kwargs: Any) -> "MilvusBM25Index":
        """Build from plain strings; ``kwargs`` go to the constructor (uri, collection, ...)."""
        return cls(**kwargs).index(units_from_texts(texts, ids, metadatas, level))

    def search(self, query: str, k: int = 10, filter: Any = None, name: str = "bm25") -> list[Unit]:
        """Top-``k`` units for one query; see :meth:`search_many`."""
        return self.search_many([query], k=k, filter=filter, name=name)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, filter: Any = None,
                    n_threads: int = 0, name: str = "bm25") -> list[list[Unit]]:
        """Top-``k`` units per query, best first: copies with ``score``,
        ``metadata["scores"][name]`` and ``metadata["bm25_rank"]``; filtered-out and
        zero-score units are left out (never padded). ``n_threads`` is accepted for interface
        parity (Milvus parallelises on the server)."""
        check_positive_int(k, "k")
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        queries = [check_query(q) for q in queries]
        expr = filter_expression(filter)
        self._opened()
        hits = self._bm25_search(self.collection, queries, k, expr,
                                 ["id", "text", "metadata", "info"])
        results = []
        for row in hits:
            out: list[Unit] = []
            for score, entity in row:
                unit = _unit_from_row(entity).rescored(score, name)
                unit.metadata["bm25_rank"] = len(out)
                out.append(unit)
            results.append(out)
        return results

    @classmethod
    def _from_manifest(cls, m: Mapping[str, Any], token: str | None = None,
                       **kwargs: Any) -> "MilvusBM25Index":
        uri, collection, db_name, settings = _manifest_fields(m, cls.kind)
        bm25 = {**dict(settings.get("bm25") or {}), **kwargs}
        return cls(uri, collection, token=token, db_name=db_name, **bm25).open()


def _doc_rows(owner: _BM25Common, units: Sequence[Unit],
              extra: Callable[[Unit], dict] | None = None) -> Iterator[dict]:
    """Rows for a BM25 collection of units, tokenized in chunks (lazily, for big corpora)."""
    step = 2000
    for start in range(0, len(units), step):
        chunk = units[start:start + step]
        toks = owner.tokenize([u.text for u in chunk])
        for u, t in zip(chunk, toks):
            _check_id(u.id)
            tokens = milvus_tokens(t)
            fix = ("split long texts first (e.g. funnel_core.text.word_windows / LaterChunking) "
                   "or lower max_tokens for clusters.")
            _check_varchar(u.text, "text", u.id, fix)
            _check_varchar(tokens, "tokenized text", u.id, fix)
            row = {"id": u.id, "text": u.text, "tokens": tokens, "metadata": u.metadata,
                   "info": {"parent_id": u.parent_id, "level": u.level}}
            if extra is not None:
                row.update(extra(u))
            yield row


# -- clustered BM25 ----------------------------------------------------------------------------------
class MilvusClusteredBM25Index(_BM25Common):
    """FunnelRAG's clustered first stage on Milvus; same results as
    :class:`~funnel_core.clustered.ClusteredBM25Index`.

    Clusters are built by the existing funnel-rag code (Algorithm 1, :func:`build_clusters`) and
    uploaded: the clusters' tokenized texts go into a BM25 collection (``<collection>``), the
    member documents into a second collection keyed by id with their ``cluster_id``, position and
    metadata. A search is: BM25 top-``k`` clusters in Milvus -> their member documents fetched
    from Milvus -> documents in cluster order, then by their own BM25 score (as the in-memory
    backend), each with ``cluster_id``, ``cluster_score``, ``cluster_rank``, ``document_score``
    and the cluster's score.

    ``uri``, ``collection``, ``token``, ``db_name``, ``timeout`` and ``show_progress`` are as
    for :class:`MilvusBM25Index`; ``max_tokens``, ``adjacency``, ``knn_k`` and ``knn_threshold``
    are the clustering settings of :class:`~funnel_core.clustered.ClusteredBM25Index`;
    ``**bm25_config`` the tokenizer/BM25 settings (``method="lucene"`` only).
    """

    kind = "funnel-rag.milvus-clustered-bm25"

    def __init__(self, uri: str | os.PathLike = "funnel.db", collection: str = "funnel_clusters", *,
                 token: str | None = None, db_name: str | None = None, timeout: float | None = None,
                 show_progress: bool = False, max_tokens: int = 4096, adjacency: str = "auto",
                 knn_k: int = 20, knn_threshold: float = 0.1, **bm25_config: Any) -> None:
        super().__init__(uri, collection, token, db_name, timeout, show_progress, bm25_config)
        self.max_tokens = check_positive_int(max_tokens, "max_tokens")
        self.adjacency = adjacency
        self.knn_k = check_positive_int(knn_k, "knn_k")
        self.knn_threshold = float(knn_threshold)

    # building ------------------------------------------------------------------------------
    def index(self, documents: Sequence[Unit], adjacency: Any = None) -> "MilvusClusteredBM25Index":
        """Cluster ``documents`` with funnel-rag's Algorithm 1 and upload clusters and documents."""
        from funnel_core.cluster import build_clusters
        from funnel_core.clustered import _as_documents
        from funnel_core.persist import prepare_units

        documents = _as_documents(prepare_units(list(documents), "MilvusClusteredBM25Index.index"))
        bm25_config = {k: v for k, v in self._tokenizer.config.items()}
        clusters, _ = build_clusters(
            documents, adjacency=self.adjacency if adjacency is None else adjacency,
            max_tokens=self.max_tokens, knn_k=self.knn_k, knn_threshold=self.knn_threshold,
            bm25_config=bm25_config)
        return self.upload(documents, clusters)

    def upload(self, documents: Sequence[Unit], clusters: Sequence[Unit]) -> "MilvusClusteredBM25Index":
        """Upload already built clusters (units with ``metadata["members"]``) and their documents."""
        documents, clusters = list(documents), list(clusters)
        if not documents or not clusters:
            raise ValueError("cannot build a clustered index without documents and clusters.")
        check_unique_ids(documents)
        check_unique_ids(clusters)
        by_id = {d.id: d for d in documents}
        cluster_of: dict[str, tuple[str, int]] = {}
        for c in clusters:
            members = c.metadata.get("members")
            if not members:
                raise ValueError(f"cluster {c.id!r} has no metadata['members']; build clusters "
                                 "with funnel_core.cluster.build_clusters.")
            for pos, m in enumerate(members):
                if m not in by_id:
                    raise ValueError(f"cluster {c.id!r} lists member {m!r}, which is not among "
                                     "the documents.")
                cluster_of[m] = (c.id, pos)
        missing = [d.id for d in documents if d.id not in cluster_of]
        if missing:
            raise ValueError(f"document {missing[0]!r} is in no cluster; pass the clusters built "
                             "from these documents.")
        config = _stored_config(self._tokenizer)
        settings = {"bm25": config, "max_tokens": self.max_tokens,
                    "adjacency": self.adjacency if isinstance(self.adjacency, str) else "matrix",
                    "knn_k": self.knn_k, "knn_threshold": self.knn_threshold}

        def extra_fields(schema: Any) -> None:
            from pymilvus import DataType

            schema.add_field("cluster_id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
            schema.add_field("position", DataType.INT64)

        def build(physical: str) -> dict[str, Any]:
            docs_name = f"{physical}_docs"
            meta = {"format": self.kind, "version": FORMAT_VERSION, "n_units": len(documents),
                    "n_clusters": len(clusters), "documents": docs_name,
                    "companions": [docs_name], "settings": settings}
            doc_meta = {"format": self.kind + ".documents", "version": FORMAT_VERSION,
                        "n_units": len(documents), "settings": {"bm25": config}}
            schema, params = _bm25_schema(self.client, config, extra_fields)
            self._create(docs_name, schema, params, doc_meta)
            self._insert(docs_name, _doc_rows(self, documents, lambda u: {
                "cluster_id": cluster_of[u.id][0], "position": cluster_of[u.id][1]}),
                len(documents), f"milvus insert {self.collection} documents")
            schema, params = _bm25_schema(self.client, config, None)
            self._create(physical, schema, params, meta)
            self._insert(physical, _doc_rows(self, clusters), len(clusters),
                         f"milvus insert {self.collection} clusters")
            return meta

        self._swap(build)
        self._explicit = dict(config)
        return self

    @classmethod
    def from_index(cls, index: Any, uri: str | os.PathLike = "funnel.db",
                   collection: str = "funnel_clusters", **kwargs: Any) -> "MilvusClusteredBM25Index":
        """Upload a built in-memory :class:`ClusteredBM25Index` (same clusters, same settings)."""
        cfg = {k: v for k, v in index.bm25_config.items() if k != "backend"}
        obj = cls(uri, collection, max_tokens=index.max_tokens,
                  adjacency=index.adjacency if isinstance(index.adjacency, str) else "auto",
                  knn_k=index.knn_k, knn_threshold=index.knn_threshold, **cfg, **kwargs)
        return obj.upload(index.documents, index.clusters)

    @property
    def n_clusters(self) -> int:
        return int(self._opened().get("n_clusters", 0))

    def _check_settings(self, meta: Mapping[str, Any]) -> None:
        super()._check_settings(meta)
        s = meta.get("settings", {})
        self.max_tokens, self.knn_k = s.get("max_tokens", self.max_tokens), s.get("knn_k", self.knn_k)
        self.knn_threshold = s.get("knn_threshold", self.knn_threshold)

    # searching -------------------------------------------------------------------------------
    def _query_all(self, name: str, expr: str, fields: list[str]) -> list[dict]:
        """All rows of ``name`` matching ``expr`` (paged past Milvus's 16384-row window)."""
        rows = list(self.client.query(name, filter=expr, output_fields=fields, limit=MAX_TOPK))
        if len(rows) < MAX_TOPK:
            return rows
        out: list[dict] = []
        it = self.client.query_iterator(name, batch_size=MAX_TOPK // 2, filter=expr,
                                        output_fields=fields)
        try:
            while True:
                page = it.next()
                if not page:
                    break
                out.extend(page)
        finally:
            it.close()
        return out

    def search(self, query: str, k: int = 10, filter: Any = None, return_clusters: bool = False,
               max_documents: int | None = None, name: str = "bm25") -> list[Unit]:
        """Top-``k`` clusters for ``query``, opened into documents unless ``return_clusters``.

        ``filter`` applies to documents and is pushed down: only clusters holding at least one
        matching document are ranked (found with a filtered query on the documents collection),
        and only matching documents are returned (never padded).
        """
        try:
            return self._search(query, k, filter, return_clusters, max_documents, name)
        except MilvusError:
            raise
        except Exception:
            # another process may have rebuilt the collection (the alias moved, the documents
            # collection we knew was dropped): re-read the settings once and retry
            old = self._meta
            self.refresh()
            try:
                meta = self._opened()
            except Exception:
                meta = None
            if meta is None or old is None or meta.get("documents") == old.get("documents"):
                raise
            return self._search(query, k, filter, return_clusters, max_documents, name)

    def _search(self, query: str, k: int, filter: Any, return_clusters: bool,
                max_documents: int | None, name: str) -> list[Unit]:
        check_positive_int(k, "k")
        check_positive_int(max_documents, "max_documents", allow_none=True)
        query = check_query(query)
        meta = self._opened()
        docs_name = meta["documents"]
        doc_expr = filter_expression(filter)
        if doc_expr == "false" or not query:
            return []
        cluster_expr = None
        if doc_expr:
            rows = self._query_all(docs_name, doc_expr, ["cluster_id"])
            allowed = sorted({r["cluster_id"] for r in rows})
            if not allowed:
                return []
            cluster_expr = _in_expr("id", allowed)
        fields = ["id", "metadata", "info"] + (["text"] if return_clusters else [])
        hits = self._bm25_search(self.collection, [query], k, cluster_expr, fields)[0]
        clusters: list[Unit] = []
        for score, entity in hits:
            info = entity.get("info") or {}
            c = Unit(id=entity["id"], text=entity.get("text", ""),
                     metadata=dict(entity.get("metadata") or {}), parent_id=info.get("parent_id"),
                     level=info.get("level", "cluster")).rescored(score, name)
            c.metadata["bm25_rank"] = len(clusters)
            c.metadata["cluster_rank"] = len(clusters)
            clusters.append(c)
        if return_clusters or not clusters:
            return clusters
        from funnel_core.clustered import order_within_clusters

        rank = {c.id: r for r, c in enumerate(clusters)}
        member_expr = _and(_in_expr("cluster_id", rank), doc_expr)
        rows = self._query_all(docs_name, member_expr,
                               ["id", "text", "metadata", "info", "cluster_id", "position"])
        rows.sort(key=lambda r: (rank[r["cluster_id"]], r["position"]))
        # each document's own BM25 score (documents collection statistics) orders a cluster
        own = {e["id"]: s for s, e in self._bm25_search(docs_name, [query], min(len(rows), MAX_TOPK),
                                                         member_expr, ["id"])[0]}
        docs = []
        for r in rows:
            cluster = clusters[rank[r["cluster_id"]]]
            doc = _unit_from_row(r)
            doc.parent_id = cluster.id
            doc.score = cluster.score
            doc.metadata.setdefault("scores", {}).update(cluster.scores)
            doc.metadata.update(cluster_id=cluster.id, cluster_score=cluster.score,
                                cluster_rank=rank[cluster.id])
            docs.append(doc)
        docs = order_within_clusters(docs, lambda d: own.get(d.id, 0.0))
        return docs[:max_documents] if max_documents else docs

    def search_many(self, queries: Sequence[str], k: int = 10, filter: Any = None,
                    **kwargs: Any) -> list[list[Unit]]:
        """:meth:`search` for each query."""
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        return [self.search(q, k=k, filter=filter, **kwargs) for q in queries]

    @classmethod
    def _from_manifest(cls, m: Mapping[str, Any], token: str | None = None,
                       **kwargs: Any) -> "MilvusClusteredBM25Index":
        uri, collection, db_name, settings = _manifest_fields(m, cls.kind)
        bm25 = {**dict(settings.get("bm25") or {}), **kwargs}
        return cls(uri, collection, token=token, db_name=db_name, **bm25).open()


# -- dense -----------------------------------------------------------------------------------------
class MilvusDenseIndex(_Collection):
    """Dense retrieval over units in a Milvus collection (HNSW by default); same interface and
    scores as :class:`~funnel_core.embeddings.DenseIndex` (inner product of our embeddings).

    ``uri``, ``collection``, ``token``, ``db_name``, ``timeout`` and ``show_progress`` are as
    for :class:`MilvusBM25Index`.

    Args:
        embedder: A :class:`~funnel_core.embeddings.SentenceEmbedder` (default: the packaged
            all-MiniLM-L6-v2).
        index_type: ``"HNSW"`` (default), ``"IVF_FLAT"`` or ``"FLAT"`` (exact).
        metric: ``"IP"`` (default; cosine on normalised embeddings) or ``"COSINE"``.
        hnsw_m: HNSW graph degree M.
        ef_construction: HNSW build breadth.
        ef: HNSW search breadth (default ``max(64, k)``).
        nlist: IVF_FLAT lists.
        nprobe: IVF_FLAT lists probed per query.
        batch_size: Units embedded and inserted per batch (a tqdm bar shows progress).
    """

    kind = "funnel-rag.milvus-dense"

    def __init__(self, uri: str | os.PathLike = "funnel.db", collection: str = "funnel_dense",
                 embedder: Any = None, *, token: str | None = None, db_name: str | None = None,
                 timeout: float | None = None, show_progress: bool = False,
                 index_type: str = "HNSW", metric: str = "IP", hnsw_m: int = 16,
                 ef_construction: int = 200, ef: int | None = None, nlist: int = 128,
                 nprobe: int = 16, batch_size: int = 256) -> None:
        super().__init__(uri, collection, token, db_name, timeout, show_progress)
        if index_type not in ("HNSW", "IVF_FLAT", "FLAT"):
            raise ValueError(f"index_type must be 'HNSW', 'IVF_FLAT' or 'FLAT', got {index_type!r}.")
        if metric not in ("IP", "COSINE"):
            raise ValueError(f"metric must be 'IP' or 'COSINE', got {metric!r}.")
        if embedder is None:
            from funnel_core.embeddings import SentenceEmbedder

            embedder = SentenceEmbedder()
        self.embedder = embedder
        self.index_type, self.metric = index_type, metric
        self.hnsw_m = check_positive_int(hnsw_m, "hnsw_m")
        self.ef_construction = check_positive_int(ef_construction, "ef_construction")
        self.ef = check_positive_int(ef, "ef", allow_none=True)
        self.nlist, self.nprobe = check_positive_int(nlist, "nlist"), check_positive_int(nprobe, "nprobe")
        self.batch_size = check_positive_int(batch_size, "batch_size")

    def _settings(self, dim: int) -> dict[str, Any]:
        return {"dimension": int(dim), "metric": self.metric, "index_type": self.index_type,
                "model": str(getattr(self.embedder, "model_name_or_path", "")),
                "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction, "nlist": self.nlist}

    def _check_settings(self, meta: Mapping[str, Any]) -> None:
        s = meta.get("settings", {})
        self.metric = s.get("metric", self.metric)
        self.index_type = s.get("index_type", self.index_type)

    def _check_dimension(self, got: int) -> None:
        want = self._opened()["settings"]["dimension"]
        if got != want:
            raise MilvusSettingsError(
                f"collection {self._where()} holds {want}-d vectors, the query embeddings are "
                f"{got}-d; use the embedder it was built with "
                f"({self._opened()['settings'].get('model')!r}) or rebuild with .index(...).")

    def index(self, units: Sequence[Unit], embeddings: np.ndarray | None = None,
              show_progress: bool | None = None) -> "MilvusDenseIndex":
        """Embed ``units`` in batches (or take ``embeddings``) and upload them; atomic swap."""
        from pymilvus import DataType
        from tqdm.auto import tqdm

        units = list(units)
        if not units:
            raise ValueError("cannot build a dense index over an empty corpus; pass at least one unit.")
        check_unique_ids(units)
        if embeddings is not None:
            embeddings = np.asarray(embeddings, dtype=np.float32)
            if embeddings.ndim != 2 or embeddings.shape[0] != len(units):
                raise ValueError(f"got embeddings of shape {embeddings.shape} for {len(units)} units.")
        progress = self.show_progress if show_progress is None else show_progress
        for u in units:
            _check_id(u.id)
            _check_varchar(u.text, "text", u.id, "split long texts first (e.g. word_windows).")

        def build(physical: str) -> dict[str, Any]:
            client = self.client
            dim = int(embeddings.shape[1]) if embeddings is not None else int(self.embedder.dimension)
            meta = {"format": self.kind, "version": FORMAT_VERSION, "n_units": len(units),
                    "settings": self._settings(dim)}
            schema = client.create_schema(auto_id=False, enable_dynamic_field=False,
                                          description="funnel-rag dense")
            schema.add_field("id", DataType.VARCHAR, max_length=MAX_ID_BYTES, is_primary=True)
            schema.add_field("text", DataType.VARCHAR, max_length=MAX_VARCHAR)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("metadata", DataType.JSON)
            schema.add_field("info", DataType.JSON)
            params = client.prepare_index_params()
            ip = ({"M": self.hnsw_m, "efConstruction": self.ef_construction}
                  if self.index_type == "HNSW" else {"nlist": self.nlist}
                  if self.index_type == "IVF_FLAT" else {})
            params.add_index(field_name="vector", index_type=self.index_type, metric_type=self.metric,
                             params=_index_params(ip))
            self._create(physical, schema, params, meta)
            with tqdm(total=len(units), desc=f"milvus embed+insert {self.collection}", unit="unit",
                      disable=not progress) as bar:
                for start in range(0, len(units), self.batch_size):
                    chunk = units[start:start + self.batch_size]
                    emb = (embeddings[start:start + len(chunk)] if embeddings is not None
                           else self.embedder.encode([u.text for u in chunk]))
                    if emb.shape[1] != dim:
                        raise ValueError(f"embedding dimension {emb.shape[1]} != {dim}.")
                    client.insert(physical, [
                        {"id": u.id, "text": u.text, "vector": e.tolist(), "metadata": u.metadata,
                         "info": {"parent_id": u.parent_id, "level": u.level}}
                        for u, e in zip(chunk, np.asarray(emb, dtype=np.float32))])
                    bar.update(len(chunk))
            client.flush(physical)
            return meta

        self._swap(build)
        return self

    def search_many(self, queries: Sequence[str], k: int = 10,
                    query_embeddings: np.ndarray | None = None, filter: Any = None,
                    name: str = "dense") -> list[list[Unit]]:
        """Top-``k`` units per query by similarity; scores in ``metadata["scores"]["dense"]``."""
        check_positive_int(k, "k")
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        if k > MAX_TOPK:
            raise ValueError(f"k={k} is more than Milvus returns in one search ({MAX_TOPK}).")
        queries = [check_query(q) for q in queries]
        expr = filter_expression(filter)
        self._opened()
        out: list[list[Unit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q]
        if not live or expr == "false":
            return out
        if query_embeddings is None:
            q_emb = self.embedder.encode([queries[i] for i in live])
        else:
            q_emb = np.asarray(query_embeddings, dtype=np.float32)[live]
        self._check_dimension(int(q_emb.shape[1]))
        params: dict[str, Any] = {"metric_type": self.metric}
        if self.index_type == "HNSW":
            params["params"] = {"ef": max(self.ef or 64, k)}
        elif self.index_type == "IVF_FLAT":
            params["params"] = {"nprobe": self.nprobe}
        kwargs: dict[str, Any] = {"filter": expr} if expr else {}
        res = self.client.search(self.collection, data=[e.tolist() for e in q_emb],
                                 anns_field="vector", limit=k, search_params=params,
                                 output_fields=["id", "text", "metadata", "info"], **kwargs)
        for row, qi in enumerate(live):
            hits = sorted(((float(h["distance"]), h["entity"]) for h in res[row]),
                          key=lambda x: -x[0])  # IP/COSINE: larger is more similar
            out[qi] = [_unit_from_row(e).rescored(s, name) for s, e in hits]
        return out

    def search(self, query: str, k: int = 10, filter: Any = None) -> list[Unit]:
        return self.search_many([query], k, filter=filter)[0]

    @classmethod
    def load(cls, path: str | os.PathLike, token: str | None = None, *, embedder: Any = None,
             **kwargs: Any) -> "MilvusDenseIndex":
        """Re-open the collection named in the manifest saved at ``path`` (no re-embedding);
        the embedder defaults to the model recorded at build time."""
        return cls._from_manifest(cls._saved_manifest(path), token=token, embedder=embedder, **kwargs)

    @classmethod
    def _from_manifest(cls, m: Mapping[str, Any], token: str | None = None, embedder: Any = None,
                       **kwargs: Any) -> "MilvusDenseIndex":
        uri, collection, db_name, settings = _manifest_fields(m, cls.kind)
        if embedder is None and isinstance(settings.get("model"), str) and settings["model"]:
            from funnel_core.embeddings import SentenceEmbedder

            embedder = SentenceEmbedder(settings["model"])
        return cls(uri, collection, embedder, token=token, db_name=db_name, **kwargs).open()


def _manifest_fields(m: Mapping[str, Any], kind: str) -> tuple[str, str, str | None, dict]:
    """(uri, collection, db_name, settings) of a saved manifest entry, validated (manifests are
    untrusted input)."""
    if not isinstance(m, Mapping) or m.get("backend") != "milvus" or m.get("format") != kind:
        got = m.get("format") if isinstance(m, Mapping) else type(m).__name__
        raise PersistError(f"the saved index is {got!r}, not a {kind!r} manifest; load it with "
                           "the class that saved it (or funnel_core.milvus.load_index).")
    if m.get("version") != FORMAT_VERSION:
        raise PersistError(f"the saved {kind!r} manifest has version {m.get('version')!r}, this "
                           f"funnel-rag reads version {FORMAT_VERSION}; save it again.")
    uri, collection, db_name = m.get("uri"), m.get("collection"), m.get("db_name")
    settings = m.get("settings") or {}
    if (not isinstance(uri, str) or not isinstance(collection, str)
            or not (db_name is None or isinstance(db_name, str)) or not isinstance(settings, dict)):
        raise PersistError(f"the saved {kind!r} manifest is incomplete (uri {uri!r}, collection "
                           f"{collection!r}); save the index again.")
    return uri, collection, db_name, settings


_KINDS: dict[str, Any] = {c.kind: c for c in (MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex)}


def is_milvus_entry(meta: Any) -> bool:
    """Whether a persisted index entry (``index._write`` output) is a Milvus manifest."""
    return isinstance(meta, Mapping) and meta.get("backend") == "milvus"


def open_index(meta: Mapping[str, Any], token: str | None = None, **kwargs: Any) -> Any:
    """Re-open the Milvus index described by a manifest entry that ``index._write`` returned
    (stored inside a retriever's snapshot manifest): no data is read from disk, the collection
    is opened and its settings checked."""
    kind = meta.get("format") if isinstance(meta, Mapping) else None
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None or not is_milvus_entry(meta):
        raise PersistError(f"the saved index entry names {kind!r}, which is no Milvus index of "
                           f"this funnel-rag ({sorted(_KINDS)}); save it again.")
    return cls._from_manifest(meta, token=token, **kwargs)


def load_index(path: str | os.PathLike, default: Any = None, **kwargs: Any) -> Any:
    """Load whatever index was saved at ``path``: a Milvus manifest re-opens its collection
    (``kwargs``: ``token=``, ...), anything else goes to ``default.load(path, **kwargs)`` (e.g.
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
