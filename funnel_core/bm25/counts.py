"""Term counts, and BM25 weights from counts: the build path of :class:`~funnel_core.bm25.BM25Index`.

bm25s builds an index with Python work per token (a ``Counter`` per document, a set intersection
per document for the document frequencies, a dict lookup per token in a list comprehension); at
1M documents of 100 tokens that is most of a clustering pipeline's BM25 time. Here the per-token
work runs in C: one ``re.findall`` per text, one dict lookup per token through ``map`` (no Python
frame per token), stopwords and the stemmer applied once per distinct surface token, counting and
weighting in scipy/numpy. The weights equal bm25s's bit for bit (its formulas, its float32/float64
steps; ``tests/core/test_bm25_counts.py`` compares both builds on random corpora), so a query
scores the same whichever path built the index.

Counts are also what a cluster index needs: a cluster's text is its members' texts joined by a
separator no token spans, so its term counts are the sum of theirs (:meth:`TermCounts.grouped`)
and the cluster index costs no second tokenization.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["TermCounts", "count_terms", "bm25_weights", "COUNT_METHODS"]

#: BM25 variants weighted from counts here; bm25l and bm25+ (which add a non-occurrence score to
#: every document) are built by bm25s itself.
COUNT_METHODS = ("lucene", "robertson", "atire")
#: Texts tokenized between two merges of the vocabulary (bounds the memory of surface tokens).
BATCH = 20_000
#: Counts weighted at a time (bounds the float64 temporaries: ~32 MiB each).
ENTRIES_PER_BLOCK = 1 << 22


@dataclass(frozen=True)
class TermCounts:
    """How often each term occurs in each unit.

    Attributes:
        matrix: ``(units, terms)`` int32 CSR matrix with sorted column indices.
        terms: The column names (index terms after stopwords and stemming), sorted.
    """

    matrix: sp.csr_matrix
    terms: tuple[str, ...]

    def grouped(self, groups: Sequence[Sequence[int] | np.ndarray]) -> "TermCounts":
        """Counts of units made by joining the units of each group (row ``g`` = the sum of the
        rows in ``groups[g]``): the counts of cluster texts from their members' counts."""
        sizes = [len(g) for g in groups]
        members = np.concatenate([np.asarray(g, dtype=np.int64) for g in groups]) if groups else \
            np.zeros(0, np.int64)
        rows = np.repeat(np.arange(len(groups)), sizes)
        join = sp.csr_matrix((np.ones(len(members), np.int32), (rows, members)),
                             shape=(len(groups), self.matrix.shape[0]))
        out = (join @ self.matrix).tocsr()
        out.sort_indices()
        return TermCounts(out, self.terms)


class _Numbering(dict):
    """Numbers keys in first-seen order: ``d[key]`` returns the key's number, adding it when new
    (a lookup through ``map(d.__getitem__, tokens)`` stays in C for every known token)."""

    def __missing__(self, key: str) -> int:
        number = self[key] = len(self)
        return number


def count_terms(texts: Iterable[str], split: Callable[[str], list[str]],
                term_of: Callable[[list[str]], list[str | None]], batch: int = BATCH,
                progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None) -> TermCounts:
    """Count the terms of ``texts``.

    Args:
        texts: The unit texts.
        split: One text to its surface tokens, in order (for BM25Index: clean, lower-case,
            ``findall`` of the token pattern).
        term_of: Distinct surface tokens to their index terms, or None for a dropped token (a
            stopword); called once per batch with the tokens new to the vocabulary.
        batch: Texts per batch.
        progress: Wraps the batch iterator (e.g. ``tqdm``).
    """
    texts = list(texts)
    surface = _Numbering()  # surface token -> its number, in first-seen order
    term_ids: dict[str, int] = {}  # index term -> its provisional column, in first-seen order
    column_of: list[int] = []  # surface number -> provisional column, -1 when dropped
    blocks: list[sp.csr_matrix] = []
    starts = range(0, len(texts), batch)
    for start in (progress(starts) if progress else starts):
        flat: list[str] = []
        lengths: list[int] = []
        for text in texts[start:start + batch]:
            tokens = split(text)
            flat.extend(tokens)
            lengths.append(len(tokens))
        known = len(surface)
        numbers = np.fromiter(map(surface.__getitem__, flat), dtype=np.int64, count=len(flat))
        new = list(itertools.islice(surface, known, None))  # first seen in this batch, in order
        column_of.extend(-1 if term is None else term_ids.setdefault(term, len(term_ids))
                         for term in term_of(new))
        cols = np.asarray(column_of, dtype=np.int64)[numbers]
        rows = np.repeat(np.arange(len(lengths)), lengths)
        kept = cols >= 0
        blocks.append(sp.csr_matrix((np.ones(int(kept.sum()), np.int32), (rows[kept], cols[kept])),
                                    shape=(len(lengths), 0 if not kept.any() else int(cols.max()) + 1)))
    n_terms = len(term_ids)
    # provisional columns (first-seen order) -> sorted terms, so columns never depend on hashing
    # or on the order of the corpus
    terms = sorted(term_ids)
    rank = np.empty(n_terms, dtype=np.int64)
    rank[[term_ids[t] for t in terms]] = np.arange(n_terms)
    parts = []
    for m in blocks:
        m = sp.csr_matrix((m.data, rank[m.indices].astype(np.int32), m.indptr), shape=(m.shape[0], n_terms))
        m.sort_indices()
        parts.append(m)
    matrix = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, n_terms), dtype=np.int32)
    matrix.has_sorted_indices = True  # stacked rows of blocks with sorted indices
    return TermCounts(matrix.astype(np.int32, copy=False), tuple(terms))


def _idf(method: str) -> Callable[[int, int], float]:
    """bm25s's IDF per variant (Kamphuis et al., ECIR 2020), in Python floats as bm25s computes it."""
    if method == "robertson":
        return lambda df, n: math.log(max((n - df + 0.5) / (df + 0.5), 1))
    if method == "lucene":
        return lambda df, n: math.log(1 + (n - df + 0.5) / (df + 0.5))
    if method == "atire":
        return lambda df, n: math.log(n / df)
    raise ValueError(f"BM25 method {method!r} is not weighted from counts; use one of {COUNT_METHODS}.")


def _row_blocks(indptr: np.ndarray):
    """``(first row, end row, row of each entry, first entry, end entry)`` of consecutive row
    blocks holding about ``ENTRIES_PER_BLOCK`` entries each."""
    size = ENTRIES_PER_BLOCK
    n = len(indptr) - 1
    r0 = 0
    while r0 < n:
        r1 = max(r0 + 1, int(np.searchsorted(indptr, indptr[r0] + size, side="right")) - 1)
        r1 = min(r1, n)
        lo, hi = int(indptr[r0]), int(indptr[r1])
        yield r0, r1, np.repeat(np.arange(r0, r1), np.diff(indptr[r0:r1 + 1])), lo, hi
        r0 = r1


def bm25_weights(counts: TermCounts, method: str = "lucene", k1: float = 1.5,
                 b: float = 0.75) -> tuple[dict[str, Any], dict[str, int]]:
    """bm25s's score matrix and vocabulary for these counts.

    Returns ``(scores, vocab)`` as ``bm25s.BM25.index`` would set them: ``scores`` holds the CSC
    arrays of the (units x terms) weights (float32 ``data``, int32 unit ``indices`` ascending in
    each column, int64 ``indptr``) and ``num_docs``; ``vocab`` maps each term to its column, plus
    bm25s's empty-string token one past the last column. Terms that occur in no unit are dropped.
    """
    idf_of = _idf(method)
    m = counts.matrix
    n = m.shape[0]
    df = np.bincount(m.indices, minlength=m.shape[1])
    used = np.flatnonzero(df)
    terms = counts.terms
    if len(used) < m.shape[1]:  # e.g. grouped counts that leave some units out
        remap = np.full(m.shape[1], -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        m = sp.csr_matrix((m.data, remap[m.indices].astype(np.int32), m.indptr), shape=(n, len(used)))
        terms = tuple(terms[i] for i in used.tolist())
        df = df[used]
    doc_len = np.zeros(n, dtype=np.int64)
    for r0, r1, rows, lo, hi in _row_blocks(m.indptr):
        doc_len[r0:r1] = np.bincount(rows - r0, weights=m.data[lo:hi], minlength=r1 - r0).astype(np.int64)
    l_avg = doc_len.mean()  # bm25s: np.array([len(ids) for ids in corpus]).mean()
    idf = np.array([idf_of(d, n) for d in df.tolist()], dtype=np.float32)
    data = np.empty(m.nnz, dtype=np.float32)
    for _, _, rows, lo, hi in _row_blocks(m.indptr):  # in blocks: a few temporaries of ~4M values
        tf = m.data[lo:hi].astype(np.float32)
        l_d = doc_len[rows]
        # bm25s's term-frequency components, the same operations in the same order (float64 result)
        if method == "atire":
            tfc = (tf * (k1 + 1)) / (tf + k1 * (1 - b + b * l_d / l_avg))
        else:
            tfc = tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf)
        data[lo:hi] = idf[m.indices[lo:hi]] * tfc
    weights = sp.csr_matrix((data, m.indices, m.indptr), shape=m.shape).tocsc()
    del data
    weights.sort_indices()
    scores = {"data": weights.data.astype(np.float32, copy=False),
              "indices": weights.indices.astype(np.int32, copy=False),
              "indptr": weights.indptr.astype(np.int64), "num_docs": n}
    vocab = {t: i for i, t in enumerate(terms)}
    vocab.setdefault("", len(terms))
    return scores, vocab
