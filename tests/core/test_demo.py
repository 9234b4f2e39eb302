"""The offline demo's embedding cache: every document and passage embedded once, kept on disk,
and a question embeds only itself."""

from __future__ import annotations

import numpy as np
import pytest

from funnel_core.demo import build_demo_funnel, demo_vectors
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.rerank.embedding import EmbeddingScorer
from funnel_core.units import Unit

pytestmark = pytest.mark.models

DOCS = [
    Unit(id="csv.DictReader", text="csv.DictReader: Create an object that maps the information in each row "
         "to a dict whose keys are given by the optional fieldnames parameter. " * 3,
         metadata={"title": "csv.DictReader", "funnel_links": []}),
    Unit(id="hashlib.sha256", text="hashlib.sha256: Return a new SHA256 hash object; optionally "
         "initialized with a string.", metadata={"title": "hashlib.sha256", "funnel_links": []}),
    Unit(id="subprocess.run", text="subprocess.run: Run command with arguments and return a "
         "CompletedProcess instance; capture_output captures stdout and stderr.",
         metadata={"title": "subprocess.run", "funnel_links": []}),
]


class CountingEmbedder(SentenceEmbedder):
    """The real packaged MiniLM, counting the texts that reach the model."""

    def __init__(self) -> None:
        super().__init__(cache=None)
        self.embedded: list[str] = []

    def _run_model(self, texts, show_progress):  # type: ignore[no-untyped-def]
        self.embedded.extend(texts)
        return super()._run_model(texts, show_progress)


def test_demo_vectors_hold_every_document_and_passage_and_come_back_from_disk(tmp_path):
    chunker = LaterChunking(words=12)
    first = CountingEmbedder()
    index = demo_vectors(DOCS, chunker, first, tmp_path / "cache")
    expected = {d.text for d in DOCS} | {p.text for d in DOCS for p in chunker.split(d)}
    assert {u.text for u in index.units} == expected
    assert sorted(first.embedded) == sorted(expected)  # each distinct text once

    again = CountingEmbedder()
    loaded = demo_vectors(DOCS, chunker, again, tmp_path / "cache")
    assert again.embedded == []  # read from the persist folder, no model call
    np.testing.assert_array_equal(loaded._state.embeddings, index._state.embeddings)


def test_a_damaged_cache_is_rebuilt(tmp_path):
    chunker = LaterChunking(words=12)
    folder = tmp_path / "cache"
    demo_vectors(DOCS, chunker, CountingEmbedder(), folder)
    (folder / "CURRENT").write_text("garbage\n")
    emb = CountingEmbedder()
    with pytest.warns(UserWarning, match="rebuilding"):
        index = demo_vectors(DOCS, chunker, emb, folder)
    assert emb.embedded and len(index.units) == len(emb.embedded)


def test_a_question_embeds_only_itself_and_scores_equal_fresh_embeddings(tmp_path):
    _, funnel = build_demo_funnel(DOCS, k_clusters=3, cache_dir=tmp_path / "cache")
    rerankers = [s for s in funnel.stages if isinstance(s, EmbeddingScorer)]
    assert len(rerankers) == 2
    counting = CountingEmbedder()
    for r in rerankers:  # same model key: the stored rows are used, only the query is embedded
        r.embedder = counting
    res = funnel.search("capture the output of a shell command")
    assert counting.embedded == [("capture the output of a shell command")] * 2
    assert res.units and res.units[0].metadata["title"] == "subprocess.run"
    fresh = SentenceEmbedder(cache=None)
    q, *rows = fresh.encode(["capture the output of a shell command", *(u.text for u in res.units)])
    # bf16 (dtype="auto" on a CPU with native bf16): a row also depends on the batch it was
    # padded in, ~5e-4 here; a stale or wrong row is off by > 0.05
    atol = 1e-5 if fresh.active_dtype == "float32" else 3e-3
    np.testing.assert_allclose([u.score for u in res.units], [float(r @ q) for r in rows], atol=atol)
