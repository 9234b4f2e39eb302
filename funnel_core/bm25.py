"""BM25 over `bm25s <https://github.com/xhluca/bm25s>`_: build, search (batched, filtered),
save/load that remember every tokenizer setting.

The tokenizer settings (lower-casing, token pattern, stopwords, Snowball stemmer language) are
part of the index: a saved index is loaded with exactly the settings it was built with, so query
and corpus are always tokenized alike (a common complaint about other BM25 wrappers).

Per-query metadata filters never pad results: a filtered-out unit is never returned, and neither
is a unit whose score is 0 (no query term matched).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from funnel_core.errors import PersistError, check_positive_int, check_query
from funnel_core.funnel import Stage
from funnel_core.persist import atomic_dir, read_manifest, read_units, write_manifest, write_units
from funnel_core.rerank.base import Reranker
from funnel_core.units import Unit, check_unique_ids

__all__ = ["BM25Index", "BM25Retrieve", "BM25Rerank", "MetadataFilter", "metadata_mask", "bm25_scores", "METHODS"]

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
FORMAT_VERSION = 1
DEFAULT_TOKEN_PATTERN = r"(?u)\b\w\w+\b"

#: A per-query filter: ``{"key": value}`` / ``{"key": [v1, v2]}`` (equality / membership, all
#: keys must match), a predicate ``f(metadata) -> bool``, or a boolean array aligned with the
#: indexed units.
MetadataFilter = Union[Mapping[str, Any], Callable[[dict], bool], np.ndarray, None]


def metadata_mask(units: Sequence[Unit], filter: MetadataFilter,
                  columns: dict[str, np.ndarray] | None = None) -> np.ndarray | None:
    """Boolean array: which ``units`` pass ``filter`` (``None`` when there is no filter).

    ``columns`` caches one object array per metadata key, so repeated dict filters are
    vectorised comparisons instead of Python loops over metadata dicts.
    """
    if filter is None:
        return None
    n = len(units)
    if isinstance(filter, np.ndarray):
        if filter.dtype != bool or filter.shape != (n,):
            raise ValueError(f"a mask filter must be a boolean array of shape ({n},), got "
                             f"{filter.dtype} {filter.shape}.")
        return filter
    if callable(filter):
        return np.fromiter((bool(filter(u.metadata)) for u in units), dtype=bool, count=n)
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a dict of metadata values, a callable or a boolean "
                        f"array, got {type(filter).__name__}.")
    columns = {} if columns is None else columns
    mask = np.ones(n, dtype=bool)
    for key, wanted in filter.items():
        col = columns.get(key)
        if col is None:
            col = np.empty(n, dtype=object)
            col[:] = [u.metadata.get(key) for u in units]
            columns[key] = col
        if isinstance(wanted, (list, tuple, set, frozenset)):
            wanted_set = set(wanted)
            mask &= np.fromiter((v in wanted_set for v in col), dtype=bool, count=n)
        else:
            mask &= col == wanted
    return mask


class BM25Index:
    """A BM25 index over :class:`~funnel_core.units.Unit` objects.

    Args:
        method: BM25 variant: ``"lucene"`` (default), ``"robertson"``, ``"atire"``, ``"bm25l"``,
            ``"bm25+"``.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.
        delta: Lower bound of the term-frequency component (bm25l and bm25+ only).
        stemmer: Snowball language for PyStemmer (default ``"english"``), or ``None`` for no stemming.
        stopwords: ``"en"`` (default), a list of words, or ``None`` to keep every token.
        token_pattern: Regular expression that defines a token.
        lower: Lower-case text before tokenizing.
        backend: ``"numpy"`` (default, no JIT) or ``"numba"`` (faster queries after a 10-s compile).
        show_progress: Show bm25s progress bars while indexing.
    """

    def __init__(self, *, method: str = "lucene", k1: float = 1.5, b: float = 0.75,
                 delta: float = 0.5, stemmer: str | None = "english",
                 stopwords: str | list[str] | None = "en",
                 token_pattern: str = DEFAULT_TOKEN_PATTERN, lower: bool = True,
                 backend: str = "numpy", show_progress: bool = False) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown BM25 method {method!r}; choose one of {METHODS}.")
        if backend not in ("numpy", "numba"):
            raise ValueError(f"backend must be 'numpy' or 'numba', got {backend!r}.")
        self.config: dict[str, Any] = dict(
            method=method, k1=float(k1), b=float(b), delta=float(delta), stemmer=stemmer,
            stopwords=stopwords, token_pattern=token_pattern, lower=bool(lower), backend=backend,
        )
        if stemmer is not None:
            self._make_stemmer()  # fail early on an unknown language
        self.show_progress = show_progress
        self.units: list[Unit] = []
        self._retriever = None
        self._local = threading.local()
        self._columns: dict[str, np.ndarray] = {}

    # -- tokenizing ------------------------------------------------------------------------
    def _make_stemmer(self):
        import Stemmer

        lang = self.config["stemmer"]
        try:
            return Stemmer.Stemmer(lang)
        except KeyError as exc:
            raise ValueError(
                f"unknown stemmer language {lang!r}; use one of Stemmer.algorithms() "
                "(e.g. 'english') or stemmer=None."
            ) from exc

    def __getstate__(self) -> dict:
        # the per-thread stemmer cache cannot be pickled or deep-copied; it is rebuilt lazily
        state = self.__dict__.copy()
        state.pop("_local", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _stemmer(self):
        # PyStemmer objects are not thread-safe: one per thread.
        if self.config["stemmer"] is None:
            return None
        st = getattr(self._local, "stemmer", None)
        if st is None:
            st = self._local.stemmer = self._make_stemmer()
        return st

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """Tokenize texts exactly as the index does (lower, pattern, stopwords, stemmer)."""
        import bm25s

        stop = self.config["stopwords"]
        return bm25s.tokenize(
            list(texts), lower=self.config["lower"], token_pattern=self.config["token_pattern"],
            stopwords=stop if stop is not None else [], stemmer=self._stemmer(),
            return_ids=False, show_progress=False,
        )

    # -- building --------------------------------------------------------------------------
    def index(self, units: Iterable[Unit]) -> "BM25Index":
        """Build the index over ``units`` (replaces any previous content)."""
        import bm25s

        units = list(units)
        if not units:
            raise ValueError(
                "cannot build a BM25 index over an empty corpus; pass at least one unit/document."
            )
        for u in units:
            if not isinstance(u, Unit):
                raise TypeError(f"BM25Index.index expects Unit objects, got {type(u).__name__}.")
        check_unique_ids(units)
        tokens = self.tokenize([u.text for u in units])
        retriever = bm25s.BM25(method=self.config["method"], k1=self.config["k1"],
                               b=self.config["b"], delta=self.config["delta"],
                               backend=self.config["backend"])
        retriever.index(tokens, show_progress=self.show_progress)
        # Swap in the new state only once it is complete.
        self._retriever, self.units, self._columns = retriever, units, {}
        return self

    @classmethod
    def from_texts(cls, texts: Sequence[str], ids: Sequence[str] | None = None,
                   metadatas: Sequence[dict] | None = None, level: str = "passage",
                   **config: Any) -> "BM25Index":
        """Build an index from plain strings (ids default to ``"0"``, ``"1"``, ...)."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, got a single str; wrap it in a list.")
        texts = list(texts)
        ids = [str(i) for i in range(len(texts))] if ids is None else list(ids)
        metadatas = [{} for _ in texts] if metadatas is None else list(metadatas)
        if not len(ids) == len(metadatas) == len(texts):
            raise ValueError(f"texts ({len(texts)}), ids ({len(ids)}) and metadatas "
                             f"({len(metadatas)}) must have the same length.")
        units = [Unit(id=i, text=t, metadata=dict(m), level=level)
                 for i, t, m in zip(ids, texts, metadatas)]
        return cls(**config).index(units)

    def __len__(self) -> int:
        return len(self.units)

    def _require_built(self) -> None:
        if self._retriever is None:
            raise RuntimeError("this BM25Index is empty; call index(units) or BM25Index.load(path).")

    # -- filtering -------------------------------------------------------------------------
    def _mask(self, filter: MetadataFilter) -> np.ndarray | None:
        return metadata_mask(self.units, filter, self._columns)

    # -- searching -------------------------------------------------------------------------
    def get_scores(self, query: str) -> np.ndarray:
        """BM25 score of every indexed unit for ``query`` (float32 array, index order)."""
        self._require_built()
        tokens = self.tokenize([query])[0]
        if not tokens:  # only stopwords / no word characters: bm25s would raise IndexError
            return np.zeros(len(self.units), dtype=np.float32)
        return self._retriever.get_scores(tokens)

    def search(self, query: str, k: int = 10, filter: MetadataFilter = None,
               name: str = "bm25") -> list[Unit]:
        """Top-``k`` units for one query; see :meth:`search_many`."""
        return self.search_many([query], k=k, filter=filter, name=name)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, filter: MetadataFilter = None,
                    n_threads: int = 0, name: str = "bm25") -> list[list[Unit]]:
        """Top-``k`` units for each query, best first, scores as Python floats.

        Each returned unit is a copy with ``score`` set, ``metadata["scores"][name]`` and
        ``metadata["bm25_rank"]``. Units whose score is 0 (no matching term) or that the
        ``filter`` rejects are left out, so a result may hold fewer than ``k`` units.
        An empty or whitespace-only query returns ``[]``.
        """
        self._require_built()
        check_positive_int(k, "k")
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        queries = [check_query(q) for q in queries]
        mask = self._mask(filter)
        n_allowed = len(self.units) if mask is None else int(mask.sum())
        results: list[list[Unit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q]
        if not live or n_allowed == 0:
            return results
        k_eff = min(k, n_allowed)
        tokens = self.tokenize([queries[i] for i in live])
        backend = "numba" if self.config["backend"] == "numba" else "numpy"
        docs, scores = self._retriever.retrieve(
            tokens, k=k_eff, show_progress=False, n_threads=n_threads,
            backend_selection=backend,
            weight_mask=None if mask is None else mask.astype(np.float32),
        )
        for row, qi in enumerate(live):
            out = results[qi]
            for idx, score in zip(docs[row].tolist(), scores[row].tolist()):
                if score <= 0.0 or (mask is not None and not mask[idx]):
                    continue
                unit = self.units[idx].rescored(score, name)
                unit.metadata["bm25_rank"] = len(out)
                out.append(unit)
        return results

    # -- persistence -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the index to the folder ``path`` atomically (see :func:`atomic_dir`).

        The manifest records every setting (variant, k1, b, delta, stemmer, stopwords, token
        pattern, lower-casing, backend); units keep their ids, texts and metadata.
        """
        self._require_built()
        with atomic_dir(path) as tmp:
            self._retriever.save(str(tmp / "bm25s"), show_progress=False)
            write_units(tmp / "units.jsonl", self.units)
            write_manifest(tmp, "funnel-rag.bm25", FORMAT_VERSION, config=self.config,
                           n_units=len(self.units))

    @classmethod
    def load(cls, path: str | os.PathLike, backend: str | None = None) -> "BM25Index":
        """Load an index written by :meth:`save`, with the tokenizer settings it was built with."""
        import bm25s

        path = Path(path)
        manifest = read_manifest(path, "funnel-rag.bm25", "BM25 index")
        try:
            config = dict(manifest["config"])
            if backend is not None:
                config["backend"] = backend
            index = cls(**config)
            units = read_units(path / "units.jsonl")
            retriever = bm25s.BM25.load(str(path / "bm25s"))
            if config["backend"] == "numba":
                retriever.backend = "numba"
        except Exception as exc:  # corrupt json, missing arrays, ...
            raise PersistError(
                f"the BM25 index at {str(path)!r} is corrupt or incomplete ({type(exc).__name__}: "
                f"{exc}); rebuild it from the corpus and save it again."
            ) from exc
        if len(units) != manifest.get("n_units") or retriever.scores["num_docs"] != len(units):
            raise PersistError(
                f"the BM25 index at {str(path)!r} is inconsistent: manifest says "
                f"{manifest.get('n_units')} units, found {len(units)}; rebuild and save again."
            )
        index.units, index._retriever = units, retriever
        return index


class BM25Retrieve(Stage):
    """A first stage: BM25 top-``k`` over a :class:`BM25Index` (ignores incoming units).

    A cut-off ``stage % k`` is pushed down into the search. ``filter`` applies to every query;
    pass a per-query filter through :meth:`BM25Index.search` instead when it varies.
    """

    def __init__(self, index: BM25Index, k: int = 100, filter: MetadataFilter = None,
                 name: str = "bm25") -> None:
        check_positive_int(k, "k")
        self.index, self.k, self.filter, self.name = index, k, filter, name

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        k = min(self.k, self.cutoff) if self.cutoff else self.k
        return self.index.search(query, k=k, filter=self.filter, name=self.name)


def bm25_scores(query: str, texts: Sequence[str], **config: Any) -> list[float]:
    """BM25 score of each of ``texts`` for ``query``, with the texts themselves as the corpus.

    Useful to score a small candidate set (a long context's chunks, FB-RAG's S(C; Q)). Returns
    zeros when ``texts`` is empty of indexable tokens.
    """
    if not texts:
        return []
    index = BM25Index(**config)
    if not any(index.tokenize(list(texts))):
        return [0.0] * len(texts)
    index.index([Unit(id=str(i), text=t) for i, t in enumerate(texts)])
    return [float(s) for s in index.get_scores(query)]


class BM25Rerank(Reranker):
    """Rerank candidate units by BM25, with the candidates themselves as the corpus.

    A cheap, model-free way to order finer units after later chunking (they inherit their
    parent's score, so they tie), and the BM25 scorer FB-RAG uses for S(C; Q).
    """

    name = "bm25_rerank"

    def __init__(self, *, bm25_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bm25_config = dict(bm25_config or {})

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        return bm25_scores(query, texts, **self.bm25_config)
