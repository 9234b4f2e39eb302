"""Shared mechanics of one Milvus collection behind an alias: batched inserts, atomic rebuilds, stored settings."""


from __future__ import annotations

import json
import os
import re
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Self  # typing.Self from Python 3.11


from funnel_core.backends.milvus.client import (
    BATCH_BYTES,
    FORMAT_VERSION,
    MAX_ID_BYTES,
    MAX_VARCHAR,
    META_KEY,
    MilvusCollectionError,
    MilvusError,
    MilvusSettingsError,
    get_client,
    normalise_uri,
    split_credentials,
    uri_fingerprint,
)
from funnel_core.errors import PersistError
from funnel_core.units import Unit


# -- shared collection mechanics ----------------------------------------------------------------
def check_varchar(value: str, what: str, unit_id: str, fix: str) -> None:
    n = len(value.encode("utf-8"))
    if n > MAX_VARCHAR:
        raise ValueError(f"the {what} of {unit_id!r} is {n} bytes; a Milvus VARCHAR holds at "
                         f"most {MAX_VARCHAR}: {fix}")


def check_id(unit_id: str) -> None:
    if len(unit_id.encode("utf-8")) > MAX_ID_BYTES:
        raise ValueError(f"unit id {unit_id[:60]!r}... is longer than {MAX_ID_BYTES} bytes; "
                         "Milvus primary keys are bounded: use shorter ids.")


def batches(rows: Iterable[dict], size_of: Callable[[dict], int],
             max_rows: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    nbytes = 0
    for row in rows:
        batch.append(row)
        nbytes += size_of(row)
        if nbytes >= BATCH_BYTES or len(batch) >= max_rows:
            yield batch
            batch, nbytes = [], 0
    if batch:
        yield batch


def row_bytes(row: dict) -> int:
    return sum(len(v) if isinstance(v, str) else 64 for v in row.values()) + 256


def unit_from_row(row: Mapping[str, Any]) -> Unit:
    info = row.get("info") or {}
    return Unit(id=row["id"], text=row["text"], metadata=dict(row.get("metadata") or {}),
                parent_id=info.get("parent_id"), level=info.get("level", "passage"))


class Collection:
    """A funnel-rag collection behind an alias: connect, open (check settings), build+swap.

    The concrete indexes are also :class:`~funnel_core.settings.Settings` (each lists it last
    among its bases): their settings are validated, ``to_dict``/``from_dict`` round-trip them
    (the token is never written), an edit of the connection (``uri``, ``collection``, ``token``,
    ``db_name``) re-opens the collection at the next call, and an edit of a build-time setting
    is refused while the collection is open (:meth:`built`); a closed index checks its settings
    against the collection when it opens.
    """

    kind = ""  # format name, e.g. "funnel-rag.milvus-bm25"
    #: an edit of these re-opens the collection at the next call (the opened state is dropped)
    load_settings: ClassVar[frozenset[str]] = frozenset({"uri", "collection", "token", "db_name"})
    model_attrs: ClassVar[tuple[str, ...]] = ("_meta",)

    def __init__(self, uri: str | os.PathLike, collection: str, token: str | None,
                 db_name: str | None, timeout: float | None, show_progress: bool) -> None:
        if not isinstance(collection, str) or not re.match(r"[A-Za-z_][A-Za-z0-9_]*\Z", collection):
            raise ValueError(f"collection name {collection!r} is not valid for Milvus; use letters, "
                             "digits and underscores, starting with a letter or underscore.")
        # credentials inside the URI (http://user:pw@host) become the token: the URI we keep,
        # write and show never holds them
        self.uri, from_uri = split_credentials(normalise_uri(uri))
        self.collection = collection
        self.token = token or from_uri
        self.db_name = db_name
        self.timeout = timeout
        self.show_progress = show_progress
        self._meta: dict[str, Any] | None = None
        self._lock = threading.Lock()

    def built(self) -> bool:
        """Whether this object has the collection open (built or opened; :meth:`refresh`
        closes it)."""
        return self.__dict__.get("_meta") is not None

    def to_dict(self) -> dict[str, Any]:
        """The settings (:meth:`funnel_core.settings.Settings.to_dict`) without the token."""
        out: dict[str, Any] = super().to_dict()  # type: ignore[misc]
        out["token"] = None
        return out

    # pickling and copying ------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The settings (URI, collection, token, ...) without the lock and the opened state: a
        pickled or copied index connects again and re-opens the collection at its first search,
        as the in-memory indexes pickle without their locks. The token travels with it, as it
        does in a pickled :class:`~funnel_core.backends.milvus.MilvusBackend`; ``save`` never
        writes it."""
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["_meta"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # connection ----------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        return get_client(self.uri, self.token, self.db_name, self.timeout)

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
                    # pin the physical collection behind the alias: a rebuild moves the alias,
                    # and this reader must keep reading one version (clusters and documents of
                    # the same build) until it re-opens, never the new clusters with old documents
                    physical = self._alias_target() or self.collection
                    meta = dict(self._read_meta(physical))
                    self._check_meta(meta)
                    self._check_settings(meta)
                    self.client.load_collection(physical)
                    for extra in meta.get("companions", []):
                        self.client.load_collection(extra)
                    meta["_physical"] = physical
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
            for batch in batches(rows, row_bytes, max_rows):
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
        self._drop_orphans(set(created))
        with self._lock:
            self._meta = {**meta, "_physical": physical}
        return meta

    def _drop_orphans(self, keep: set[str]) -> None:
        """Drop what builds killed mid-way (or old versions whose drop failed) left behind:
        collections named ``<collection>__fr<12 hex>[_docs]`` whose stored property says
        funnel-rag built them as this kind, other than ``keep`` (the current version). Names
        alone are not trusted: a user's collection without our property is never dropped."""
        client = self.client
        pattern = re.compile(re.escape(self.collection) + r"__fr[0-9a-f]{12}(_docs)?\Z")
        ours = (self.kind, self.kind + ".documents")
        try:
            names = list(client.list_collections())
        except Exception:  # pragma: no cover - best effort
            return
        for name in names:
            if name in keep or not pattern.match(name):
                continue
            try:
                if self._read_meta(name).get("format") in ours:
                    client.drop_collection(name)
            except Exception:  # pragma: no cover - not ours, or dropped meanwhile
                continue

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
        # never the URI (a folder must not decide where the loader's token goes): a fingerprint
        # to check the loader's URI against
        return {"backend": "milvus", "format": self.kind, "version": FORMAT_VERSION,
                "uri_sha256": uri_fingerprint(self.uri), "db_name": self.db_name,
                "collection": self.collection,
                "settings": meta.get("settings", {}), "n_units": meta.get("n_units")}

    def _require_built(self) -> dict[str, Any]:
        """The collection's stored settings (opens it; raises if it does not exist)."""
        return self._opened()

    def _write(self, folder: Path, st: Any = None) -> dict[str, Any]:
        """Persisting an index over Milvus writes no files: its manifest entry (a fingerprint of
        the uri, db_name, collection name, settings; never the uri, the token or the data) is returned to be stored in
        the snapshot manifest of whoever persists it (see :func:`open_index`)."""
        return self._manifest()

    def save(self, path: str | os.PathLike) -> None:
        """Commit a small manifest (collection name, db_name, settings and a SHA-256 fingerprint of
        the uri) to the persist folder ``path`` through :func:`funnel_core.persist.save_snapshot`;
        the data stays in Milvus. Neither the uri nor the token is written: pass both to
        :meth:`load`."""
        from funnel_core.persist import save_snapshot

        manifest = self._manifest()
        save_snapshot(path, self.kind, FORMAT_VERSION, lambda folder: manifest)

    @classmethod
    def _saved_manifest(cls, path: str | os.PathLike) -> dict[str, Any]:
        from funnel_core.persist import load_snapshot

        return load_snapshot(path, cls.kind, FORMAT_VERSION, f"{cls.__name__} manifest",
                             lambda folder, m: dict(m["meta"]))

    @classmethod
    def _from_manifest(cls, m: Mapping[str, Any], uri: Any = None, token: str | None = None,
                       **kwargs: Any) -> Any:
        raise NotImplementedError

    @classmethod
    def load(cls, path: str | os.PathLike, uri: Any = None, token: str | None = None,
             **kwargs: Any) -> Any:
        """Re-open the collection named in the manifest saved at ``path`` (no re-indexing).

        ``uri`` (a Milvus URI or a :class:`MilvusBackend`) and ``token`` come from the caller: the
        folder records only a fingerprint of the URI it was saved from, which ``uri`` must match,
        so a folder from someone else can never send your token to their server. ``kwargs`` go to
        the constructor (e.g. ``timeout``; a dense index takes ``embedder``)."""
        return cls._from_manifest(cls._saved_manifest(path), uri=uri, token=token, **kwargs)


def manifest_fields(m: Mapping[str, Any], kind: str, uri: Any = None, token: str | None = None,
                    db_name: str | None = None) -> tuple[str, str | None, str, str | None, dict]:
    """(uri, token, collection, db_name, settings) to open a saved manifest entry with.

    The URI and token are the caller's (``uri`` may be a :class:`MilvusBackend`, which brings its
    token and db_name): a manifest is untrusted input and never says where to connect. It
    records a fingerprint of the URI it was saved from, and a different ``uri`` is refused."""
    if not isinstance(m, Mapping) or m.get("backend") != "milvus" or m.get("format") != kind:
        got = m.get("format") if isinstance(m, Mapping) else type(m).__name__
        raise PersistError(f"the saved index is {got!r}, not a {kind!r} manifest; load it with "
                           "the class that saved it (or funnel_core.backends.milvus.load_index).")
    if m.get("version") != FORMAT_VERSION:
        raise PersistError(f"the saved {kind!r} manifest has version {m.get('version')!r}, this "
                           f"funnel-rag reads version {FORMAT_VERSION}; save it again.")
    collection, saved_db = m.get("collection"), m.get("db_name")
    fingerprint = m.get("uri_sha256")
    if fingerprint is None and isinstance(m.get("uri"), str):  # written before the fingerprint
        try:
            fingerprint = uri_fingerprint(m["uri"])
        except (TypeError, ValueError):
            fingerprint = None
    settings = m.get("settings") or {}
    if (not isinstance(fingerprint, str) or not isinstance(collection, str)
            or not (saved_db is None or isinstance(saved_db, str)) or not isinstance(settings, dict)):
        raise PersistError(f"the saved {kind!r} manifest is incomplete (collection {collection!r}, "
                           f"uri fingerprint {fingerprint!r}); save the index again.")
    if uri is not None and hasattr(uri, "uri") and not isinstance(uri, (str, os.PathLike)):
        token = token or getattr(uri, "token", None)
        db_name = db_name or getattr(uri, "db_name", None)
        uri = uri.uri
    if uri is None:
        raise PersistError(
            f"this {kind!r} index lives in the Milvus collection {collection!r}; pass the Milvus "
            "URI it was saved from, e.g. load(path, uri='funnel.db') or uri='http://host:19530' "
            "(the saved folder records only a fingerprint of it: a folder never decides where "
            "your credentials are sent).")
    uri, from_uri = split_credentials(normalise_uri(uri))
    if uri_fingerprint(uri) != fingerprint:
        raise PersistError(
            f"this {kind!r} index was saved from another Milvus URI than {uri!r} (the fingerprint "
            "in its manifest differs); pass the URI it was saved from, or open the collection "
            f"{collection!r} at {uri!r} explicitly with MilvusBackend({uri!r}, "
            f"collection={collection!r}) (from_backend).")
    return uri, token or from_uri, collection, db_name or saved_db, settings
