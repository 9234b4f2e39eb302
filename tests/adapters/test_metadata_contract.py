"""The metadata contract of both adapter packages (docs/frameworks.md, "The metadata contract").

Every public retriever, node postprocessor / document compressor, node parser / splitter and
query transform / document transformer of ``llama_index_funnel`` and ``langchain_funnel`` runs
here on documents whose user metadata holds every key name the core used for its bookkeeping
before its keys moved under ``funnel_`` names (the old ``funnel_core.units.INTERNAL_KEYS``), plus ``funnel`` (the old nested
namespace) and ``relevance_score``. The classes are enumerated from the packages' ``__all__``: a
new public class fails :func:`test_every_public_component_is_covered` until it is added here.

The rules (each a LlamaIndex / LangChain convention or what flat-metadata vector stores need):

1. every key we write is ``funnel_...`` (LangChain: also ``relevance_score``) with a scalar value
   (str, int, float, bool, None): nothing nested;
2. the user's keys are never overwritten, moved or deleted (LangChain's ``relevance_score`` is
   the one shared key every LangChain reranker rewrites);
3. LangChain retrievers and compressors set a float ``relevance_score``, non-increasing in the
   returned order; LlamaIndex uses ``NodeWithScore.score``;
4. LlamaIndex: our keys are excluded from the LLM and the embedding text;
5. no per-stage trace is copied onto a node or document;
6. LlamaIndex ``node_to_metadata_dict(node, flat_metadata=True)`` (what Chroma and other vector
   store integrations call) accepts the node and keeps every key; LangChain
   ``filter_complex_metadata`` keeps every key.

Wrong implementations each rule catches: the old nested ``metadata["funnel"]`` dict (rules 1, 6),
the old ``INTERNAL_KEYS`` split that moved a user's ``score``/``level``/``position`` under our
namespace or overwrote it (rule 2), the score nested at ``metadata["funnel"]["score"]`` (rule 3),
``metadata["funnel_trace"]`` on every document (rule 5), lists of ids written as lists (rule 6).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer, Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.retrievers import BaseRetriever as LCBaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import Document as LIDocument
from llama_index.core import VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever as LIBaseRetriever
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser.interface import NodeParser
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.retrievers import TransformRetriever
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, TextNode
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

import langchain_funnel as lc
import llama_index_funnel as li
from tests.conftest import CORPUS

#: funnel_core.units.INTERNAL_KEYS as it was (the names the adapters used to move
#: or overwrite), plus the old namespace key and LangChain's score key.
OLD_INTERNAL_KEYS = (
    "scores", "score", "level", "parent_id", "funnel_trace", "bm25_rank", "cluster_id",
    "cluster_score", "cluster_rank", "document_score", "parent_score", "parent_level", "position",
    "members", "router_weights", "chosen_level", "finest_id", "forward_scores",
    "backward_scores", "samples", "fb_rag_order", "retrieval_rank", "repack_position",
    "graph_neighbors", "graph_weights", "granularity", "child_ids", "doc_index", "fid_answer",
    "compression",
)
#: ``funnel_trace`` is left out: ``funnel_...`` is the one reserved prefix (docs/frameworks.md).
USER = {name: f"user-{name}" for name in (*OLD_INTERNAL_KEYS, "funnel", "relevance_score")
        if not name.startswith("funnel_")}
QUERY = "Who wrote the tragedy Hamlet, and is Paris the capital of France?"
SCALARS = (str, int, float, bool, type(None))
MARLOWE = ("Rationale: Hamlet is a tragedy written by William Shakespeare around 1600. "
           "Answer: William Shakespeare")


@dataclass
class Models:
    cross_encoder: str
    t5: str
    llama: str


@pytest.fixture(scope="module")
def models(tiny_cross_encoder_path, tiny_t5_path, tiny_llama_path) -> Models:
    return Models(tiny_cross_encoder_path, tiny_t5_path, tiny_llama_path)


# -- inputs ------------------------------------------------------------------------------------
def li_nodes() -> list[TextNode]:
    return [TextNode(id_=i, text=t, metadata={**USER, **m}) for i, t, m in CORPUS]


def li_documents() -> list[LIDocument]:
    return [LIDocument(id_=i, text=t, metadata={**USER, **m}) for i, t, m in CORPUS]


def lc_documents() -> list[Document]:
    return [Document(id=i, page_content=t, metadata={**USER, **m}) for i, t, m in CORPUS]


def li_bm25(k: int = 6) -> Any:
    return li.BM25Retriever.from_defaults(nodes=li_nodes(), similarity_top_k=k)


def lc_bm25(k: int = 6) -> Any:
    return lc.BM25Retriever.from_documents(lc_documents(), k=k)


def _embedder(models: Models) -> Any:
    """A tiny BERT loaded as a sentence embedder (what a dense retriever embeds with here)."""
    from funnel_core.embeddings import SentenceEmbedder

    return SentenceEmbedder(models.cross_encoder, device="cpu")


def _classifier(models: Models) -> Any:
    from funnel_core.best_practices.classify import QueryClassifier
    from funnel_core.embeddings import SentenceEmbedder

    clf = QueryClassifier(embedder=SentenceEmbedder(models.cross_encoder, device="cpu"))
    clf.fit(["Who wrote Hamlet?", "What is the capital of France?",
             "Translate 'hello' into French.", "What is 2 + 2?"],
            ["retrieval", "retrieval", "sufficient", "sufficient"])
    clf.threshold = 0.0  # always retrieve: the gate's output is what is checked here
    return clf


# -- what each public class is run as ---------------------------------------------------------
# kind: "retriever" / "postprocessor" (LlamaIndex) or "compressor" (LangChain) / "parser" /
# "transform". A builder returns a callable that produces the framework objects to check.
Runner = Callable[[], list]

LI_BUILDERS: dict[str, tuple[str, Callable[[Models], Runner]]] = {
    "BM25Retriever": ("retriever", lambda m: lambda: li_bm25().retrieve(QUERY)),
    "ClusteredBM25Retriever": ("retriever", lambda m: _li_clustered),
    "DenseRetriever": ("retriever", lambda m: lambda: li.DenseRetriever.from_defaults(
        li_nodes(), _embedder(m), similarity_top_k=4).retrieve(QUERY)),
    "HybridRetriever": ("retriever", lambda m: lambda: li.HybridRetriever(
        li_bm25(), VectorStoreIndex(li_nodes(), embed_model=MockEmbedding(embed_dim=8))
        .as_retriever(similarity_top_k=4), similarity_top_k=4).retrieve(QUERY)),
    "QueryClassifierGate": ("retriever", lambda m: lambda: li.QueryClassifierGate(
        li_bm25(), _classifier(m)).retrieve(QUERY)),
    "MixOfGranularityRetriever": ("retriever", lambda m: lambda: li.MixOfGranularityRetriever(
        li.MultiGranularityNodeParser(chunk_size=8, n_gra=2).get_nodes_from_documents(li_documents()),
        similarity_top_k=3).retrieve(QUERY)),
    "FunnelRetriever": ("retriever", lambda m: lambda: li.FunnelRetriever([
        li_bm25(), li.CrossEncoderRerank(model=m.cross_encoder, top_n=3, device="cpu"),
        li.LaterChunkingPostprocessor(words=6)]).retrieve(QUERY)),
    "ForwardLookupRetriever": ("retriever", lambda m: lambda: li.ForwardLookupRetriever(
        MockLLM(), retriever=li_bm25(), variant="FB", k=3, samples=2).retrieve(QUERY)),
    "CrossEncoderRerank": ("postprocessor", lambda m: li.CrossEncoderRerank(
        model=m.cross_encoder, top_n=3, device="cpu")),
    "MonoT5Rerank": ("postprocessor", lambda m: li.MonoT5Rerank(
        model=m.t5, top_n=3, device="cpu", max_length=64)),
    "FiDAttentionRerank": ("postprocessor", lambda m: li.FiDAttentionRerank(
        model=m.t5, top_n=3, return_answer=True)),
    "AttentionLMRerank": ("postprocessor", lambda m: li.AttentionLMRerank(model=m.llama, top_n=3)),
    "RankRAGRerank": ("postprocessor", lambda m: li.RankRAGRerank(llm=MockLLM(), top_n=3)),
    "LaterChunkingPostprocessor": ("postprocessor", lambda m: li.LaterChunkingPostprocessor(words=6)),
    "ExtractiveCompressorPostprocessor": ("postprocessor", lambda m: li.ExtractiveCompressorPostprocessor(
        method="bm25", ratio=0.5)),
    "RepackPostprocessor": ("postprocessor", lambda m: li.RepackPostprocessor()),
    "MultiGranularityNodeParser": ("parser", lambda m: li.MultiGranularityNodeParser(chunk_size=8, n_gra=3)),
    "GraphGranularityNodeParser": ("parser", lambda m: li.GraphGranularityNodeParser(
        sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2)),
    "ForwardLookupQueryTransform": ("transform", lambda m: lambda: TransformRetriever(
        li_bm25(), li.ForwardLookupQueryTransform(MockLLM(), samples=2)).retrieve(QUERY)),
}

#: Public LlamaIndex names that emit no nodes of their own (with the reason).
LI_NOT_COMPONENTS = {
    "StagePostprocessor": "abstract base of the postprocessors above",
    "UnitRetriever": "abstract base of the retrievers above",
    "QueryClassifierQueryEngine": "a query engine: its source nodes are the wrapped engine's",
    "HyDETransform": "a query transform that returns a QueryBundle (the HyDE vector), never nodes",
}


def _li_clustered() -> list:
    r = li.ClusteredBM25Retriever.from_defaults(nodes=li_nodes(), similarity_top_k=6, max_tokens=40,
                                                knn_k=3, knn_threshold=0.05)
    plain = r.retrieve(QUERY)  # default: the user's nodes exactly (hash unchanged)
    assert all(n.node.metadata == {**USER, **dict(CORPUS_META[n.node.node_id])} for n in plain)
    r.annotate = True  # opt in: cluster id, score and rank as funnel_ keys
    return r.retrieve(QUERY)


CORPUS_META = {i: m for i, _, m in CORPUS}

LC_BUILDERS: dict[str, tuple[str, Callable[[Models], Runner]]] = {
    "BM25Retriever": ("retriever", lambda m: lambda: lc_bm25().invoke(QUERY)),
    "ClusteredBM25Retriever": ("retriever", lambda m: lambda: lc.ClusteredBM25Retriever.from_documents(
        lc_documents(), k=6, max_tokens=40, knn_k=3, knn_threshold=0.05).invoke(QUERY)),
    "DenseRetriever": ("retriever", lambda m: lambda: lc.DenseRetriever.from_documents(
        lc_documents(), _embedder(m), k=4).invoke(QUERY)),
    "HybridRetriever": ("retriever", lambda m: lambda: lc.HybridRetriever(
        sparse=lc_bm25(), dense=_lc_store().as_retriever(search_kwargs={"k": 4}), k=4).invoke(QUERY)),
    "HyDERetriever": ("retriever", lambda m: lambda: lc.HyDERetriever.from_llm(
        FakeListLLM(responses=[MARLOWE] * 4), vectorstore=_lc_store(), k=4).invoke(QUERY)),
    "MixOfGranularityRetriever": ("retriever", lambda m: lambda: lc.MixOfGranularityRetriever(
        documents=lc.MultiGranularityTextSplitter(chunk_size=8, n_gra=2).split_documents(lc_documents()),
        k=3).invoke(QUERY)),
    "FunnelRetriever": ("retriever", lambda m: lambda: lc.FunnelRetriever.from_stages(
        lc_bm25(), lc.CrossEncoderReranker(model=m.cross_encoder, top_n=3, device="cpu"),
        lc.LaterChunkingTransformer(words=6), k=4).invoke(QUERY)),
    "CompressionRetriever": ("retriever", lambda m: lambda: lc.CompressionRetriever(
        base_retriever=lc_bm25(),
        compressors=[lc.CrossEncoderReranker(model=m.cross_encoder, top_n=3, device="cpu")],
        k=3).invoke(QUERY)),
    "ForwardLookupRetriever": ("retriever", lambda m: lambda: lc.ForwardLookupRetriever(
        llm=FakeListChatModel(responses=[MARLOWE]), retriever=lc_bm25(), variant="FB", k=3,
        samples=2).invoke(QUERY)),
    "CrossEncoderReranker": ("compressor", lambda m: lc.CrossEncoderReranker(
        model=m.cross_encoder, top_n=3, device="cpu")),
    "MonoT5Reranker": ("compressor", lambda m: lc.MonoT5Reranker(
        model=m.t5, top_n=3, device="cpu", max_length=64)),
    "FiDAttentionReranker": ("compressor", lambda m: lc.FiDAttentionReranker(
        model=m.t5, top_n=3, return_answer=True)),
    "AttentionLMReranker": ("compressor", lambda m: lc.AttentionLMReranker(model=m.llama, top_n=3)),
    "RankRAGReranker": ("compressor", lambda m: lc.RankRAGReranker(
        llm=FakeListLLM(responses=["True", "False"] * 10), top_n=3)),
    "ExtractiveCompressor": ("compressor", lambda m: lc.ExtractiveCompressor(method="bm25", ratio=0.5)),
    "LaterChunkingTransformer": ("transform", lambda m: lc.LaterChunkingTransformer(words=6)),
    "RepackTransformer": ("transform", lambda m: lc.RepackTransformer()),
    "MultiGranularityTextSplitter": ("parser", lambda m: lc.MultiGranularityTextSplitter(
        chunk_size=8, n_gra=3)),
    "GraphGranularitySplitter": ("parser", lambda m: lc.GraphGranularitySplitter(
        sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2)),
}

LC_NOT_COMPONENTS = {
    "StageCompressor": "abstract base of the compressors above",
    "UnitRetriever": "abstract base of the retrievers above",
}

#: Outputs deliberately not in score order (the rule "non-increasing" does not apply).
NOT_BY_SCORE = {
    "ForwardLookupRetriever": "FB-RAG Stage III keeps the context's order (order-preserving RAG)",
    "RepackPostprocessor": "repacking reorders by design (best last)",
    "RepackTransformer": "repacking reorders by design (best last)",
}


def _lc_store() -> InMemoryVectorStore:
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    store.add_documents(lc_documents())
    return store


def _public_components(module: Any, bases: tuple) -> set[str]:
    return {name for name in module.__all__
            if inspect.isclass(obj := getattr(module, name)) and issubclass(obj, bases)}


def test_every_public_component_is_covered():
    """Each public class that hands nodes / documents to the user is run below (or named in
    ``*_NOT_COMPONENTS`` with the reason); a new class fails here until it is added."""
    from llama_index.core.base.base_query_engine import BaseQueryEngine

    li_public = _public_components(li, (LIBaseRetriever, BaseNodePostprocessor, NodeParser,
                                        BaseQueryTransform, BaseQueryEngine))
    want = set(LI_BUILDERS) | set(LI_NOT_COMPONENTS)
    assert li_public == want, sorted(li_public ^ want)
    lc_public = _public_components(lc, (LCBaseRetriever, BaseDocumentCompressor,
                                        BaseDocumentTransformer))
    want = set(LC_BUILDERS) | set(LC_NOT_COMPONENTS)
    assert lc_public == want, sorted(lc_public ^ want)


# -- the checks ----------------------------------------------------------------------------------
def _check_metadata(name: str, meta: dict, user: dict, framework: str) -> None:
    for key, value in user.items():  # rule 2: every user key survives, unchanged
        if framework == "langchain" and key == "relevance_score":
            continue  # LangChain's shared score key: every LangChain reranker rewrites it
        assert key in meta, f"{name}: the user's key {key!r} was removed or moved"
        assert meta[key] == value, f"{name}: the user's key {key!r} was overwritten: {meta[key]!r}"
    for key, value in meta.items():  # rule 1: what we add is flat and prefixed
        if key in user and (framework != "langchain" or key != "relevance_score"):
            continue
        ours = key.startswith("funnel_") or (framework == "langchain" and key == "relevance_score")
        assert ours, f"{name}: wrote {key!r}, which is neither the user's nor a funnel_ key"
        assert isinstance(value, SCALARS), f"{name}: {key!r} holds a {type(value).__name__}"
        assert "trace" not in key, f"{name}: the trace is copied onto every result ({key!r})"  # 5
        if key.endswith("_json"):
            json.loads(value)


def _check_li_node(name: str, node: BaseNode, user: dict) -> None:
    _check_metadata(name, node.metadata, user, "llamaindex")
    ours = [k for k in node.metadata if k.startswith("funnel_")]
    for key in ours:  # rule 4
        assert key in node.excluded_llm_metadata_keys, f"{name}: {key!r} reaches the LLM"
        assert key in node.excluded_embed_metadata_keys, f"{name}: {key!r} reaches the embedder"
    assert "funnel_" not in node.get_content(metadata_mode=MetadataMode.LLM)
    assert "funnel_" not in node.get_content(metadata_mode=MetadataMode.EMBED)
    flat = node_to_metadata_dict(node, flat_metadata=True)  # rule 6: raises on nested values
    assert {k: flat[k] for k in node.metadata} == node.metadata
    back = metadata_dict_to_node(flat)
    assert back.metadata == node.metadata


def _check_lc_document(name: str, doc: Document, user: dict) -> None:
    _check_metadata(name, doc.metadata, user, "langchain")
    try:
        from langchain_community.vectorstores.utils import filter_complex_metadata
    except ImportError:  # the same rule: keep str, int, float, bool values only
        kept = {k: v for k, v in doc.metadata.items() if isinstance(v, (str, int, float, bool))}
    else:
        kept = filter_complex_metadata([doc])[0].metadata
    assert kept == {k: v for k, v in doc.metadata.items() if v is not None}, \
        f"{name}: filter_complex_metadata drops {sorted(set(doc.metadata) - set(kept))}"


def _non_increasing(scores: list) -> bool:
    return all(a >= b for a, b in zip(scores, scores[1:]))


@pytest.mark.parametrize("name", sorted(LI_BUILDERS))
def test_llama_index_component_keeps_the_contract(name, models):
    kind, build = LI_BUILDERS[name]
    obj = build(models)
    if kind == "postprocessor":
        out = obj.postprocess_nodes(li_bm25().retrieve(QUERY), query_str=QUERY)
    elif kind == "parser":
        out = [NodeWithScore(node=n, score=None) for n in obj.get_nodes_from_documents(li_documents())]
    else:
        out = obj()
    assert out, f"{name} returned nothing: the contract would hold vacuously"
    for nws in out:
        user = {**USER, **CORPUS_META[_doc_of(nws.node)]}
        _check_li_node(name, nws.node, user)
    if kind in ("retriever", "postprocessor", "transform") and name not in NOT_BY_SCORE:
        scores = [n.score for n in out]
        assert all(isinstance(s, float) for s in scores), (name, scores)
        assert _non_increasing(scores), (name, scores)


def _doc_of(node: BaseNode) -> str:
    """The corpus document a node came from (itself, its SOURCE, or its PARENT's id prefix)."""
    for cand in (node.node_id, getattr(node.source_node, "node_id", None),
                 getattr(node.parent_node, "node_id", None)):
        if cand in CORPUS_META:
            return cand
    head = node.node_id.split("/")[0].split("#")[0]
    assert head in CORPUS_META, node.node_id
    return head


@pytest.mark.parametrize("name", sorted(LC_BUILDERS))
def test_langchain_component_keeps_the_contract(name, models):
    kind, build = LC_BUILDERS[name]
    obj = build(models)
    if kind == "compressor":
        out = list(obj.compress_documents(lc_bm25().invoke(QUERY), QUERY))
    elif kind == "transform":
        out = list(obj.transform_documents(lc_bm25().invoke(QUERY)))
    elif kind == "parser":
        out = obj.split_documents(lc_documents())
    else:
        out = obj()
    assert out, f"{name} returned nothing: the contract would hold vacuously"
    for doc in out:
        head = str(doc.id).split("/")[0].split("#")[0]
        user = {**USER, **CORPUS_META.get(head, {})}
        _check_lc_document(name, doc, user)
    if kind in ("retriever", "compressor"):  # rule 3
        scores = [d.metadata.get("relevance_score") for d in out]
        assert all(type(s) is float for s in scores), (name, scores)
        if name not in NOT_BY_SCORE:
            assert _non_increasing(scores), (name, scores)


# -- flat-metadata stores keep the hierarchy -------------------------------------------------------
def test_chroma_style_flat_store_keeps_the_mog_hierarchy():
    """LlamaIndex vector-store integrations (Chroma, ...) store ``node_to_metadata_dict(node,
    flat_metadata=True)``: MultiGranularityNodeParser's levels and parents come back intact and
    a MoG retriever over the stored nodes answers as over the parsed ones."""
    nodes = li.MultiGranularityNodeParser(chunk_size=8, n_gra=3).get_nodes_from_documents(li_documents())
    stored = [metadata_dict_to_node(node_to_metadata_dict(n, flat_metadata=True)) for n in nodes]
    for a, b in zip(nodes, stored):
        assert b.metadata["funnel_granularity"] == a.metadata["funnel_granularity"]
        assert b.metadata.get("funnel_parent_id") == a.metadata.get("funnel_parent_id")
        assert b.relationships.keys() == a.relationships.keys()
    want = li.MixOfGranularityRetriever(nodes, similarity_top_k=3).retrieve(QUERY)
    got = li.MixOfGranularityRetriever(stored, similarity_top_k=3).retrieve(QUERY)
    assert [(n.node.node_id, n.score) for n in got] == [(n.node.node_id, n.score) for n in want]
    passages = li.LaterChunkingPostprocessor(words=6).postprocess_nodes(li_bm25(3).retrieve(QUERY),
                                                                        query_str=QUERY)
    for p in passages:
        back = metadata_dict_to_node(node_to_metadata_dict(p.node, flat_metadata=True))
        assert back.metadata["funnel_parent_id"] == p.node.node_id.split("#")[0]
        assert isinstance(back.metadata["funnel_position"], int)


def test_filter_complex_metadata_keeps_the_splitter_hierarchy():
    """LangChain's ``filter_complex_metadata`` (what Chroma users call before adding documents)
    keeps MultiGranularityTextSplitter's granularity and parent links; a MoG retriever over the
    filtered documents answers as over the split ones. (Before: the nested ``metadata["funnel"]``
    was dropped whole, and with it the hierarchy.)"""
    filter_complex_metadata = pytest.importorskip(
        "langchain_community.vectorstores.utils").filter_complex_metadata
    docs = lc.MultiGranularityTextSplitter(chunk_size=8, n_gra=3).split_documents(lc_documents())
    kept = filter_complex_metadata([d.model_copy(deep=True) for d in docs])
    assert [d.metadata for d in kept] == [d.metadata for d in docs]
    assert {d.metadata["funnel_granularity"] for d in kept} == {1, 2, 3}
    want = lc.MixOfGranularityRetriever(documents=docs, k=3).invoke(QUERY)
    got = lc.MixOfGranularityRetriever(documents=kept, k=3).invoke(QUERY)
    assert [(d.id, d.metadata["relevance_score"]) for d in got] == \
        [(d.id, d.metadata["relevance_score"]) for d in want]


# -- the funnel_ prefix is ours: a collision is a stated rule, not a silent loss -----------------
RESERVED = {"title": "T", "funnel_note": "mine", "funnel_level": "chapter"}


def _splitters():
    from llama_index.core import Document as LIDocument

    import langchain_funnel as lc_
    import llama_index_funnel as li_

    text = "Paris is the capital of France. The Eiffel Tower stands in Paris. It was built in 1889."
    yield "li-mog", lambda: li_.MultiGranularityNodeParser(chunk_size=4, n_gra=2).get_nodes_from_documents(
        [LIDocument(text=text, id_="a", metadata=dict(RESERVED))])
    yield "li-graph", lambda: li_.GraphGranularityNodeParser(sentences_per_node=1, t_graph=0.0).get_nodes_from_documents(
        [LIDocument(text=text, id_="a", metadata=dict(RESERVED))])
    yield "lc-mog", lambda: lc_.MultiGranularityTextSplitter(chunk_size=4, n_gra=2).split_documents(
        [Document(page_content=text, id="a", metadata=dict(RESERVED))])
    yield "lc-graph", lambda: lc_.GraphGranularitySplitter(sentences_per_node=1, t_graph=0.0).split_documents(
        [Document(page_content=text, id="a", metadata=dict(RESERVED))])


@pytest.mark.parametrize("name,split", list(_splitters()), ids=[n for n, _ in _splitters()])
def test_a_splitter_keeps_a_users_funnel_key_and_says_which_it_replaced(name, split):
    """A splitter's pieces carry the source's metadata; of the reserved funnel_ keys, those the
    splitter writes (funnel_level) are its own, and a warning names them (they were replaced
    silently); any other (funnel_note) is kept, in both frameworks alike."""
    with pytest.warns(UserWarning, match=r"funnel_level.*funnel_ prefix is this package's"):
        pieces = split()
    meta = [p.metadata for p in pieces]
    assert all(m["title"] == "T" and m["funnel_note"] == "mine" for m in meta)
    assert all(m["funnel_level"] != "chapter" for m in meta)


def test_splitting_pieces_again_leaks_no_structure():
    """A piece split again: its funnel_parent_id names a node of the first split; the new
    top-level pieces must not inherit it (in both frameworks)."""
    from llama_index.core import Document as LIDocument

    import langchain_funnel as lc_
    import llama_index_funnel as li_

    text = " ".join(f"Sentence {i} is about the river and the mill." for i in range(12))
    first = lc_.MultiGranularityTextSplitter(chunk_size=8, n_gra=2).split_documents(
        [Document(page_content=text, id="a")])
    child = next(d for d in first if d.metadata.get("funnel_parent_id"))
    with pytest.warns(UserWarning, match="funnel_parent_id"):
        again = lc_.MultiGranularityTextSplitter(chunk_size=4, n_gra=2).split_documents([child])
    top = [d for d in again if d.metadata["funnel_granularity"] == 2]
    assert top and all(d.metadata["funnel_parent_id"] is None for d in top)
    source = LIDocument(text=child.page_content, id_="b", metadata=dict(child.metadata))
    with pytest.warns(UserWarning, match="funnel_parent_id"):
        nodes = li_.MultiGranularityNodeParser(chunk_size=4, n_gra=2).get_nodes_from_documents([source])
    top = [n for n in nodes if n.metadata["funnel_granularity"] == 2]
    assert top and all(n.metadata["funnel_parent_id"] is None for n in top)
