"""A LlamaIndex retriever (with a LlamaIndex node postprocessor), a LangChain retriever, a LangChain
runnable and a core Funnel with a cross-encoder, evaluated side by side in one call on a SQuAD file.

The reference for every system is computed through the framework's own API (``retrieve`` /
``postprocess_nodes`` / ``invoke``) and the answer check, not through the harness's conversion.
"""

from __future__ import annotations

import json

import pytest

from funnel_core.evaluation import evaluate, has_answer, load_dataset

pytest.importorskip("llama_index.core")
pytest.importorskip("langchain_core")

def _overlap(query: str, text: str) -> float:
    q = {w.strip("?.,").lower() for w in query.split()}
    return float(len(q & {w.strip("?.,").lower() for w in text.split()}))


def test_llamaindex_langchain_and_funnel_side_by_side(squad_file, tiny_cross_encoder_path):
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever as LCRetriever
    from langchain_core.runnables import RunnableLambda
    from llama_index.core.postprocessor import SimilarityPostprocessor
    from llama_index.core.retrievers import BaseRetriever as LIRetriever
    from llama_index.core.schema import NodeWithScore, TextNode

    from funnel_core.bm25 import BM25Index, BM25Retrieve
    from funnel_core.funnel import Funnel
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    ds = load_dataset(squad_file)
    assert ds.format == "squad" and len(ds.queries) == 6 and len(ds.corpus) == 6

    class OverlapRetriever(LIRetriever):  # a LlamaIndex retriever written the framework's way
        def __init__(self, nodes, k):
            super().__init__()
            self._nodes, self._k = nodes, k

        def _retrieve(self, query_bundle):
            scored = [NodeWithScore(node=n, score=_overlap(query_bundle.query_str, n.get_content()))
                      for n in self._nodes]
            return sorted(scored, key=lambda x: -x.score)[: self._k]

    class LCOverlap(LCRetriever):  # a LangChain retriever written the framework's way
        docs: list
        k: int = 2

        def _get_relevant_documents(self, query, *, run_manager):
            return sorted(self.docs, key=lambda d: -_overlap(query, d.page_content))[: self.k]

    nodes = [TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)) for u in ds.corpus]
    docs = [Document(id=u.id, page_content=u.text, metadata=dict(u.metadata)) for u in ds.corpus]
    li = OverlapRetriever(nodes, k=3)
    cutoff = SimilarityPostprocessor(similarity_cutoff=3.0)  # drops nodes sharing < 3 words
    lc = LCOverlap(docs=docs, k=2)
    runnable = RunnableLambda(lambda q: list(reversed(docs)))  # a runnable returning documents
    index = BM25Index().index(ds.corpus)
    funnel = Funnel([BM25Retrieve(index, k=4), CrossEncoderScorer(tiny_cross_encoder_path, batch_size=4) % 2])

    report = evaluate({"llamaindex": (li, [cutoff]), "langchain": lc, "runnable": runnable, "funnel": funnel},
                      ds, metrics=["AR@1", "AR@2", "CI@2"], n_timing=2, progress=False,
                      load_reader=lambda: 0.0, cores=2)
    d = report.to_dict()

    def ar(texts, qid, k):
        return float(has_answer(" ".join(texts[:k]), ds.answers[qid]))

    for qid, query in ds.queries.items():
        refs = {
            "llamaindex": [n.get_content() for n in cutoff.postprocess_nodes(li.retrieve(query), query_str=query)],
            "langchain": [x.page_content for x in lc.invoke(query)],
            "runnable": [x.page_content for x in runnable.invoke(query)],
            "funnel": [u.text for u in funnel(query)],
        }
        for name, texts in refs.items():
            rec = next(r for r in d["per_question"][name] if r["id"] == qid)
            assert rec["metrics"]["AR@1"] == ar(texts, qid, 1), (name, qid)
            assert rec["metrics"]["AR@2"] == ar(texts, qid, 2), (name, qid)
            assert rec["n_results"] == len(texts)
    # the postprocessor ran: it dropped low-overlap nodes for some questions
    assert any(r["n_results"] < 3 for r in d["per_question"]["llamaindex"])
    for name in ("llamaindex", "langchain", "runnable", "funnel"):
        s = d["summary"][name]["AR@2"]
        assert s["n"] == 6 and s["ci"][0] <= s["mean"] <= s["ci"][1]
        assert d["cost"][name]["timed_questions"] == 2 and d["cost"][name]["seconds_p50"] > 0
    # the reversed corpus starts with the two BM25 paragraphs: one article, so CI@2 = 0 bits
    assert d["summary"]["runnable"]["CI@2"]["mean"] == 0.0
    # the cross-encoder scored every BM25 candidate once per query; nothing else scored pairs
    bm25_hits = [len(index.search(q, k=4)) for q in ds.queries.values()]
    assert d["cost"]["funnel"]["pairs_scored_per_query"] == pytest.approx(sum(bm25_hits) / 6)
    assert d["cost"]["funnel"]["model_calls_per_query"] == 1.0
    assert all(d["cost"][n]["pairs_scored_per_query"] == 0 for n in ("llamaindex", "langchain", "runnable"))
    assert set(d["comparisons"]) == {"langchain", "runnable", "funnel"}  # against the first system
    assert report.systems == ["llamaindex", "langchain", "runnable", "funnel"]
    json.dumps(d)  # JSON-ready


_TOPICS = {
    "eiffel": "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "volcano": "A volcano is a rupture in the crust where lava, volcanic ash and gases escape.",
    "penguin": "Penguins are flightless aquatic birds living almost exclusively in the Southern Hemisphere.",
    "violin": "The violin is a wooden string instrument played with a bow across its four strings.",
    "glacier": "A glacier is a persistent body of dense ice that is constantly moving under its own weight.",
    "coffee": "Coffee is a beverage brewed from roasted coffee beans, the seeds of Coffea berries.",
    "saturn": "Saturn is the sixth planet from the Sun, a gas giant famous for its bright rings.",
    "chess": "Chess is a board game for two players in which each controls sixteen pieces on a checkered board.",
}


def _judged_dataset():
    """Documents of about 80 words (their topic sentence, then filler shared by all), one
    relevant document per question, judged by qrels only (no answers)."""
    from funnel_core import Unit
    from funnel_core.evaluation import EvalDataset

    filler = ("It is described in many books and articles and discussed by people all over the "
              "world for a long time and in many languages. ") * 3
    corpus = [Unit(id=f"doc-{name}", text=f"{text} {filler}{text}", metadata={"doc_id": f"doc-{name}"},
                   level="document") for name, text in _TOPICS.items()]
    queries = {f"q-{name}": " ".join(text.split()[1:6]) for name, text in _TOPICS.items()}
    qrels = {f"q-{name}": {f"doc-{name}": 1} for name in _TOPICS}
    return EvalDataset(queries=queries, qrels=qrels, corpus=corpus, name="topics")


def test_framework_passages_without_doc_id_count_for_their_document():
    """A LlamaIndex retriever over plain TextNode(id_, text) nodes (no doc_id key) followed by our
    LaterChunkingPostprocessor returns passages with new ids; the harness must judge each under
    the document it was cut from (funnel_parent_id) and score what the core funnel scores."""
    from llama_index.core.schema import TextNode

    from funnel_core.bm25 import BM25Index, BM25Retrieve
    from funnel_core.funnel import Funnel
    from funnel_core.funnelrag.chunking import LaterChunking
    from llama_index_funnel.rerank import LaterChunkingPostprocessor
    from llama_index_funnel.retrievers import BM25Retriever

    ds = _judged_dataset()
    nodes = [TextNode(id_=u.id, text=u.text) for u in ds.corpus]
    li = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=5)
    chunk = LaterChunkingPostprocessor(words=20)
    core = Funnel([BM25Retrieve(BM25Index().index(ds.corpus), k=5), LaterChunking(20)])
    sample = chunk.postprocess_nodes(li.retrieve(ds.queries["q-eiffel"]), query_str=ds.queries["q-eiffel"])
    assert all("doc_id" not in n.node.metadata and n.node.node_id not in {u.id for u in ds.corpus}
               for n in sample)  # passages: new ids, no doc_id key
    report = evaluate({"core": core, "llamaindex": (li, [chunk])}, ds, metrics=["ndcg@10", "mrr"],
                      n_timing=0, progress=False)
    d = report.to_dict()
    assert d["summary"]["core"]["ndcg@10"]["mean"] > 0.9
    for m in ("ndcg@10", "mrr"):
        assert d["summary"]["llamaindex"][m]["mean"] == pytest.approx(d["summary"]["core"][m]["mean"])
    for rec in d["per_question"]["llamaindex"]:  # judged under the documents' ids, each once
        assert rec["ranked"] and set(rec["ranked"]) <= {u.id for u in ds.corpus}
        assert len(rec["ranked"]) == len(set(rec["ranked"]))


def test_a_framework_reranker_is_counted_and_unknown_costs_are_named(tiny_cross_encoder_path):
    """LlamaIndex's own SentenceTransformerRerank scores every candidate it receives in one
    batch: the harness counts those pairs and that call (as our cross-encoder counts its own),
    instead of reporting the reranker as free; a framework object whose work nobody counts is
    named, and the table marks its counts as a lower bound."""
    from llama_index.core.postprocessor import SentenceTransformerRerank, SimilarityPostprocessor
    from llama_index.core.retrievers import BaseRetriever as LIRetriever
    from llama_index.core.schema import NodeWithScore, TextNode

    from funnel_core.bm25 import BM25Index, BM25Retrieve
    from funnel_core.funnel import Funnel
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from llama_index_funnel.retrievers import BM25Retriever

    ds = _judged_dataset()
    nodes = [TextNode(id_=u.id, text=u.text) for u in ds.corpus]
    li = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=4)
    rerank = SentenceTransformerRerank(model=tiny_cross_encoder_path, top_n=2, device="cpu")

    class AllNodes(LIRetriever):  # a framework retriever of the user's: its work is not counted
        def _retrieve(self, query_bundle):
            return [NodeWithScore(node=n, score=1.0) for n in nodes]

    core = Funnel([BM25Retrieve(BM25Index().index(ds.corpus), k=4),
                   CrossEncoderScorer(tiny_cross_encoder_path) % 2])
    report = evaluate({"core": core, "li_rerank": (li, [rerank]),
                       "framework": (AllNodes(), [SimilarityPostprocessor(similarity_cutoff=0.5)])},
                      ds, metrics=["ndcg@10"], n_timing=0, progress=False)
    cost = report.to_dict()["cost"]
    candidates = sum(len(li.retrieve(q)) for q in ds.queries.values()) / len(ds.queries)
    assert candidates > 0
    assert cost["li_rerank"]["pairs_scored_per_query"] == pytest.approx(candidates)
    assert cost["li_rerank"]["model_calls_per_query"] == 1.0
    assert cost["li_rerank"]["pairs_scored_per_query"] == cost["core"]["pairs_scored_per_query"]
    assert cost["li_rerank"]["uncounted"] == [] and cost["core"]["uncounted"] == []
    assert cost["framework"]["uncounted"] == ["AllNodes", "SimilarityPostprocessor"]
    table = report.to_markdown()
    row = next(line for line in table.splitlines() if line.startswith("| framework "))
    assert "0.0 + ?" in row and "| li_rerank " in table and "cost unknown, for framework" in table
