"""LangChain ``HybridRetriever`` over the vector stores users build themselves (FAISS, InMemory),
from Documents without ids (LangChain's default), on SQuAD questions with the packaged MiniLM.

* The dense side's score must be a relevance (higher is better) read through the store's own
  relevance path: FAISS's ``similarity_search_with_score`` gives L2 distances, and fusing those
  as similarities ranks the nearest documents last.
* BM25 numbers id-less documents "0", "1", ... while a vector store gives them uuids: the same
  document from both sides must still be fused into one.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from funnel_core.embeddings import SentenceEmbedder
from funnel_core.evaluation.datasets import load_squad
from funnel_core.evaluation.metrics import has_answer
from langchain_funnel.best_practices import HybridRetriever, SentenceEmbedderEmbeddings
from langchain_funnel.retrievers import BM25Retriever

pytestmark = pytest.mark.slow  # the packaged MiniLM embeds ~110 paragraphs and 120 questions

SQUAD = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad" / "squad-v1.1-dev-a.json"
N_QUESTIONS, K, CANDIDATES = 120, 4, 10


@pytest.fixture(scope="module")
def squad_sample():
    """120 seeded questions and, as the corpus, the paragraphs they were asked on (no ids)."""
    if not SQUAD.exists():
        pytest.skip(f"SQuAD dev file not found at {SQUAD}")
    questions = [(q, a) for a in load_squad(SQUAD) for q in a.questions]
    picked = random.Random(13).sample(questions, N_QUESTIONS)
    paragraphs = sorted({a.paragraphs[q.paragraph_index] for q, a in picked})
    docs = [Document(page_content=p, metadata={"source": "squad"}) for p in paragraphs]
    return [(q.question, q.answers) for q, _ in picked], docs


@pytest.fixture(scope="module")
def embeddings():
    return SentenceEmbedderEmbeddings(embedder=SentenceEmbedder())


def _hybrid(docs, store, k=K, **fusion):
    sparse = BM25Retriever.from_documents(docs, k=CANDIDATES)
    dense = store.as_retriever(search_kwargs={"k": CANDIDATES})
    return HybridRetriever(sparse=sparse, dense=dense, k=k, **fusion)


def _recall_and_duplicates(retriever, questions):
    hits = dup_lists = 0
    for question, answers in questions:
        docs = retriever.invoke(question)
        texts = [d.page_content for d in docs]
        dup_lists += len(set(texts)) != len(texts)
        hits += has_answer(" ".join(texts), answers)
    return hits / len(questions), dup_lists


def _faiss(docs, embeddings):
    pytest.importorskip("faiss")
    from langchain_community.vectorstores import FAISS

    return FAISS.from_documents(docs, embeddings)


@pytest.mark.filterwarnings("error:Relevance scores must be between")
def test_hybrid_over_faiss_matches_hybrid_over_in_memory(squad_sample, embeddings):
    questions, docs = squad_sample
    in_memory = InMemoryVectorStore.from_documents(docs, embeddings)
    faiss = _faiss(docs, embeddings)
    r_mem, dup_mem = _recall_and_duplicates(_hybrid(docs, in_memory), questions)
    r_faiss, dup_faiss = _recall_and_duplicates(_hybrid(docs, faiss), questions)
    assert r_mem >= 0.85, r_mem  # the in-memory hybrid is a sound reference
    assert abs(r_faiss - r_mem) <= 0.02, (r_faiss, r_mem)
    assert dup_mem == dup_faiss == 0


@pytest.mark.filterwarnings("error:Relevance scores must be between")
async def test_async_hybrid_over_faiss_matches_sync(squad_sample, embeddings):
    questions, docs = squad_sample
    retriever = _hybrid(docs, _faiss(docs, embeddings))
    for question, _ in questions[:10]:
        sync = [d.page_content for d in retriever.invoke(question)]
        assert [d.page_content for d in await retriever.ainvoke(question)] == sync


def test_score_threshold_search_keeps_its_threshold(squad_sample, embeddings):
    questions, docs = squad_sample
    store = _faiss(docs, embeddings)
    question = questions[0][0]
    relevances = [s for _, s in store._similarity_search_with_relevance_scores(question, k=CANDIDATES)]
    threshold = float(relevances[1] + relevances[2]) / 2  # keeps the two nearest
    dense = store.as_retriever(search_type="similarity_score_threshold",
                               search_kwargs={"k": CANDIDATES, "score_threshold": threshold})
    hybrid = HybridRetriever(sparse=BM25Retriever.from_documents(docs, k=CANDIDATES), dense=dense,
                             k=2 * CANDIDATES, alpha=0.0)
    got = hybrid.invoke(question)
    assert sum(d.metadata["funnel_dense_rank"] is not None for d in got) == 2


def test_documents_without_ids_fuse_into_one_result_each(squad_sample, embeddings):
    questions, docs = squad_sample
    assert all(d.id is None for d in docs)
    in_memory = InMemoryVectorStore.from_documents(docs, embeddings)
    retriever = _hybrid(docs, in_memory, k=6)
    for question, _ in questions[:40]:
        got = retriever.invoke(question)
        texts = [d.page_content for d in got]
        assert len(texts) == 6 and len(set(texts)) == 6, question
        # a document both sides found carries both sides' ranks
    both = [d for q, _ in questions[:40] for d in retriever.invoke(q)
            if d.metadata["funnel_sparse_rank"] is not None and d.metadata["funnel_dense_rank"] is not None]
    assert both
    # RRF fuses the same documents by identity too
    rrf = _hybrid(docs, in_memory, k=6, method="rrf")
    texts = [d.page_content for d in rrf.invoke(questions[0][0])]
    assert len(set(texts)) == len(texts) == 6


def test_the_dense_score_is_the_stores_relevance(squad_sample, embeddings):
    """FAISS's relevance (1 - L2/sqrt 2 over unit vectors) ranks as InMemory's cosine does."""
    questions, docs = squad_sample
    faiss = _faiss(docs, embeddings)
    retriever = _hybrid(docs, faiss, alpha=0.0)  # the dense side alone decides the order
    question = questions[0][0]
    got = retriever.invoke(question)
    nearest = [d.page_content for d, _ in faiss.similarity_search_with_relevance_scores(question, k=K)]
    assert [d.page_content for d in got] == nearest


class DistanceStore(InMemoryVectorStore):
    """A store whose ``similarity_search_with_score`` answers a distance (lower is nearer) and
    which defines no relevance function: nothing tells what its score means."""

    def similarity_search_with_score(self, query, k=4, **kwargs):
        return [(d, 1.0 - s) for d, s in super().similarity_search_with_score(query, k, **kwargs)]


def test_a_store_that_cannot_say_what_its_score_means_is_refused(squad_sample, embeddings):
    questions, docs = squad_sample
    store = DistanceStore.from_documents(docs[:20], embeddings)
    with pytest.raises(ValueError, match="DistanceStore.*relevance.*rrf"):
        _hybrid(docs[:20], store).invoke(questions[0][0])
    # ranks need no score: RRF works over it
    assert len(_hybrid(docs[:20], store, method="rrf").invoke(questions[0][0])) == K
