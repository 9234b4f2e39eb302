"""HyDE (Gao et al., "Precise Zero-Shot Dense Retrieval without Relevance Labels") as a core
stage: the vector is ``v = 1/(N+1) [f(q) + sum_k f(d_k)]`` (the HyDE paper's equation), worked by
hand below over a bag-of-words embedder whose vectors are the word counts, so the similarities are
small fractions one can check on paper. A wrong implementation (the query left out, only the first
hypothetical document, a sum instead of a mean, N instead of N + 1) gives other numbers."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from funnel_core.best_practices import HybridRetrieve, HyDE, HyDERetrieve, Repack
from funnel_core.best_practices.fusion import alpha_fusion
from funnel_core.best_practices.hyde import DEFAULT_HYDE_PROMPT, hyde_vector
from funnel_core.bm25 import BM25Index, BM25Retrieve
from funnel_core.embeddings import DenseIndex
from funnel_core.funnel import Funnel
from funnel_core.llm import TransformersLLM
from funnel_core.testing import ScriptedLLM
from funnel_core.units import Unit

VOCAB = ("paris", "berlin", "hamlet", "bm25")


class CountEmbedder:
    """A real (if tiny) embedding model: the counts of four words. ``f("paris paris") = [2,0,0,0]``."""

    model_name_or_path = "word-counts"

    def __init__(self, vocab=VOCAB):
        self.vocab = list(vocab)
        self.calls: list[list[str]] = []

    def encode(self, texts, show_progress=False):
        self.calls.append(list(texts))
        rows = []
        for t in texts:
            words = re.findall(r"\w+", t.lower())
            rows.append([float(words.count(w)) for w in self.vocab])
        return np.asarray(rows, dtype=np.float32).reshape(len(rows), len(self.vocab))


class HashEmbedder(CountEmbedder):
    """Every word counts: hashed into 16 buckets (for text a random tiny LLM writes)."""

    def encode(self, texts, show_progress=False):
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\S+", t.lower()):
                out[i, sum(w.encode()) % 16] += 1.0
        return out


CORPUS = [Unit(id="u1", text="paris paris paris"), Unit(id="u2", text="berlin"),
          Unit(id="u3", text="hamlet"), Unit(id="u4", text="bm25")]


@pytest.fixture
def dense():
    return DenseIndex(CountEmbedder(), index="exact").index(CORPUS)


def scores(units):
    return {u.id: u.score for u in units}


# -- the equation, by hand ------------------------------------------------------------------------
def test_vector_is_the_mean_of_the_query_and_every_hypothetical_document(dense):
    # q = "paris" -> f(q) = [1,0,0,0]; d1 = "berlin" -> [0,1,0,0]; d2 = "hamlet hamlet" -> [0,0,2,0]
    # v = 1/3 ([1,0,0,0] + [0,1,0,0] + [0,0,2,0]) = [1/3, 1/3, 2/3, 0]
    llm = ScriptedLLM(["berlin", "hamlet hamlet"])
    stage = HyDERetrieve(dense, HyDE(llm, n=2, temperature=0.7), k=4)
    np.testing.assert_allclose(stage.vector("paris"), [1 / 3, 1 / 3, 2 / 3, 0], rtol=1e-6)
    out = stage("paris")
    # v . f(u): u1 = [3,0,0,0] -> 1, u3 = [0,0,1,0] -> 2/3, u2 -> 1/3, u4 -> 0
    assert [u.id for u in out] == ["u1", "u3", "u2", "u4"]
    assert scores(out) == pytest.approx({"u1": 1.0, "u3": 2 / 3, "u2": 1 / 3, "u4": 0.0})
    # what a wrong implementation gives instead, from the same documents:
    #   query left out   v = [0, 1/2, 1, 0]  -> u1 would score 0
    #   first doc only   v = [1/2, 1/2, 0, 0] -> u3 would score 0
    #   sum, not mean    u1 would score 3;   N, not N + 1: u1 would score 1.5
    assert out[0].funnel["hyde_documents"] == 2
    assert out[0].scores == {"hyde": pytest.approx(1.0)}  # the stage's name, not the index's "dense"
    assert type(out[0].score) is float
    # one generation call, with the HyDE paper's web-search prompt around the query
    assert len(llm.calls) == 1 and llm.calls[0]["n"] == 2
    assert llm.calls[0]["prompts"] == ["Please write a passage to answer the question\nQuestion: paris\nPassage:"]


def test_without_the_query_the_vector_is_the_mean_of_the_documents(dense):
    stage = HyDERetrieve(dense, HyDE(ScriptedLLM(["berlin", "hamlet hamlet"]), n=2, temperature=0.7,
                                     include_query=False), k=4)
    # v = 1/2 ([0,1,0,0] + [0,0,2,0]) = [0, 1/2, 1, 0]
    assert scores(stage("paris")) == pytest.approx({"u3": 1.0, "u2": 0.5, "u1": 0.0, "u4": 0.0})


def test_n_one_is_the_best_practices_setting_one_document_and_the_query(dense):
    # Best Practices' "HyDE w/ 1 pseudo-doc + query": v = 1/2 (f(q) + f(d))
    stage = HyDERetrieve(dense, HyDE(ScriptedLLM("berlin berlin")), k=2)
    # v = 1/2 ([1,0,0,0] + [0,2,0,0]) = [1/2, 1, 0, 0]: u1 = 3/2, u2 = 1
    assert scores(stage("paris")) == pytest.approx({"u1": 1.5, "u2": 1.0})


def test_hyde_vector_function_by_hand():
    np.testing.assert_allclose(hyde_vector([1, 0], [[0, 1], [0, 3]]), [1 / 3, 4 / 3])
    np.testing.assert_allclose(hyde_vector([1, 0], [[0, 1], [0, 3]], include_query=False), [0, 2])
    np.testing.assert_allclose(hyde_vector([1, 0], np.zeros((0, 2))), [1, 0])  # no document: f(q)
    with pytest.raises(ValueError, match=r"shape \(1, 3\); expected \(N, 2\)"):
        hyde_vector([1, 0], [[1, 2, 3]])


def test_empty_documents_are_left_out_of_the_mean(dense):
    stage = HyDERetrieve(dense, HyDE(ScriptedLLM(["  ", "berlin"]), n=2, temperature=0.7), k=2)
    # N = 1 (the blank one does not count): v = 1/2 ([1,0,0,0] + [0,1,0,0])
    out = stage("paris")
    assert scores(out) == pytest.approx({"u1": 1.5, "u2": 0.5})
    assert out[0].funnel["hyde_documents"] == 1
    blank = HyDERetrieve(dense, HyDE(ScriptedLLM(""), include_query=False), k=2)
    with pytest.raises(ValueError, match="no hypothetical document .* include_query=False"):
        blank("paris")


# -- hybrid with HyDE ---------------------------------------------------------------------------------
def test_hybrid_with_hyde_fuses_bm25_over_the_query_with_dense_over_the_hyde_vector(dense):
    bm25 = BM25Index().index(CORPUS)
    llm = ScriptedLLM("hamlet")  # the hypothetical document mentions a word the query does not
    hyde = HyDE(llm)
    hybrid = HybridRetrieve(BM25Retrieve(bm25, k=4), HyDERetrieve(dense, hyde, k=4), alpha=0.3)
    out = hybrid("paris")
    # reference: the paper's S_h = 0.3 S_sparse + S_dense over BM25 of the *query* and the dense
    # side scored by hand with v = 1/2 ([1,0,0,0] + [0,0,1,0]) = [1/2, 0, 1/2, 0]
    dense_by_hand = [Unit(id="u1", text="", score=1.5), Unit(id="u3", text="", score=0.5),
                     Unit(id="u2", text="", score=0.0), Unit(id="u4", text="", score=0.0)]
    expected = alpha_fusion(bm25.search("paris", k=4), dense_by_hand, alpha=0.3)
    assert scores(out) == pytest.approx(scores(expected))
    assert out[0].id == "u1" and out[1].id == "u3"  # u3 only through the hypothetical document
    # BM25 saw the query only: "hamlet" is in no BM25 score
    assert "score_bm25" not in next(u for u in out if u.id == "u3").funnel
    assert llm.calls[0]["prompts"] == [DEFAULT_HYDE_PROMPT.format(question="paris")]


def test_a_dense_stage_and_a_hybrid_sharing_one_hyde_write_once_per_query(dense):
    llm = ScriptedLLM("berlin")
    hyde = HyDE(llm)
    bm25 = BM25Index().index(CORPUS)
    alone = HyDERetrieve(dense, hyde, k=2)
    hybrid = HybridRetrieve(BM25Retrieve(bm25, k=2), HyDERetrieve(dense, hyde, k=2))
    alone("paris")
    hybrid("paris")
    alone("berlin")
    assert [c["prompts"][0].split("\n")[1] for c in llm.calls] == ["Question: paris", "Question: berlin"]
    hyde.cache_size = 0  # no cache: every call writes
    alone("paris")
    assert len(llm.calls) == 3


def test_it_composes_in_a_funnel_with_a_cutoff_and_a_trace(dense):
    funnel = HyDERetrieve(dense, HyDE(ScriptedLLM("hamlet")), k=4) % 2 >> Repack("forward")
    assert isinstance(funnel, Funnel)
    res = funnel.search("paris")
    assert [u.id for u in res.units] == ["u1", "u3"]
    assert [(s.name, s.units_out) for s in res.trace.stages] == [("hyde % 2", 2), ("repack", 2)]
    assert asyncio.run(funnel.asearch("paris")).units[0].id == "u1"
    assert HyDERetrieve(dense, HyDE(ScriptedLLM("x")))("   ") == []


def test_async_run_writes_with_agenerate_and_gives_the_same_result(dense):
    stage = HyDERetrieve(dense, HyDE(ScriptedLLM(["berlin", "hamlet hamlet"]), n=2, temperature=0.7,
                                     cache_size=0), k=4)
    assert scores(asyncio.run(stage.acall("paris"))) == pytest.approx(scores(stage("paris")))


# -- settings ---------------------------------------------------------------------------------------------
def test_settings_are_checked_and_edits_are_used():
    llm = ScriptedLLM("d")
    with pytest.raises(ValueError, match="temperature=0 .* copies of one document"):
        HyDE(llm, n=4)
    with pytest.raises(ValueError, match=r"placeholders \{question\}"):
        HyDE(llm, prompt="Write a passage about {query}")
    with pytest.raises(ValueError, match="n \\(hypothetical documents per query\\) must be >= 1"):
        HyDE(llm, n=0)
    with pytest.raises(TypeError, match="unknown argument"):
        HyDE(llm, num_docs=2)
    hyde = HyDE(llm, prompt="Q: {question}\nA passage:")
    hyde.documents("who?")
    assert llm.calls[-1]["prompts"] == ["Q: who?\nA passage:"]
    with pytest.raises(ValueError, match="copies of one document"):
        hyde.n = 3  # validated by the constructor: greedy with n = 3
    assert hyde.n == 1
    data = hyde.to_dict()
    assert data["llm"] is None and data["prompt"] == "Q: {question}\nA passage:"
    again = HyDE.from_dict(data, llm=llm)
    assert again.settings() == {**hyde.settings(), "llm": llm}
    with pytest.raises(TypeError, match="index must be a DenseIndex"):
        HyDERetrieve(object(), hyde)


def test_an_llm_edit_forgets_the_remembered_documents(dense):
    hyde = HyDE(ScriptedLLM("berlin"))
    stage = HyDERetrieve(dense, hyde, k=1)
    assert stage("paris")[0].id == "u1"
    assert hyde.documents("paris") == ["berlin"]
    hyde.llm = ScriptedLLM("hamlet hamlet hamlet hamlet")
    assert hyde.documents("paris") == ["hamlet hamlet hamlet hamlet"]
    assert stage("paris")[0].id == "u3"  # v = [1/2, 0, 2, 0]: u3 = 2 > u1 = 3/2


# -- a real provider -------------------------------------------------------------------------------------
@pytest.mark.models
def test_with_a_local_causal_lm_the_scores_follow_the_equation(tiny_llama_path):
    """Whatever the (random, tiny) Llama writes, greedily: the scores are ``f(u) . v`` with ``v``
    the mean of the query's and that document's embeddings, computed here from the formula."""
    units = [Unit(id=f"p{i}", text=t) for i, t in enumerate(
        ["the capital of france", "a tragedy by shakespeare", "bm25 ranks documents", "the lazy dog"])]
    emb = HashEmbedder()
    index = DenseIndex(emb, index="exact").index(units)
    llm = TransformersLLM(tiny_llama_path, device="cpu", dtype="float32")
    stage = HyDERetrieve(index, HyDE(llm, max_new_tokens=12), k=4)
    out = stage("who wrote hamlet?")
    doc = llm.generate([DEFAULT_HYDE_PROMPT.format(question="who wrote hamlet?")], max_new_tokens=12)[0][0].strip()
    assert stage.documents("who wrote hamlet?") == [doc]
    v = (emb.encode(["who wrote hamlet?"])[0] + (emb.encode([doc])[0] if doc else 0)) / (2 if doc else 1)
    by_hand = {u.id: float(emb.encode([u.text])[0] @ v) for u in units}
    assert scores(out) == pytest.approx(by_hand, abs=1e-5)


# -- the documentation -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_docs_snippet_runs_with_the_packaged_smollm2_and_minilm(capsys):
    """docs/best_practices.md's HyDE snippet, executed as written (the packaged SmolLM2 and MiniLM)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "best_practices.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "HyDERetrieve(dense, hyde" in b)
    exec(compile(block, "docs/best_practices.md (HyDE snippet)", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[") and len(lines) == 4  # the document, then d1..d3 fused
    assert {line.split()[0] for line in lines[1:]} == {"d1", "d2", "d3"}
