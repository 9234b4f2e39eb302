"""BM25 over `bm25s <https://github.com/xhluca/bm25s>`_: build, search (batched, filtered),
save/load that remember every tokenizer setting.

The tokenizer settings (lower-casing, token pattern, stopwords, Snowball stemmer language) are
part of the index: a saved index is loaded with exactly the settings it was built with, so query
and corpus are always tokenized alike (a common complaint about other BM25 wrappers).

Per-query metadata filters never pad results: a filtered-out unit is never returned, and neither
is a unit whose score is 0 (no query term matched).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import importlib.util
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from funnel_core.bm25.counts import COUNT_METHODS, TermCounts, bm25_weights, count_terms
from funnel_core.cache import FreshOnCopy, LRUCache
from funnel_core.errors import PersistError, check_positive_int, check_query
from funnel_core.filters import MetadataFilter, metadata_mask
from funnel_core.funnel import Stage
from funnel_core.hardware import available_cores
from funnel_core.index import restore_settings
from funnel_core.persist import check_number, load_snapshot, prepare_units, read_units, save_snapshot, write_units
from funnel_core.settings import Settings
from funnel_core.text import CJK_MODES, check_token_pattern, clean_text, split_cjk
from funnel_core.units import SCORE_PREFIX, Unit, check_unique_ids, units_from_texts

__all__ = ["BM25Index", "BM25Retrieve", "bm25_scores", "METHODS"]

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
FORMAT = "funnel-rag.bm25"
FORMAT_VERSION = 3  # 2: snapshot layout (funnel_core.persist), cjk setting; 3: settings as to_dict()
DEFAULT_TOKEN_PATTERN = r"(?u)\b\w\w+\b"
#: Distinct metadata keys whose filter columns an index caches (least recently used dropped).
FILTER_CACHE_SIZE = 32

#: ASCII characters outside ``\w`` mapped to a space (the default token pattern's fast path)
_ASCII_NON_WORD = str.maketrans({chr(c): " " for c in range(128)
                                 if not (chr(c).isalnum() or chr(c) == "_")})


@dataclass(frozen=True)
class _State:
    """Everything a built index answers queries from, swapped in one assignment."""

    retriever: Any
    units: tuple
    pos: dict
    columns: LRUCache = field(default_factory=lambda: LRUCache(FILTER_CACHE_SIZE))
    #: per unit: True when its metadata holds only immutable values, so a hit's metadata is a
    #: shallow ``dict`` copy instead of a deep copy (the index's unit stays untouched either way)
    flat: tuple = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flat", tuple(_flat_metadata(u.metadata) for u in self.units))


_IMMUTABLE = (str, int, float, bool, bytes, type(None))


def _immutable(value: Any) -> bool:
    if isinstance(value, _IMMUTABLE):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v) for v in value)
    return False


def _flat_metadata(metadata: dict) -> bool:
    return type(metadata) is dict and all(_immutable(v) for v in metadata.values())


def _hit(unit: Unit, score: float, name: str, rank: int, flat: bool) -> Unit:
    """A search result: a copy of the indexed ``unit`` scored by stage ``name``, as
    ``unit.rescored(score, name)`` plus ``funnel["bm25_rank"]``, built without a deep copy
    when the metadata holds only immutable values (a caller editing the hit cannot reach the
    index's unit: the dict is new and its values cannot change in place). The index's units
    carry no bookkeeping (``prepare_units`` drops it), so the hit's is just this search's."""
    md = unit.metadata.copy() if flat else copy.deepcopy(unit.metadata)
    # the fields are already validated: skip __init__/__post_init__ (a third of the cost of a
    # hit); tests check that every Unit field is set here
    new = object.__new__(Unit)
    new.id = unit.id
    new.text = unit.text
    new.score = score
    new.metadata = md
    new.parent_id = unit.parent_id
    new.level = unit.level
    new.source = unit.source
    new.funnel = {SCORE_PREFIX + name: score, "bm25_rank": rank}
    return new


@contextlib.contextmanager
def _gc_paused(pause: bool = True) -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a batch's hits are built.

    A batch keeps every hit alive until it returns (200 queries x k=100: 20,000 units, each with
    two dicts); that many surviving allocations trigger full collections that traverse the whole
    index and made ``search_many`` slower per query than ``search`` at k=100 (measured in
    ``benchmarks/results/bm25.json``, rendered in docs/performance.md). The hits hold no reference cycles, so reference counting
    frees them without the collector; the collector's previous state is restored on exit. The
    collector is process-wide: for the length of the loop no thread's cycles are collected
    (reference counting still frees everything acyclic).
    """
    was_enabled = gc.isenabled()
    if pause and was_enabled:
        gc.disable()
    try:
        yield
    finally:
        if pause and was_enabled:
            gc.enable()


#: BM25 scoring engines: ``"auto"`` is numba where installed, else numpy (see :class:`BM25Index`).
ENGINES = ("auto", "numpy", "numba")


@functools.lru_cache(maxsize=1)
def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def _compiled(engine: str, retriever: Any) -> bool:
    """Does this index score with :mod:`funnel_core.bm25._numba`? (engine numba, or auto with numba
    installed; not for bm25l / bm25+, whose scores include every document: numpy path)."""
    return (engine == "numba" or (engine == "auto" and _numba_installed())) \
        and retriever.nonoccurrence_array is None


def _search_compiled(retriever: Any, tokens: list[list[str]], k: int, mask: np.ndarray | None,
                     n_threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compiled engine: the top ``k`` of every query by :mod:`funnel_core.bm25._numba` (the
    same float32 sums and order as the numpy engine), the queries split into one contiguous range
    per thread: one per available core by default (``n_threads`` <= 0), else ``n_threads``.
    Returns the batch's hits as flat arrays (see :func:`_search_blocks`)."""
    from funnel_core.bm25._numba import search_range

    ids = [retriever.get_tokens_ids(t) for t in tokens]
    q_ptr = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(i) for i in ids], out=q_ptr[1:])
    q_ids = np.fromiter((t for i in ids for t in i), dtype=np.int64, count=int(q_ptr[-1]))
    s = retriever.scores
    n, nq = int(s["num_docs"]), len(ids)
    out_idx = np.zeros((nq, k), dtype=np.int64)
    out_val = np.zeros((nq, k), dtype=np.float32)
    out_cnt = np.zeros(nq, dtype=np.int64)
    use_mask = mask is not None
    mask_arr = np.asarray(mask, dtype=np.bool_) if use_mask else np.zeros(1, dtype=np.bool_)
    args = (s["indptr"], s["indices"], s["data"], q_ptr, q_ids, mask_arr, use_mask, n, k)
    workers = min(nq, available_cores() if n_threads <= 0 else n_threads)
    if workers <= 1:
        search_range(*args, 0, nq, out_idx, out_val, out_cnt)
    else:  # the kernel releases the GIL: one contiguous range of queries per thread
        from concurrent.futures import ThreadPoolExecutor

        step = -(-nq // workers)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda lo: search_range(*args, lo, min(nq, lo + step), out_idx, out_val, out_cnt),
                          range(0, nq, step)))
    keep = np.arange(k) < out_cnt[:, None]  # row-major: each query's hits in rank order
    return out_idx[keep], out_val[keep], out_cnt


def _top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and scores of the (at most) ``k`` best positive scores: score descending, index
    ascending among ties (deterministic). Only positive scores are candidates, so the partial
    sort runs over the documents that matched a query term, not the whole corpus."""
    cand = np.flatnonzero(scores > 0)  # ascending index order
    if cand.size > k:
        vals = scores[cand]
        kth = np.partition(vals, cand.size - k)[cand.size - k]  # the k-th best score
        above = cand[vals > kth]
        cand = np.concatenate([above, cand[vals == kth][:k - above.size]])  # ties: lowest index
    top = scores[cand]
    order = np.lexsort((cand, -top))
    return cand[order], top[order]


#: Score cells (queries x documents) the numpy engine holds at once in a batch: 16 MiB of float32.
BLOCK_CELLS = 1 << 22


def _block_top_k(block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_top_k` of every row of a ``(queries, documents)`` score block at once: one
    ``np.partition`` over the rows finds each row's k-th best score, the rows' candidates (positive
    and at least that score) are gathered in one ``np.nonzero`` and put in order by one
    ``np.lexsort`` (row, score descending, index ascending), of which each row keeps its first
    ``k``. Returns the hits' document indices and scores, row after row, and each row's count."""
    rows, n = block.shape
    if k < n:
        kth = -np.partition(-block, k - 1, axis=1)[:, k - 1]
        cand = (block >= kth[:, None]) & (block > 0)
    else:
        cand = block > 0
    r, c = np.nonzero(cand)
    v = block[r, c]
    order = np.lexsort((c, -v, r))
    r, c, v = r[order], c[order], v[order]
    counts = np.bincount(r, minlength=rows)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    keep = (np.arange(r.size) - starts[r]) < k  # a row's ties at its k-th score: lowest indices
    return c[keep], v[keep], np.minimum(counts, k)


def _search_blocks(retriever: Any, tokens: list[list[str]], k: int, mask: np.ndarray | None,
                   n_threads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The numpy engine over a batch: blocks of queries scored together and cut together.

    A block's scores are one ``np.add.at`` over the postings of all its queries' terms, each query
    in its row and its terms in token order, so every cell is the same float32 sum, in the same
    order, as bm25s's ``get_scores_from_ids`` for that query alone (bm25l / bm25+ add the same
    non-occurrence sum per row, the filter multiplies as bm25s's ``weight_mask`` does); the top
    ``k`` of every row is :func:`_block_top_k`. Blocks run in ``n_threads`` threads when > 1 (-1:
    one per available core). Returns the hits as flat arrays: document indices and scores, query
    after query in rank order, and each query's count.
    """
    s = retriever.scores
    data, indices, indptr, n = s["data"], s["indices"], s["indptr"], int(s["num_docs"])
    nonocc = retriever.nonoccurrence_array
    weights = None if mask is None else mask.astype(np.float32)
    ids = [np.asarray(retriever.get_tokens_ids(t), dtype=np.int64) for t in tokens]
    step = max(1, min(len(ids), BLOCK_CELLS // max(n, 1)))

    def block(lo: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        part = ids[lo:lo + step]
        scores = np.zeros((len(part), n), dtype=np.float32)
        cells, values = [], []
        for row, q in enumerate(part):
            for t in q.tolist():
                a, b = int(indptr[t]), int(indptr[t + 1])
                cells.append(indices[a:b].astype(np.int64) + row * n)
                values.append(data[a:b])
        if cells:
            np.add.at(scores.reshape(-1), np.concatenate(cells), np.concatenate(values))
        if nonocc is not None:  # a query with no known term matches nothing: no such score
            for row, q in enumerate(part):
                if q.size:
                    scores[row] += nonocc[q].sum()
        if weights is not None:
            scores *= weights
        return _block_top_k(scores, k)

    starts = range(0, len(ids), step)
    workers = available_cores() if n_threads < 0 else n_threads
    if workers > 1 and len(starts) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(block, starts))
    else:
        parts = [block(lo) for lo in starts]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


def _build_hits(units: tuple, flat: tuple, idx: np.ndarray, val: np.ndarray, counts: np.ndarray,
                name: str) -> list[list[Unit]]:
    """The hits of a batch from its flat arrays (:func:`_search_blocks`), each as :func:`_hit`
    builds it, in one loop: the arrays become Python lists in one call each, and the per-hit work
    is only the copy itself (no function call, no re-check of what the engines already cut)."""
    key = SCORE_PREFIX + name
    new, unit_cls, deepcopy = object.__new__, Unit, copy.deepcopy
    idx_l, val_l = idx.tolist(), val.tolist()
    results: list[list[Unit]] = []
    pos = 0
    for c in counts.tolist():
        out: list[Unit] = []
        for rank in range(c):
            i = idx_l[pos + rank]
            score = val_l[pos + rank]
            unit = units[i]
            hit = new(unit_cls)
            hit.id = unit.id
            hit.text = unit.text
            hit.score = score
            hit.metadata = unit.metadata.copy() if flat[i] else deepcopy(unit.metadata)
            hit.parent_id = unit.parent_id
            hit.level = unit.level
            hit.source = unit.source
            hit.funnel = {key: score, "bm25_rank": rank}
            out.append(hit)
        results.append(out)
        pos += c
    return results


#: Stopword lists by language name, from bm25s's public ``bm25s.stopwords`` module (NLTK's lists).
_STOPWORD_LISTS = {
    ("en", "english"): "STOPWORDS_EN", ("en_plus", "english_plus"): "STOPWORDS_EN_PLUS",
    ("de", "german"): "STOPWORDS_GERMAN", ("nl", "dutch"): "STOPWORDS_DUTCH",
    ("fr", "french"): "STOPWORDS_FRENCH", ("es", "spanish"): "STOPWORDS_SPANISH",
    ("pt", "portuguese"): "STOPWORDS_PORTUGUESE", ("it", "italian"): "STOPWORDS_ITALIAN",
    ("ru", "russian"): "STOPWORDS_RUSSIAN", ("sv", "swedish"): "STOPWORDS_SWEDISH",
    ("no", "norwegian"): "STOPWORDS_NORWEGIAN", ("zh", "chinese"): "STOPWORDS_CHINESE",
    ("tr", "turkish"): "STOPWORDS_TURKISH", ("ko", "korean"): "STOPWORDS_KOREAN",
    ("da", "danish"): "STOPWORDS_DANISH",
}
_STOPWORD_LANGS = tuple(name for names in _STOPWORD_LISTS for name in names)


def stopword_set(stopwords: str | Sequence[str] | None) -> frozenset:
    """The stopwords of a language name (see ``_STOPWORD_LISTS``) or an explicit list."""
    if stopwords is None:
        return frozenset()
    if isinstance(stopwords, str):
        import bm25s.stopwords

        for names, attr in _STOPWORD_LISTS.items():
            if stopwords in names:
                return frozenset(getattr(bm25s.stopwords, attr))
        raise ValueError(f"unknown stopword language {stopwords!r}; use one of {_STOPWORD_LANGS} or a list.")
    return frozenset(stopwords)


#: The BM25 index's tokenizer and scoring settings (the keys of :attr:`BM25Index.config`).
BM25_SETTINGS = ("method", "k1", "b", "delta", "stemmer", "stopwords", "token_pattern", "lower",
                 "engine", "cjk")


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check every BM25 setting (also those read from a saved manifest); return a clean copy."""
    method = config.get("method", "lucene")
    if method not in METHODS:
        raise ValueError(f"unknown BM25 method {method!r}; choose one of {METHODS}.")
    k1 = check_number(config.get("k1", 1.5), "k1", 0.0, 100.0)
    b = check_number(config.get("b", 0.75), "b", 0.0, 1.0)
    delta = check_number(config.get("delta", 0.5), "delta", 0.0, 100.0)
    stemmer = config.get("stemmer", "english")
    if stemmer is not None and not isinstance(stemmer, str):
        raise TypeError(f"stemmer must be a language name (str) or None, got {stemmer!r:.60}.")
    stop = config.get("stopwords", "en")
    if isinstance(stop, str):
        if stop not in _STOPWORD_LANGS:
            raise ValueError(f"unknown stopwords language {stop!r}; use one of {_STOPWORD_LANGS}, "
                             "a list of words, or None.")
    elif isinstance(stop, (list, tuple)):
        if not all(isinstance(w, str) for w in stop):
            raise TypeError("stopwords must be a language name, a list of str, or None.")
        stop = list(stop)
    elif stop is not None:
        raise TypeError(f"stopwords must be a language name, a list of str, or None; got "
                        f"{type(stop).__name__}.")
    token_pattern = check_token_pattern(config.get("token_pattern", DEFAULT_TOKEN_PATTERN))
    lower = config.get("lower", True)
    if not isinstance(lower, bool):
        raise TypeError(f"lower must be True or False, got {lower!r:.40}.")
    if "backend" in config:
        raise TypeError("the BM25 scoring engine is engine='numpy' or engine='numba' (backend= "
                        "means storage in funnel-rag: 'memory' or a Milvus backend); got "
                        f"backend={config['backend']!r}.")
    engine = config.get("engine", "auto")
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}.")
    if engine == "numba" and not _numba_installed():
        raise ImportError("engine='numba' needs numba: pip install 'funnel-rag[fast]', or use "
                          "engine='auto' (numba where installed, else numpy).")
    cjk = config.get("cjk")
    if cjk not in CJK_MODES:
        raise ValueError(f"cjk must be one of {CJK_MODES}, got {cjk!r}; use 'bigram' for Chinese/"
                         "Japanese text written without spaces.")
    unknown = set(config) - set(BM25_SETTINGS)
    if unknown:
        raise TypeError(f"unknown BM25 setting(s) {sorted(unknown)}.")
    return dict(method=method, k1=float(k1), b=float(b), delta=float(delta), stemmer=stemmer,
                stopwords=stop, token_pattern=token_pattern, lower=lower, engine=engine, cjk=cjk)


class BM25Index(FreshOnCopy, Settings):
    """A BM25 index over :class:`~funnel_core.units.Unit` objects.

    Args:
        method: BM25 variant: ``"lucene"`` (default), ``"robertson"``, ``"atire"``, ``"bm25l"``,
            ``"bm25+"``.
        k1: BM25 term-frequency saturation (finite, in [0, 100]).
        b: BM25 length normalisation (in [0, 1]).
        delta: Lower bound of the term-frequency component (bm25l and bm25+ only).
        stemmer: Snowball language for PyStemmer (default ``"english"``), or ``None`` for no stemming.
        stopwords: ``"en"`` (default), a list of words, or ``None`` to keep every token.
        token_pattern: Regular expression that defines a token (checked at construction, see
            :func:`~funnel_core.text.check_token_pattern`).
        lower: Lower-case text before tokenizing.
        engine: ``"auto"`` (default: numba where installed, as in the ``[fast]`` and ``[all]``
            extras, else numpy), ``"numpy"`` or ``"numba"``. Both give the same results; the
            numba kernels (:mod:`funnel_core.bm25._numba`) are compiled once per installation
            (cached on disk) and score a batch in one thread per CPU (docs/performance.md).
        cjk: ``"bigram"`` or ``"char"`` to split Chinese/Japanese/Korean runs into bigrams or
            characters (see :func:`~funnel_core.text.split_cjk`); ``None`` (default) keeps them whole.
        show_progress: Show bm25s progress bars while indexing.

    The whole built state (bm25s index, units, id lookup, filter-column cache) is one immutable
    object replaced in a single assignment by :meth:`index`, :meth:`add` and :meth:`delete`, so
    concurrent searches see either the old or the new index, never a mix. The index keeps its
    own copies of the units: editing them afterwards does not change results.
    """

    #: the per-thread stemmer cache and the writer lock are rebuilt in copies and unpickled indexes
    _fresh_on_copy = {"_write_lock": threading.Lock, "_local": threading.local,
                      "_plan": lambda: None}
    #: every setting but the scoring engine and the progress bars shapes the built index
    build_settings = frozenset(BM25_SETTINGS) - {"engine"}
    #: a tokenizer edit (before the index is built) drops the compiled token plan
    load_settings = frozenset({"stopwords", "token_pattern"})
    model_attrs = ("_plan",)

    def __init__(self, *, method: str = "lucene", k1: float = 1.5, b: float = 0.75,
                 delta: float = 0.5, stemmer: str | None = "english",
                 stopwords: str | list[str] | None = "en",
                 token_pattern: str = DEFAULT_TOKEN_PATTERN, lower: bool = True,
                 engine: str = "auto", cjk: str | None = None, show_progress: bool = False) -> None:
        config = validate_config(dict(
            method=method, k1=k1, b=b, delta=delta, stemmer=stemmer, stopwords=stopwords,
            token_pattern=token_pattern, lower=lower, engine=engine, cjk=cjk))
        self.method, self.k1, self.b, self.delta = (config[n] for n in ("method", "k1", "b", "delta"))
        self.stemmer, self.stopwords, self.token_pattern = stemmer, config["stopwords"], token_pattern
        self.lower, self.engine, self.cjk = lower, engine, cjk
        if stemmer is not None:
            self._make_stemmer()  # fail early on an unknown language
        self.show_progress = show_progress
        self._state: _State | None = None
        self._local = threading.local()
        self._write_lock = threading.Lock()

    @property
    def config(self) -> dict[str, Any]:
        """The tokenizer and scoring settings (every setting but ``show_progress``), as
        :func:`validate_config` returns them."""
        return {n: getattr(self, n) for n in BM25_SETTINGS}

    def built(self) -> bool:
        return self.__dict__.get("_state") is not None

    # -- state views (read the state once per call for a consistent view) ------------------
    @property
    def units(self) -> list[Unit]:
        """The indexed units (the index's own copies; do not edit them)."""
        st = self._state
        return [] if st is None else list(st.units)

    @property
    def _retriever(self) -> Any:
        st = self._state
        return None if st is None else st.retriever

    # -- tokenizing ------------------------------------------------------------------------
    def _make_stemmer(self):
        import Stemmer

        lang = self.stemmer
        try:
            return Stemmer.Stemmer(lang)
        except KeyError as exc:
            raise ValueError(
                f"unknown stemmer language {lang!r}; use one of Stemmer.algorithms() "
                "(e.g. 'english') or stemmer=None."
            ) from exc

    def _stemmer(self):
        # PyStemmer objects are not thread-safe: one per thread (and per language: the stemmer
        # of an index not built yet may be edited)
        if self.stemmer is None:
            return None
        cached = getattr(self._local, "stemmer", None)
        if cached is None or cached[0] != self.stemmer:
            cached = self._local.stemmer = (self.stemmer, self._make_stemmer())
        return cached[1]

    def _token_plan(self) -> tuple[Callable[[str], list[str]], frozenset]:
        """The compiled token pattern's ``findall`` and the stopword set (built once)."""
        plan = self.__dict__.get("_plan")
        if plan is None:
            words = stopword_set(self.stopwords)
            plan = self._plan = (re.compile(self.token_pattern).findall, words)
        return plan

    def tokenize(self, texts: Sequence[str]) -> list[list[str]]:
        """Tokenize texts exactly as the index does (lower, pattern, stopwords, stemmer, CJK).

        The same steps as ``bm25s.tokenize`` (lower-case, ``re.findall`` of the token pattern,
        stopwords removed before stemming, PyStemmer on each token), without its vocabulary
        bookkeeping and progress bars: a query costs microseconds here, not a millisecond.
        Lone surrogates are replaced by U+FFFD first (see :func:`~funnel_core.text.clean_text`).
        """
        findall, stop = self._token_plan()
        lower = self.lower
        out: list[list[str]] = []
        for text in texts:
            text = clean_text(text)
            if lower:
                text = text.lower()
            out.append([t for t in findall(text) if t not in stop])
        stemmer = self._stemmer()
        if stemmer is not None:
            if len(out) == 1:
                out = [stemmer.stemWords(out[0])]
            else:  # stem each distinct token once
                distinct = list({t: None for toks in out for t in toks})
                stems = dict(zip(distinct, stemmer.stemWords(distinct)))
                out = [[stems[t] for t in toks] for toks in out]
        cjk = self.cjk
        return [split_cjk(t, cjk) for t in out] if cjk else out

    def term_counts(self, texts: Sequence[str]) -> TermCounts:
        """How often each index term occurs in each text, tokenized exactly as :meth:`tokenize`
        does (see :mod:`funnel_core.bm25.counts`): what :meth:`index_counts` builds from."""
        if self.cjk:  # CJK splits stemmed tokens: tokenize each text whole
            def split(text: str) -> list[str]:
                return self.tokenize([text])[0]

            def term_of(tokens: list[str]) -> list[str | None]:
                return list(tokens)
        else:
            findall, stop = self._token_plan()
            lower = self.lower
            stemmer = self._stemmer()
            default = self.token_pattern == DEFAULT_TOKEN_PATTERN

            def split(text: str) -> list[str]:
                if default and text.isascii():
                    # the default pattern on ASCII text: runs of [A-Za-z0-9_]; the one-character
                    # runs, which the pattern skips, are dropped per distinct token in term_of
                    return (text.lower() if lower else text).translate(_ASCII_NON_WORD).split()
                text = clean_text(text)
                return findall(text.lower() if lower else text)

            def term_of(tokens: list[str]) -> list[str | None]:
                kept = [t for t in tokens if t not in stop and (len(t) > 1 or not default)]
                stems = dict(zip(kept, stemmer.stemWords(kept) if stemmer is not None else kept))
                return [stems.get(t) for t in tokens]

        progress = None
        if self.show_progress:
            from tqdm.auto import tqdm

            def progress(batches: Iterable[Any]) -> Iterable[Any]:
                return tqdm(batches, desc="BM25 count terms", unit="batch")
        return count_terms(texts, split, term_of, progress=progress)

    def splits_at(self, separator: str) -> bool:
        """Whether texts joined by ``separator`` tokenize to their tokens one after the other (no
        token spans the join), so their :meth:`term_counts` add up: true for the default token
        pattern and a separator without word characters; a custom pattern is not assumed to."""
        return self.token_pattern == DEFAULT_TOKEN_PATTERN and not re.search(r"\w", separator)

    # -- building --------------------------------------------------------------------------
    def _no_tokens(self, units: list[Unit]) -> ValueError:
        stop = self.stopwords
        return ValueError(
            f"none of the {len(units)} units has an indexable token (token_pattern="
            f"{self.token_pattern!r}, stopwords={stop if isinstance(stop, str) else 'custom' if stop else None!r}"
            f", e.g. unit id={units[0].id!r} text={units[0].text!r:.60}); index text with words, "
            "or loosen the tokenizer (stopwords=None, token_pattern=r'\\w+', cjk='bigram' for "
            "Chinese/Japanese).")

    def _bm25s(self) -> Any:
        import bm25s

        return bm25s.BM25(method=self.method, k1=self.k1, b=self.b,
                          delta=self.delta,
                          backend="numpy")  # engine="numba" runs our cached kernels instead

    def _build(self, units: list[Unit], counts: TermCounts | None = None) -> _State:
        if self.method in COUNT_METHODS:
            if counts is None:
                counts = self.term_counts([u.text for u in units])
            if counts.matrix.shape[0] != len(units):
                raise ValueError(f"term counts have {counts.matrix.shape[0]} rows for {len(units)} units.")
            if counts.matrix.nnz == 0:
                raise self._no_tokens(units)
            retriever = self._bm25s()
            # the attributes bm25s.BM25.index sets, computed from the counts (equal to its own)
            retriever.scores, retriever.vocab_dict = bm25_weights(
                counts, self.method, self.k1, self.b)
            retriever.unique_token_ids_set = set(retriever.vocab_dict.values())
            retriever.nonoccurrence_array = None
        else:  # bm25l / bm25+: bm25s adds its non-occurrence scores
            tokens = self.tokenize([u.text for u in units])
            if not any(tokens):
                raise self._no_tokens(units)
            retriever = self._bm25s()
            retriever.index(tokens, show_progress=self.show_progress)
        return _State(retriever, tuple(units), {u.id: i for i, u in enumerate(units)})

    def index_counts(self, units: Iterable[Unit], counts: TermCounts, *, copy: bool = True) -> "BM25Index":
        """Build the index over ``units`` from their :meth:`term_counts` (row ``i`` = unit ``i``),
        e.g. cluster counts summed from their members' (:meth:`TermCounts.grouped`). The same
        index as :meth:`index` over the same texts; bm25l and bm25+ tokenize again.

        ``copy=False`` keeps the given :class:`Unit` objects instead of checked copies: for a
        caller that made them with ``prepare_units`` and never edits them (a clustered index's
        own documents).
        """
        units = prepare_units(list(units), "BM25Index.index_counts") if copy else list(units)
        if not units:
            raise ValueError("cannot build a BM25 index over an empty corpus; pass at least one unit/document.")
        check_unique_ids(units)
        state = self._build(units, counts)
        with self._write_lock:
            self._state = state
        return self

    def index(self, units: Iterable[Unit]) -> "BM25Index":
        """Build the index over ``units`` (replaces any previous content in one swap)."""
        if isinstance(units, (str, Unit)):
            raise TypeError("index expects a list of Unit objects; wrap a single unit in a list.")
        units = list(units)
        if not units:
            raise ValueError(
                "cannot build a BM25 index over an empty corpus; pass at least one unit/document."
            )
        units = prepare_units(units, "BM25Index.index")
        check_unique_ids(units)
        state = self._build(units)
        with self._write_lock:
            self._state = state
        return self

    def add(self, units: Iterable[Unit]) -> "BM25Index":
        """Add ``units`` (new ids) to the index.

        BM25's statistics (IDF, average length) depend on every document, so the new state is
        rebuilt over old + new units (O(corpus)); scores equal those of a fresh index over the
        same units. Concurrent searches see the old index until the new one is swapped in.
        """
        if isinstance(units, (str, Unit)):
            raise TypeError("add expects a list of Unit objects; wrap a single unit in a list.")
        new = prepare_units(list(units), "BM25Index.add")
        if not new:
            return self
        with self._write_lock:
            st = self._state
            old = list(st.units) if st is not None else []
            taken = st.pos if st is not None else {}
            for u in new:
                if u.id in taken:
                    raise ValueError(f"unit id {u.id!r} is already in the index; delete it first "
                                     "(delete([id])) or use a new id.")
            check_unique_ids(new)
            self._state = self._build(old + new)
        return self

    def delete(self, ids: Iterable[str]) -> int:
        """Remove the units with these ids; return how many were removed.

        Unknown ids are ignored. Deleting every unit raises ``ValueError`` (an index cannot be
        empty). O(corpus), like :meth:`add`.
        """
        if isinstance(ids, str):
            raise TypeError("delete expects a list of ids; wrap a single id in a list.")
        ids = list(ids)
        if any(i is None for i in ids):  # str(None) would delete a unit whose id is "None"
            raise TypeError("delete got None among the ids; pass the units' ids (str).")
        drop = {str(i) for i in ids}
        with self._write_lock:
            st = self._state
            if st is None or not drop:
                return 0
            keep = [u for u in st.units if u.id not in drop]
            removed = len(st.units) - len(keep)
            if removed == 0:
                return 0
            if not keep:
                raise ValueError("delete would remove every unit; build a new index instead.")
            self._state = self._build(keep)
        return removed

    @classmethod
    def from_texts(cls, texts: Sequence[str], ids: Sequence[str] | None = None,
                   metadatas: Sequence[dict] | None = None, level: str = "passage",
                   **config: Any) -> "BM25Index":
        """Build an index from plain strings (ids default to ``"0"``, ``"1"``, ...)."""
        return cls(**config).index(units_from_texts(texts, ids, metadatas, level))

    def __len__(self) -> int:
        st = self._state
        return 0 if st is None else len(st.units)

    def _require_built(self) -> _State:
        st = self._state
        if st is None:
            raise RuntimeError("this BM25Index is empty; call index(units) or BM25Index.load(path).")
        return st

    # -- filtering -------------------------------------------------------------------------
    def _mask(self, filter: MetadataFilter, st: _State | None = None) -> np.ndarray | None:
        st = st or self._require_built()
        return metadata_mask(st.units, filter, st.columns)

    # -- searching -------------------------------------------------------------------------
    def get_scores(self, query: str) -> np.ndarray:
        """BM25 score of every indexed unit for ``query`` (float32 array, index order)."""
        return self.token_scores(self.tokenize([check_query(query)])[0])

    def token_scores(self, tokens: Sequence[str]) -> np.ndarray:
        """BM25 score of every indexed unit for a query already cut by :meth:`tokenize` (so
        two indexes with the same tokenizer settings share one tokenization)."""
        st = self._require_built()
        ids = st.retriever.get_tokens_ids(list(tokens)) if tokens else []
        if not ids:  # only stopwords / no known term: nothing matches
            return np.zeros(len(st.units), dtype=np.float32)
        if _compiled(self.engine, st.retriever):
            from funnel_core.bm25._numba import dense_scores

            s = st.retriever.scores
            return dense_scores(s["indptr"], s["indices"], s["data"], np.asarray(ids, dtype=np.int64),
                                int(s["num_docs"]))
        return st.retriever.get_scores_from_ids(ids)

    def hits(self, scores: np.ndarray, k: int, mask: np.ndarray | None = None,
             name: str = "bm25") -> list[Unit]:
        """The top-``k`` units for one query's ``scores`` (from :meth:`token_scores`), as
        :meth:`search` returns them: positive scores only, ``mask`` (a boolean array over the
        units) applied, ties by index position."""
        st = self._require_built()
        check_positive_int(k, "k")
        k = min(k, max(1, len(st.units)))  # no buffer larger than the index
        if mask is not None:
            scores = np.where(mask, scores, 0.0).astype(np.float32, copy=False)
        idx, sc = _top_k(scores, k)
        out: list[Unit] = []
        for i, score in zip(idx.tolist(), sc.tolist()):
            if score > 0.0:
                out.append(_hit(st.units[i], score, name, len(out), st.flat[i]))
        return out

    def search(self, query: str, k: int = 10, filter: MetadataFilter = None,
               name: str = "bm25") -> list[Unit]:
        """Top-``k`` units for one query; see :meth:`search_many`."""
        return self.search_many([query], k=k, filter=filter, name=name)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, filter: MetadataFilter = None,
                    n_threads: int = 0, name: str = "bm25") -> list[list[Unit]]:
        """Top-``k`` units for each query, best first, scores as Python floats.

        Each returned unit is a copy with ``score`` set, ``funnel["score_<name>"]`` and
        ``funnel["bm25_rank"]``. Units whose score is 0 (no matching term) or that the
        ``filter`` rejects are left out, so a result may hold fewer than ``k`` units.
        Equal scores are ordered by index position. An empty or whitespace-only query returns
        ``[]``. With the numba engine a compiled kernel (:mod:`funnel_core.bm25._numba`)
        scores the batch in one thread per CPU (``n_threads`` > 0: that many); the numpy
        engine scores and cuts blocks of queries together (one scatter-add and one partition per
        block, not per query), in ``n_threads`` threads when > 1 (-1: one per core available to
        the process; numpy's scatter-add holds the GIL, so threads gain little). Both engines
        return the same units and scores, and a query returns the same alone as in a batch. (``bm25l`` and ``bm25+`` give every document
        a score, not just those sharing a term: they take the numpy path in both engines.)

        Copies are cheap: a unit whose metadata holds only immutable values gets a new dict,
        others a deep copy, so editing a returned unit never changes the index.
        """
        st = self._require_built()
        check_positive_int(k, "k")
        k = min(k, max(1, len(st.units)))  # the top-k buffers never exceed the index
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        queries = [check_query(q) for q in queries]
        mask = self._mask(filter, st)
        n_allowed = len(st.units) if mask is None else int(mask.sum())
        results: list[list[Unit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q]
        if not live or n_allowed == 0:
            return results
        tokens = self.tokenize([queries[i] for i in live])
        search = _search_compiled if _compiled(self.engine, st.retriever) else _search_blocks
        idx, val, counts = search(st.retriever, tokens, k, mask, n_threads)
        with _gc_paused(len(live) > 1):
            for qi, out in zip(live, _build_hits(st.units, st.flat, idx, val, counts, name)):
                results[qi] = out
        return results

    # -- persistence -----------------------------------------------------------------------
    def _write(self, folder: Path, st: _State | None = None) -> dict[str, Any]:
        """Write the files of a state (default: the current one) into ``folder``; return the
        manifest entry (the settings, :meth:`to_dict`, and the number of units)."""
        st = st or self._require_built()
        folder.mkdir(parents=True, exist_ok=True)
        st.retriever.save(str(folder / "bm25s"), show_progress=False)
        write_units(folder / "units.jsonl", st.units)
        return {"settings": self.to_dict(), "n_units": len(st.units)}

    @classmethod
    def _legacy_settings(cls, meta: Mapping[str, Any]) -> dict[str, Any]:
        """The settings of a manifest written before they were ``to_dict()``: a ``"config"`` dict,
        whose scoring engine may still be called ``backend``."""
        config = meta.get("config")
        if not isinstance(config, dict):
            raise KeyError("settings")
        config = dict(config)
        if "backend" in config:  # written before the scoring engine was called engine=
            config["engine"] = config.pop("backend")
        return config

    @classmethod
    def _read(cls, folder: Path, meta: Mapping[str, Any], engine: str | None = None) -> "BM25Index":
        import bm25s

        index: BM25Index = restore_settings(cls, folder, meta, "BM25 index",
                                            **({} if engine is None else {"engine": engine}))
        units = read_units(folder / "units.jsonl")
        retriever = bm25s.BM25.load(str(folder / "bm25s"))
        retriever.backend = "numpy"  # bm25s' numba path recompiles in every process; ours is cached
        params = (retriever.method, float(retriever.k1), float(retriever.b), float(retriever.delta))
        want = tuple(index.config[k] for k in ("method", "k1", "b", "delta"))
        n = meta.get("n_units")
        if len(units) != n or retriever.scores.get("num_docs") != len(units) or params != want:
            raise PersistError(
                f"the BM25 index in {str(folder)!r} is inconsistent (manifest: {n!r} units, "
                f"found {len(units)}; parameters {params} vs {want}); rebuild and save again.")
        check_sparse_scores(retriever.scores, retriever.vocab_dict, len(units), folder)
        check_nonoccurrence(retriever, len(retriever.scores["indptr"]) - 1, folder)
        # the engines score in float32 (numba has no float16 kernels: NotImplementedError); a
        # folder whose scores were stored narrower or wider (bm25s' dtype=) is read as float32
        if retriever.scores["data"].dtype != np.float32:
            retriever.scores["data"] = retriever.scores["data"].astype(np.float32)
        if retriever.nonoccurrence_array is not None and retriever.nonoccurrence_array.dtype != np.float32:
            retriever.nonoccurrence_array = retriever.nonoccurrence_array.astype(np.float32)
        check_unique_ids(units)
        index._state = _State(retriever, tuple(units), {u.id: i for i, u in enumerate(units)})
        return index

    def save(self, path: str | os.PathLike) -> None:
        """Commit the index to the persist folder ``path`` (see :mod:`funnel_core.persist`).

        The manifest records every setting (variant, k1, b, delta, stemmer, stopwords, token
        pattern, lower-casing, scoring engine, CJK mode); units keep their ids, texts and metadata.
        A crash during the save leaves the previous snapshot loadable; ``path`` must be empty,
        new, or a folder funnel-rag saved to before.
        """
        st = self._require_built()  # one state, even if index()/add() swap it meanwhile
        save_snapshot(path, FORMAT, FORMAT_VERSION, lambda folder: self._write(folder, st))

    @classmethod
    def load(cls, path: str | os.PathLike, engine: str | None = None,
             verify: bool = True) -> "BM25Index":
        """Load an index written by :meth:`save`, with the tokenizer settings it was built with
        (``engine=`` overrides the scoring engine it was saved with).

        ``verify=False`` skips the SHA-256 check of every file (faster; corruption then may go
        unnoticed).
        """
        return load_snapshot(path, FORMAT, FORMAT_VERSION, "BM25 index",
                             lambda folder, m: cls._read(folder, m["meta"], engine), verify=verify)


def check_sparse_scores(scores: Mapping[str, Any], vocab: Any, n_docs: int, folder: Path) -> None:
    """Structural checks of a loaded bm25s score matrix (CSC: one column per token) before any
    query touches it: the numba backend indexes these arrays without bounds checks, so a
    damaged ``indptr`` or ``indices`` (a tampered folder with recomputed checksums, or
    ``verify=False``) would read or write out of bounds and kill the process, and with numpy it
    would silently change scores. Checked: 1-D integer ``indptr``/``indices`` and float ``data``
    of matching lengths, ``indptr`` starting at 0, non-decreasing and ending at ``len(data)``,
    every document index in ``[0, n_docs)``, finite scores, and every vocabulary id naming a
    column (bm25s's empty-string token may sit one past the last column; it is never queried
    as a column)."""
    def bad(what: str) -> PersistError:
        return PersistError(f"the BM25 score matrix in {str(folder)!r} is damaged ({what}); rebuild "
                            "the index and save it again (or restore the folder from a backup).")

    arrays = [scores.get(k) for k in ("data", "indices", "indptr")]
    if not all(isinstance(a, np.ndarray) and a.ndim == 1 for a in arrays):
        raise bad("data, indices and indptr must be 1-D arrays")
    data, indices, indptr = (np.asarray(a) for a in arrays)
    if indptr.dtype.kind not in "iu" or indices.dtype.kind not in "iu" or data.dtype.kind != "f":
        raise bad(f"dtypes {data.dtype}/{indices.dtype}/{indptr.dtype}")
    if len(data) != len(indices) or len(indptr) < 1:
        raise bad(f"{len(data)} scores for {len(indices)} document indices")
    if int(indptr[0]) != 0 or int(indptr[-1]) != len(data) or (np.diff(indptr) < 0).any():
        raise bad("indptr is not a non-decreasing offset array from 0 to the number of scores")
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= n_docs):
        raise bad(f"a document index outside [0, {n_docs})")
    if not np.isfinite(data).all():
        raise bad("non-finite scores")
    n_cols = len(indptr) - 1
    if not isinstance(vocab, dict):
        raise bad("the vocabulary is not a mapping")
    for token, col in vocab.items():
        if isinstance(col, bool) or not isinstance(col, (int, np.integer)) or not (
                0 <= col < n_cols or (token == "" and col == n_cols)):
            raise bad(f"vocabulary id {col!r} of {str(token)[:40]!r} outside [0, {n_cols})")


def check_nonoccurrence(retriever: Any, n_cols: int, folder: Path) -> None:
    """The non-occurrence scores of bm25l / bm25+ (one float per vocabulary column, added for
    each query token a document lacks): a 1-D float array of ``n_cols`` finite values, else a
    :class:`PersistError` naming the file (a truncated or reshaped array would fail at query
    time with an ``IndexError``, or silently add the wrong scores). Other variants have none."""
    arr = getattr(retriever, "nonoccurrence_array", None)
    name = str(folder / "bm25s" / "nonoccurrence_array.index.npy")
    if retriever.method not in ("bm25l", "bm25+"):
        if arr is not None:
            raise PersistError(f"{name!r} holds non-occurrence scores, which a {retriever.method} index "
                               "does not have; the folder is damaged: rebuild the index and save it again.")
        return
    what = None
    if not isinstance(arr, np.ndarray):
        what = "missing"
    elif arr.ndim != 1 or arr.shape[0] != n_cols:
        what = f"shape {arr.shape}, where the vocabulary has {n_cols} columns: ({n_cols},) expected"
    elif arr.dtype.kind != "f" or not np.isfinite(arr).all():
        what = f"dtype {arr.dtype} or non-finite values"
    if what is not None:
        raise PersistError(f"the {retriever.method} non-occurrence scores {name!r} are damaged ({what}); "
                           "rebuild the index and save it again (or restore the folder from a backup).")


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
        k = self.limit(self.k)
        return self.index.search(query, k=k, filter=self.filter, name=self.name)


def bm25_scores(query: str, texts: Sequence[str], **config: Any) -> list[float]:
    """BM25 score of each of ``texts`` for ``query``, with the texts themselves as the corpus.

    Useful to score a small candidate set (a long context's chunks, FB-RAG's S(C; Q)). Returns
    zeros when ``texts`` is empty of indexable tokens.
    """
    if not texts:
        return []
    query = check_query(query)
    index = BM25Index(**config)
    if not any(index.tokenize(list(texts))):
        return [0.0] * len(texts)
    index.index([Unit(id=str(i), text=t) for i, t in enumerate(texts)])
    return [float(s) for s in index.get_scores(query)]
