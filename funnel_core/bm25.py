"""BM25 over `bm25s <https://github.com/xhluca/bm25s>`_: build, search (batched, filtered),
save/load that remember every tokenizer setting.

The tokenizer settings (lower-casing, token pattern, stopwords, Snowball stemmer language) are
part of the index: a saved index is loaded with exactly the settings it was built with, so query
and corpus are always tokenized alike (a common complaint about other BM25 wrappers).

Per-query metadata filters never pad results: a filtered-out unit is never returned, and neither
is a unit whose score is 0 (no query term matched).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from funnel_core.errors import PersistError, check_positive_int, check_query
from funnel_core.funnel import Stage
from funnel_core.units import Unit, check_unique_ids

__all__ = ["BM25Index", "BM25Retrieve", "MetadataFilter", "bm25_scores", "METHODS"]

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
FORMAT_VERSION = 1
DEFAULT_TOKEN_PATTERN = r"(?u)\b\w\w+\b"

#: A per-query filter: ``{"key": value}`` / ``{"key": [v1, v2]}`` (equality / membership, all
#: keys must match) or a predicate ``f(metadata) -> bool``.
MetadataFilter = Union[Mapping[str, Any], Callable[[dict], bool], None]


class BM25Index:
    """A BM25 index over :class:`~funnel_core.units.Unit` objects.

    Args:
        method: BM25 variant: ``"lucene"`` (default), ``"robertson"``, ``"atire"``, ``"bm25l"``,
            ``"bm25+"``.
        k1, b, delta: BM25 parameters (``delta`` is used by bm25l and bm25+ only).
        stemmer: Snowball language for PyStemmer (default ``"english"``), or ``None`` for no stemming.
        stopwords: ``"en"`` (default), a list of words, or ``None`` to keep every token.
        token_pattern: Regular expression that defines a token.
        lower: Lower-case text before tokenizing.
        backend: ``"numpy"`` (default, no JIT) or ``"numba"`` (faster queries after a 10-s compile).
        level: Granularity name given to the units this index returns (when a unit has none).
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
        if filter is None:
            return None
        if callable(filter):
            return np.fromiter((bool(filter(u.metadata)) for u in self.units), dtype=bool,
                               count=len(self.units))
        if not isinstance(filter, Mapping):
            raise TypeError(f"filter must be a dict of metadata values or a callable, got "
                            f"{type(filter).__name__}.")
        mask = np.ones(len(self.units), dtype=bool)
        for key, wanted in filter.items():
            col = self._columns.get(key)
            if col is None:
                col = np.empty(len(self.units), dtype=object)
                col[:] = [u.metadata.get(key) for u in self.units]
                self._columns[key] = col
            if isinstance(wanted, (list, tuple, set, frozenset)):
                wanted_set = set(wanted)
                mask &= np.fromiter((v in wanted_set for v in col), dtype=bool, count=len(col))
            else:
                mask &= col == wanted
        return mask

    # -- searching -------------------------------------------------------------------------
    def get_scores(self, query: str) -> np.ndarray:
        """BM25 score of every indexed unit for ``query`` (float32 array, index order)."""
        self._require_built()
        tokens = self.tokenize([query])[0]
        if not tokens:  # only stopwords / no word characters: bm25s would raise IndexError
            return np.zeros(len(self.units), dtype=np.float32)
        return self._retriever.get_scores(tokens)

    def search(self, query: str, k: int = 10, filter: MetadataFilter = None) -> list[Unit]:
        """Top-``k`` units for one query; see :meth:`search_many`."""
        return self.search_many([query], k=k, filter=filter)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, filter: MetadataFilter = None,
                    n_threads: int = 0) -> list[list[Unit]]:
        """Top-``k`` units for each query, best first, scores as Python floats.

        Each returned unit is a copy with ``score`` set, ``metadata["scores"]["bm25"]`` and
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
                unit = self.units[idx].rescored(score, "bm25")
                unit.metadata["bm25_rank"] = len(out)
                out.append(unit)
        return results

    # -- persistence -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the index to the folder ``path`` atomically.

        Everything goes to a temporary sibling folder first and is renamed into place at the end,
        so a crash never leaves a half-written index where a good one was.
        """
        self._require_built()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        try:
            self._retriever.save(str(tmp / "bm25s"), show_progress=False)
            with open(tmp / "units.jsonl", "w", encoding="utf-8") as f:
                for u in self.units:
                    f.write(json.dumps(u.to_dict(), ensure_ascii=False) + "\n")
            manifest = {"format": "funnel-rag.bm25", "version": FORMAT_VERSION,
                        "config": self.config, "n_units": len(self.units)}
            (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
            _replace_dir(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, backend: str | None = None) -> "BM25Index":
        """Load an index written by :meth:`save`, with the tokenizer settings it was built with."""
        import bm25s

        path = Path(path)
        manifest_file = path / "manifest.json"
        if not manifest_file.is_file():
            raise PersistError(
                f"no BM25 index at {str(path)!r} (missing manifest.json); build one and call "
                "save(path), or check the folder name."
            )
        try:
            manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
            config = dict(manifest["config"])
            if backend is not None:
                config["backend"] = backend
            index = cls(**config)
            with open(path / "units.jsonl", encoding="utf-8") as f:
                units = [Unit.from_dict(json.loads(line)) for line in f if line.strip()]
            retriever = bm25s.BM25.load(str(path / "bm25s"))
            if config["backend"] == "numba":
                retriever.backend = "numba"
        except PersistError:
            raise
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


def _replace_dir(src: Path, dst: Path) -> None:
    """Move folder ``src`` to ``dst``, replacing ``dst`` with as small a window as possible."""
    if dst.exists():
        backup = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        shutil.rmtree(backup, ignore_errors=True)
        os.rename(dst, backup)
        os.rename(src, dst)
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.rename(src, dst)


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
        return self.index.search(query, k=k, filter=self.filter)


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
