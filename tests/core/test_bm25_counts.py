"""The count-based BM25 build (funnel_core.bm25.counts) against bm25s's own ``BM25.index``.

The reference is bm25s itself: the same tokens (``BM25Index.tokenize``) indexed by
``bm25s.BM25.index``, its score matrix read column by column under its own vocabulary. Equality
is exact (the same float32 weights), so a wrong IDF variant, a length normalisation by the wrong
document length (before/after stopwords), a float32 instead of float64 step, a lost duplicate
count, a stopword or stem applied at the wrong place, or a cluster count that is not the sum of
its members' all fail here.
"""

from __future__ import annotations

from collections import Counter

import bm25s
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funnel_core.bm25 import BM25Index
from funnel_core.bm25.counts import BATCH, count_terms
from funnel_core.units import Unit

WORDS = ["apple", "apples", "banana", "the", "and", "running", "runs", "ran", "Über", "straße",
         "x", "dna", "DNA", "café", "naïve", "of", "protein", "proteins", "東京は日本", "42", "a1b2"]


def reference(index: BM25Index, texts: list[str]) -> dict[str, dict[int, np.float32]]:
    """term -> {document: weight} of bm25s.BM25.index over BM25Index.tokenize(texts)."""
    cfg = index.config
    r = bm25s.BM25(method=cfg["method"], k1=cfg["k1"], b=cfg["b"], backend="numpy")
    r.index(index.tokenize(texts), show_progress=False)
    return columns(r)


def columns(retriever) -> dict[str, dict[int, np.float32]]:
    s = retriever.scores
    out = {}
    for term, col in retriever.vocab_dict.items():
        if col >= len(s["indptr"]) - 1:
            continue  # bm25s's empty-string token has no column
        lo, hi = s["indptr"][col], s["indptr"][col + 1]
        out[term] = dict(zip(s["indices"][lo:hi].tolist(), s["data"][lo:hi].tolist()))
    return out


texts_strategy = st.lists(st.lists(st.sampled_from(WORDS), max_size=12).map(" ".join),
                          min_size=1, max_size=25)
configs = st.fixed_dictionaries({
    "method": st.sampled_from(["lucene", "robertson", "atire"]),
    "k1": st.sampled_from([0.9, 1.2, 1.5]),
    "b": st.sampled_from([0.0, 0.4, 0.75, 1.0]),
    "stemmer": st.sampled_from(["english", None]),
    "stopwords": st.sampled_from(["en", None]),
    "lower": st.booleans(),
    "cjk": st.sampled_from([None, "bigram"]),
})


@settings(max_examples=150, deadline=None)
@given(texts=texts_strategy, config=configs)
def test_counts_build_equals_bm25s(texts, config):
    index = BM25Index(**config)
    units = [Unit(id=str(i), text=t) for i, t in enumerate(texts)]
    if not any(index.tokenize(texts)):
        with pytest.raises(ValueError, match="indexable token"):
            index.index(units)
        return
    want = reference(index, texts)
    index.index(units)
    got = columns(index._retriever)
    assert got == want
    s = index._retriever.scores
    assert s["data"].dtype == np.float32 and s["indices"].dtype == np.int32 and s["indptr"].dtype == np.int64
    for term, col in index._retriever.vocab_dict.items():  # documents ascending in every column
        if term:
            lo, hi = s["indptr"][col], s["indptr"][col + 1]
            assert (np.diff(s["indices"][lo:hi]) > 0).all()


@settings(max_examples=60, deadline=None)
@given(texts=texts_strategy, data=st.data())
def test_grouped_counts_equal_counts_of_joined_texts(texts, data):
    """A cluster's counts summed from its members' = the counts of its joined text."""
    index = BM25Index(stemmer="english", stopwords="en")
    groups = data.draw(st.lists(st.lists(st.integers(0, len(texts) - 1), min_size=1, max_size=4),
                                min_size=1, max_size=6))
    joined = ["\n\n".join(texts[i] for i in g) for g in groups]
    direct = index.term_counts(joined)
    summed = index.term_counts(texts).grouped(groups)
    as_dict = [{t: int(c) for t, c in zip((direct.terms[j] for j in row.indices), row.data)}
               for row in direct.matrix]
    from_groups = [{summed.terms[j]: int(c) for j, c in zip(row.indices, row.data)} for row in summed.matrix]
    assert from_groups == as_dict


def test_index_counts_of_clusters_equals_index_of_joined_texts():
    texts = ["DNA repair protein", "the protein folds", "apples and bananas", "banana bread", "dna dna"]
    groups = [[0, 1, 4], [2, 3]]
    joined = [Unit(id=f"c{g}", text="\n\n".join(texts[i] for i in grp)) for g, grp in enumerate(groups)]
    direct = BM25Index().index(joined)
    from_counts = BM25Index().index_counts(joined, BM25Index().term_counts(texts).grouped(groups))
    assert columns(from_counts._retriever) == columns(direct._retriever)
    assert from_counts.search("dna protein", k=2)[0].id == direct.search("dna protein", k=2)[0].id


def test_batches_and_term_order_do_not_change_counts():
    """Several vocabulary merges (batch=3) give the batch-of-everything result; columns are the
    sorted terms, whatever order the corpus introduces them in."""
    texts = ["b a c", "c c d", "e a", "d b b", "f", "a f e"]
    one = count_terms(texts, str.split, list, batch=len(texts))
    many = count_terms(texts, str.split, list, batch=3)
    assert one.terms == many.terms == ("a", "b", "c", "d", "e", "f")
    assert (one.matrix != many.matrix).nnz == 0
    assert one.matrix.toarray().tolist()[3] == [0, 2, 0, 1, 0, 0]  # "d b b"
    assert BATCH > 1


def test_index_counts_checks_its_rows():
    index = BM25Index()
    counts = index.term_counts(["one text", "two texts"])
    with pytest.raises(ValueError, match="2 rows for 1 units"):
        index.index_counts([Unit(id="a", text="one text")], counts)


@pytest.mark.parametrize("method", ["bm25l", "bm25+"])
def test_non_occurrence_variants_still_built_by_bm25s(method):
    texts = ["protein folding", "protein repair dna", "apples"]
    index = BM25Index(method=method).index([Unit(id=str(i), text=t) for i, t in enumerate(texts)])
    assert index._retriever.nonoccurrence_array is not None
    assert columns(index._retriever) == reference(index, texts)


MIXED = st.text(alphabet=st.sampled_from(list("ab_Z09 .,;-'\"\t\n!?()[]{}$%é—’東ßİ") + ["\x00", "\x7f", "\ud800"]),
                max_size=40)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(MIXED, min_size=1, max_size=8), lower=st.booleans(),
       pattern=st.sampled_from([None, r"\w+", r"[^ ]+"]))
def test_term_counts_equal_counting_the_tokenizer(texts, lower, pattern):
    """term_counts (with its ASCII split for the default pattern) counts exactly the tokens
    ``tokenize`` yields: punctuation, digits, underscores, one-letter runs, control characters,
    lone surrogates, non-ASCII letters."""
    config = {"lower": lower, "stopwords": None, "stemmer": None}
    if pattern:
        config["token_pattern"] = pattern
    index = BM25Index(**config)
    counts = index.term_counts(texts)
    got = [{counts.terms[j]: int(c) for j, c in zip(row.indices, row.data)} for row in counts.matrix]
    want = [dict(Counter(toks)) for toks in index.tokenize(texts)]
    assert got == want


def test_weights_do_not_depend_on_the_block_size(monkeypatch):
    from funnel_core.bm25 import counts as bm25_counts

    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(i % 9 + 1)) for i in range(60)]
    counts = BM25Index().term_counts(texts)
    whole = bm25_counts.bm25_weights(counts)
    monkeypatch.setattr(bm25_counts, "ENTRIES_PER_BLOCK", 7)  # blocks of a row or two
    blocks = bm25_counts.bm25_weights(counts)
    assert whole[1] == blocks[1]
    for key in ("data", "indices", "indptr"):
        assert np.array_equal(whole[0][key], blocks[0][key])
