"""Embedding cache: the real packaged MiniLM is loaded and its ``encode`` wrapped to
count how many texts really went through the model; cached rows are compared with an uncached
embedder (the reference)."""

import numpy as np
import pytest

from funnel_core import Unit
from funnel_core.cache import LRUCache
from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.rerank.embedding import EmbeddingScorer

TEXTS = ["The Eiffel tower is in Paris.", "BM25 ranks documents by term overlap.",
         "Cats sleep most of the day.", "A hash function maps data to fixed-size values."]


def counting(embedder):
    """Wrap the loaded model's encode: record the texts each real call embeds."""
    calls: list[list[str]] = []
    model = embedder.model
    real = model.encode

    def encode(texts, *args, **kwargs):
        calls.append(list(texts))
        return real(texts, *args, **kwargs)

    model.encode = encode
    return calls


@pytest.fixture
def reference(minilm_path):
    # float32: in bf16 a row also depends on the batch it was padded in (~1e-3), above atol
    return SentenceEmbedder(minilm_path, cache=False, dtype="float32")


def test_a_text_is_embedded_once_and_rows_equal_the_uncached_model(minilm_path, reference):
    emb = SentenceEmbedder(minilm_path, cache=LRUCache(100), dtype="float32")
    calls = counting(emb)
    first = emb.encode(TEXTS[:2] + TEXTS[:1])  # a repeat inside one call is embedded once
    assert calls == [TEXTS[:2]]
    second = emb.encode(TEXTS[1:])  # only the two new texts reach the model
    assert calls[1] == TEXTS[2:]
    again = emb.encode(TEXTS)
    assert len(calls) == 2 and emb.n_embedded == 4
    want = reference.encode(TEXTS)
    np.testing.assert_allclose(first, want[[0, 1, 0]], atol=1e-5)
    np.testing.assert_allclose(second, want[1:], atol=1e-5)
    np.testing.assert_allclose(again, want, atol=1e-5)


def test_cache_is_bounded_shared_by_model_and_safe_to_edit(minilm_path):
    cache = LRUCache(3)
    a = SentenceEmbedder(minilm_path, cache=cache)
    out = a.encode(TEXTS)
    assert len(cache) == 3  # least recently used dropped
    out[:] = 0.0  # the caller's array is its own
    b = SentenceEmbedder(minilm_path, cache=cache)  # same model: shares rows
    calls = counting(b)
    assert np.abs(b.encode(TEXTS[1:])).sum() > 0 and calls == []
    raw = SentenceEmbedder(minilm_path, cache=cache, normalize=False)  # another key
    calls_raw = counting(raw)
    raw.encode(TEXTS[1:2])
    assert calls_raw == [TEXTS[1:2]]


def test_uncached_embedder_calls_the_model_every_time(minilm_path):
    emb = SentenceEmbedder(minilm_path, cache=False)
    calls = counting(emb)
    emb.encode(TEXTS[:1])
    emb.encode(TEXTS[:1])
    assert len(calls) == 2
    with pytest.raises(TypeError, match="cache must be"):
        SentenceEmbedder(minilm_path, cache=3)


def test_reranker_reuses_the_dense_index_matrix(minilm_path, reference, tmp_path):
    units = [Unit(id=str(i), text=t) for i, t in enumerate(TEXTS)]
    DenseIndex(SentenceEmbedder(minilm_path, cache=False, dtype="float32")).index(units).save(tmp_path / "dense")
    index = DenseIndex.load(tmp_path / "dense", embedder=SentenceEmbedder(minilm_path, cache=LRUCache(10),
                                                                          dtype="float32"))
    rr = EmbeddingScorer(index=index)
    calls = counting(rr.embedder)
    extra = Unit(id="x", text="Paris is the capital of France.")
    got = rr.rank("where is the Eiffel tower", units[::-1] + [extra])
    assert calls == [["where is the Eiffel tower", extra.text]]  # stored units are not embedded
    ref = EmbeddingScorer(reference).rank("where is the Eiffel tower", units[::-1] + [extra])
    assert [u.id for u in got] == [u.id for u in ref]
    np.testing.assert_allclose([u.score for u in got], [u.score for u in ref], atol=1e-5)


def test_two_reranker_stages_embed_the_query_and_units_once(minilm_path):
    emb = SentenceEmbedder(minilm_path, cache=LRUCache(100))
    calls = counting(emb)
    units = [Unit(id=str(i), text=t) for i, t in enumerate(TEXTS)]
    first = EmbeddingScorer(emb, name="a").rank("hash of a file", units)
    EmbeddingScorer(emb, name="b").rank("hash of a file", first[:2])
    assert sum(len(c) for c in calls) == 1 + len(TEXTS)
