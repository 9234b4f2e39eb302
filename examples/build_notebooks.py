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
rerank = CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", backend="flagembedding", top_n=4)
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
    similarity_top_k=2,   # clusters to open
    max_tokens=1024,      # cluster size S (the paper uses ~4K tokens over Wikipedia)
    max_documents=20,     # cap on the documents handed to the reranker
)
clusters = retriever.index.clusters
print(f"{len(nodes)} documents -> {len(clusters)} clusters; sizes (tokens):",
      sorted(c.metadata["n_tokens"] for c in clusters))

q = questions[0]
print("Q:", q.question, "| gold:", q.answers)
retrieved = retriever.retrieve(q.question)
show_table([{"rank": i, "node": n.node.node_id, "cluster": n.node.metadata["cluster_id"],
             "cluster_score": n.node.metadata["cluster_score"], "has_answer": has_answer(n.node.get_content(), q.answers)}
            for i, n in enumerate(retrieved[:8], 1)])
print(f"... {len(retrieved)} documents from {retriever.similarity_top_k} clusters")"""),
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
rerank = CrossEncoderRerank(model=ce_path, backend="transformers", top_n=4, max_length=256)
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
                 "bm25_cluster_score": n.node.metadata["cluster_score"],
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
is not needed: `funnel_core.embeddings.EmbeddingReranker` is a funnel stage).

**With a hub:** `CrossEncoderReranker(model="BAAI/bge-reranker-v2-m3", backend="flagembedding")`
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
pre_ranker = CrossEncoderReranker(model=ce_path, backend="transformers", top_n=6, max_length=256)
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
show_table([{"rank": i, "id": d.id, "score": d.metadata["score"],
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
from funnel_core.embeddings import EmbeddingReranker, SentenceEmbedder

post_ranker = EmbeddingReranker(SentenceEmbedder(), name="minilm_post_ranker")  # packaged MiniLM
funnel = FunnelRetriever.from_stages(retriever, pre_ranker, LaterChunking(words=40), post_ranker % 3, k=3)
documents, trace = funnel.search(q.question, answers=q.answers)
print(trace.format())
show_table([{"rank": i, "id": d.id, "score": d.metadata["score"],
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


def build(names: list[str]) -> None:
    for name, cells in NOTEBOOKS.items():
        if names and name not in names:
            continue
        nb = new_notebook(cells=[new_markdown_cell(s) if kind == "md" else new_code_cell(s)
                                 for kind, s in cells])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print("wrote", HERE / f"{name}.ipynb")


if __name__ == "__main__":
    build(sys.argv[1:])
