"""Flat BM25 on Milvus: our tokenizer's tokens indexed by Milvus's BM25 function (:class:`MilvusBM25Index`)."""


from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    pass  # typing.Self from Python 3.11


from funnel_core.backends.milvus.client import FORMAT_VERSION, MAX_ID_BYTES, MAX_TOPK, MAX_VARCHAR, MilvusSettingsError
from funnel_core.backends.milvus.collection import Collection, check_id, check_varchar, manifest_fields, unit_from_row
from funnel_core.backends.milvus.expressions import filter_expression, milvus_tokens
from funnel_core.bm25.index import BM25_SETTINGS
from funnel_core.errors import check_positive_int, check_query
from funnel_core.settings import Settings, setting_names
from funnel_core.units import Unit, check_unique_ids, units_from_texts


# -- flat BM25 -------------------------------------------------------------------------------------
def bm25_tokenizer(config: Mapping[str, Any]) -> Any:
    from funnel_core.bm25 import BM25Index

    cfg = dict(config)
    if cfg.get("method", "lucene") != "lucene":
        raise ValueError(f"Milvus implements the 'lucene' BM25 variant only, got method="
                         f"{cfg['method']!r}; use method='lucene' (default) or the bm25s backend.")
    return BM25Index(**cfg)


def stored_config(tokenizer: Any) -> dict[str, Any]:
    return {k: v for k, v in tokenizer.config.items() if k not in ("engine",)}


def milvus_index_params(params: dict[str, Any]) -> dict[str, Any]:
    """Index build parameters in both wire shapes: pymilvus 3 sends them as top-level keys (what
    a Milvus server reads), Milvus Lite 3.2 reads only a JSON ``params`` key (measured: without it
    ``bm25_k1`` was silently left at 1.5)."""
    return {**params, "params": dict(params)} if params else {}


def bm25_schema(client: Any, config: Mapping[str, Any], extra_fields: Callable[[Any], None] | None,
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
                           params=milvus_index_params({"inverted_index_algo": "TAAT_NAIVE",
                                                 "bm25_k1": config["k1"], "bm25_b": config["b"]}))
    return schema, index_params


class BM25Common(Collection):
    """What the flat and the clustered Milvus BM25 index share: the tokenizer/BM25 settings,
    taken through ``**bm25_config`` (:attr:`keyword_settings`). Those given are *explicit*: they
    must equal the collection's; those left out are adopted from the collection when it opens.
    Each is readable as an attribute (``index.k1``: the effective value), editable while the
    collection is not open, and ``to_dict`` lists the explicit ones only (so ``from_dict``
    adopts the rest again)."""

    keyword_settings: ClassVar[tuple[str, ...]] = BM25_SETTINGS
    build_settings: ClassVar[frozenset[str]] = frozenset(BM25_SETTINGS) - {"engine"}

    def __init__(self, uri, collection, token, db_name, timeout, show_progress,
                 bm25_config: Mapping[str, Any]) -> None:
        super().__init__(uri, collection, token, db_name, timeout, show_progress)
        self._explicit = dict(bm25_config)
        self._tokenizer = bm25_tokenizer(bm25_config)

    def __getattr__(self, name: str) -> Any:
        if name in BM25_SETTINGS and "_tokenizer" in self.__dict__:
            return self.__dict__["_tokenizer"].config[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def settings(self) -> dict[str, Any]:
        """The constructor arguments: the explicit BM25 settings only (see the class)."""
        return {n: self._setting(n) for n in setting_names(type(self))
                if n not in BM25_SETTINGS or n in self._explicit}

    def _setting(self, name: str) -> Any:
        return self.config[name] if name in BM25_SETTINGS else getattr(self, name)

    def _take_setting(self, name: str, attr: str, probe: Any) -> None:
        if name in BM25_SETTINGS:  # the probe's tokenizer, with the edit now explicit
            object.__setattr__(self, "_explicit", probe._explicit)
            object.__setattr__(self, "_tokenizer", probe._tokenizer)
        else:
            object.__setattr__(self, attr, getattr(probe, attr))

    @classmethod
    def _from_manifest(cls, m: Mapping[str, Any], uri: Any = None, token: str | None = None,
                       **kwargs: Any) -> Any:
        """Re-open a saved flat or clustered BM25 index: the caller's URI and token, the saved
        BM25 settings under the caller's overrides."""
        uri, token, collection, db_name, settings = manifest_fields(
            m, cls.kind, uri, token, kwargs.pop("db_name", None))
        bm25 = {**dict(settings.get("bm25") or {}), **kwargs}
        return cls(uri, collection, token=token, db_name=db_name, **bm25).open()  # type: ignore[call-arg]

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
            self._tokenizer = bm25_tokenizer(stored)
            return
        mine = stored_config(self._tokenizer)
        for key in sorted(set(mine) & set(stored)):
            if mine[key] != stored[key]:
                raise MilvusSettingsError(
                    f"collection {self._where()} was built with {key}={stored[key]!r}, this index "
                    f"asks for {key}={mine[key]!r}; pass {key}={stored[key]!r} (or no settings at "
                    "all to adopt the collection's), or rebuild the collection with .index(...).")

    def _query_tokens(self, queries: Sequence[str]) -> list[str]:
        return [milvus_tokens(t) for t in self.tokenize(list(queries))]

    def _bm25_search(self, name: str, queries: Sequence[str], k: int, expr: str | None,
                     output_fields: list[str],
                     tokens: list[str] | None = None) -> list[list[tuple[float, dict]]]:
        """BM25 hits per query as (score, entity); queries without tokens get []. ``tokens``:
        the queries already cut by ``_query_tokens`` (one search over two collections)."""
        if k > MAX_TOPK:
            raise ValueError(f"k={k} is more than Milvus returns in one search ({MAX_TOPK}); "
                             "ask for fewer results.")
        toks = self._query_tokens(queries) if tokens is None else tokens
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


class MilvusBM25Index(BM25Common, Settings):
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
        config = stored_config(self._tokenizer)

        def build(physical: str) -> dict[str, Any]:
            rows = doc_rows(self, units)
            meta = {"format": self.kind, "version": FORMAT_VERSION, "n_units": len(units),
                    "settings": {"bm25": config}}
            schema, params = bm25_schema(self.client, config, None)
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
        ``funnel["score_<name>"]`` and ``funnel["bm25_rank"]``; filtered-out and
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
                unit = unit_from_row(entity).rescored(score, name)
                unit.funnel["bm25_rank"] = len(out)
                out.append(unit)
            results.append(out)
        return results


def doc_rows(owner: BM25Common, units: Sequence[Unit],
              extra: Callable[[Unit], dict] | None = None) -> Iterator[dict]:
    """Rows for a BM25 collection of units, tokenized in chunks (lazily, for big corpora)."""
    step = 2000
    for start in range(0, len(units), step):
        chunk = units[start:start + step]
        toks = owner.tokenize([u.text for u in chunk])
        for u, t in zip(chunk, toks):
            check_id(u.id)
            tokens = milvus_tokens(t)
            fix = ("split long texts first (e.g. funnel_core.text.word_windows / LaterChunking) "
                   "or lower max_tokens for clusters.")
            check_varchar(u.text, "text", u.id, fix)
            check_varchar(tokens, "tokenized text", u.id, fix)
            row = {"id": u.id, "text": u.text, "tokens": tokens, "metadata": u.metadata,
                   "info": {"parent_id": u.parent_id, "level": u.level}}
            if extra is not None:
                row.update(extra(u))
            yield row
