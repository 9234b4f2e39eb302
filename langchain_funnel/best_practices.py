"""LangChain objects for the "Searching for Best Practices in RAG" components: offline
embeddings, hybrid retrieval, HyDE (a runnable and a retriever), repacking, extractive
compression and query classification (each names its paper section and its ``funnel_core``
stage).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable, Iterable, Optional, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableBranch, RunnableConfig, RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore, VectorStoreRetriever

from funnel_core.backends.milvus import hybrid_backends
from funnel_core.best_practices.classify import QueryClassifier
from funnel_core.best_practices.fields import ExtractiveCompressorFields, FusionFields, RepackFields
from funnel_core.best_practices.fusion import fuse, same_identity
from funnel_core.best_practices.hyde import HyDE, HyDERetrieve
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.errors import check_positive_int, check_query
from funnel_core.settings import check_kwargs, checked_keywords
from langchain_funnel._base import RELEVANCE_SCORE, KRetriever, StageCompressor, documents_to_units, units_to_documents
from langchain_funnel.dense import DenseRetriever
from langchain_funnel.llm import as_provider
from langchain_funnel.rerank import TransformerBase
from langchain_funnel.retrievers import BM25Retriever

__all__ = ["SentenceEmbedderEmbeddings", "HybridRetriever", "hyde_query", "DEFAULT_HYDE_PROMPT", "HyDERetriever",
           "RepackTransformer", "ExtractiveCompressor", "query_classifier_branch"]

DEFAULT_HYDE_PROMPT = PromptTemplate.from_template(
    "Please write a passage to answer the question.\n"
    "Try to include as many key details as possible.\n\n"
    "Question: {question}\n\nPassage:"
)


class SentenceEmbedderEmbeddings(Embeddings):
    """LangChain embeddings over :class:`~funnel_core.embeddings.SentenceEmbedder` (e.g. for
    ``InMemoryVectorStore``); the async methods run in a worker thread (LangChain's default).

    Args:
        model_name: sentence-transformers hub name or local folder; ``None`` = packaged MiniLM.
        batch_size: Texts per forward pass.
        device: Torch device or ``None`` for the best available.
        embedder: An existing :class:`SentenceEmbedder` to share.
    """

    @checked_keywords
    def __init__(self, *, model_name: str | None = None, batch_size: int = 64,
                 device: str | None = None, embedder: SentenceEmbedder | None = None) -> None:
        self.embedder = embedder or SentenceEmbedder(model_name, device=device, batch_size=batch_size)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embedder.encode(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embedder.encode([text])[0].tolist()


@checked_keywords
def hyde_query(llm: Runnable, prompt: PromptTemplate | None = None,
               include_original: bool = True) -> Runnable:
    """HyDE (Gao et al., 2022) as a runnable ``query -> text for the dense retriever``.

    The LLM writes a hypothetical passage answering the question; with ``include_original`` the
    question is kept in front of it, and the dense retriever embeds that one text. This is an
    approximation: the HyDE paper (and LlamaIndex's ``HyDEQueryTransform``) average the
    embeddings of the question and the documents instead, which :class:`HyDERetriever` does.
    Works with chat models and plain LLMs. The prompt must have a ``{question}`` variable.
    """
    prompt = prompt or DEFAULT_HYDE_PROMPT
    if "question" not in prompt.input_variables:
        raise ValueError(f"the HyDE prompt needs a {{question}} variable, has {prompt.input_variables}.")
    write = prompt | llm | StrOutputParser()

    def _join(inputs: dict) -> str:
        doc = inputs["doc"].strip()
        return f"{inputs['question']}\n{doc}" if include_original and doc else (doc or inputs["question"])

    return ({"question": RunnableLambda(lambda q: q), "doc": RunnableLambda(lambda q: {"question": q}) | write}
            | RunnableLambda(_join)).with_config(run_name="hyde_query")


def _vector_relevance(store: Any) -> Optional[Callable[[float], float]]:
    """How a store's raw ``similarity_search_with_score_by_vector`` score becomes a relevance
    (higher = more relevant): the store's own ``_select_relevance_score_fn`` (FAISS and Chroma turn
    their distances into relevances there); langchain-core's ``InMemoryVectorStore`` answers a cosine
    similarity already; ``None`` for a store that says neither (its score may be a distance, so no
    score is written rather than a wrong one, as for a store without that method)."""
    if not callable(getattr(store, "similarity_search_with_score_by_vector", None)):
        return None
    try:
        return store._select_relevance_score_fn()  # type: ignore[no-any-return]
    except NotImplementedError:
        return (lambda s: s) if isinstance(store, InMemoryVectorStore) else None


class HyDERetriever(KRetriever):
    """Dense retrieval with the HyDE vector ``v`` (:mod:`funnel_core.best_practices.hyde`; the
    equation: the Best practices page) of the vector store's ``embeddings`` (``embed_query`` for
    the question, ``embed_documents`` for the LLM's ``n`` hypothetical documents) or, over our
    dense ``index``, of its embedder. Documents carry the similarity in
    ``metadata["relevance_score"]`` (so :class:`HybridRetriever` fuses them) and
    ``funnel_hyde_documents`` (how many documents entered ``v``). Build with :meth:`from_llm` (a
    LangChain chat model or LLM, or a funnel_core LLM, plus the HyDE settings), or pass
    ``hyde=HyDE(...)``.

    Attributes:
        hyde: The core :class:`~funnel_core.best_practices.hyde.HyDE` (its settings are attributes).
        vectorstore: A LangChain vector store with embeddings and ``similarity_search_by_vector``
            (``similarity_search_with_score_by_vector`` for scores, turned into relevances by the
            store's own relevance function; a store that has none gets no score).
        index: Or a funnel_core dense index (``DenseIndex``, Milvus); exactly one of the two.
        k: Documents returned (``invoke(q, k=3)`` overrides).
    """

    hyde: HyDE
    vectorstore: Optional[VectorStore] = None
    index: Optional[Any] = None

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        if (self.vectorstore is None) == (self.index is None):
            raise ValueError("HyDERetriever needs exactly one of vectorstore= (a LangChain vector store) "
                             "and index= (a funnel_core DenseIndex or Milvus dense index).")
        if self.vectorstore is not None and self.vectorstore.embeddings is None:
            raise ValueError(f"the vector store {type(self.vectorstore).__name__} exposes no embeddings; "
                             "HyDE embeds the query and its documents with them.")
        if self.index is not None:
            HyDERetrieve(self.index, self.hyde)  # checks the index

    @classmethod
    def from_llm(cls, llm: Any, *, vectorstore: Optional[VectorStore] = None, index: Any = None,
                 k: int = 4, **settings: Any) -> "HyDERetriever":
        """``HyDE(llm, **settings)`` over ``vectorstore`` or ``index``; ``llm`` is a LangChain
        model, a funnel_core LLM or a causal-LM folder."""
        hyde = HyDE.of(f"{cls.__name__}.from_llm", llm, settings, as_provider, ("vectorstore", "index", "k"))
        return cls(hyde=hyde, vectorstore=vectorstore, index=index, k=k)

    def _search(self, query: str, docs: list[str], k: int) -> list[Document]:
        if self.index is not None:
            return units_to_documents(HyDERetrieve(self.index, self.hyde, k=k)._search(query, docs))
        store: Any = self.vectorstore
        emb = store.embeddings
        v = [float(x) for x in self.hyde.combine(query, docs, emb.embed_query, emb.embed_documents)]
        used = sum(1 for d in docs if d.strip())
        relevance = _vector_relevance(store)
        pairs = store.similarity_search_with_score_by_vector(v, k=k) if relevance is not None else \
            [(d, None) for d in store.similarity_search_by_vector(v, k=k)]
        return [Document(id=d.id, page_content=d.page_content, metadata={
            **d.metadata, "funnel_hyde_documents": used,
            **({} if score is None or relevance is None else {RELEVANCE_SCORE: float(relevance(score))})})
            for d, score in pairs]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        return self._search(query, self.hyde.documents(query), k) if query else []

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        if not query:
            return []
        return await asyncio.to_thread(self._search, query, await self.hyde.adocuments(query), k)


#: The async twin of each store method :meth:`HybridRetriever._relevance_path` may name.
_ASYNC_TWIN = {
    "_similarity_search_with_relevance_scores": "_asimilarity_search_with_relevance_scores",
    "similarity_search_with_relevance_scores": "asimilarity_search_with_relevance_scores",
    "similarity_search_with_score": "asimilarity_search_with_score",
}


class HybridRetriever(FusionFields, KRetriever):
    """Hybrid search over any two LangChain retrievers (paper section 3.4.3).

    Scores are read from ``Document.metadata["relevance_score"]``. A similarity
    ``VectorStoreRetriever`` returns none, so for ``method="alpha"`` its vector store is asked,
    with the retriever's ``search_kwargs``, through the store's own relevance path; a store that
    cannot say what its score means is refused with a ``ValueError`` naming it, and
    ``method="rrf"`` (ranks only) fuses any retriever. Documents without ids (LangChain's
    default) are matched across the two sides by their text
    (:func:`~funnel_core.best_practices.fusion.same_identity`), so each is fused once. The
    *Best practices in RAG* page (LangChain) gives the details. The fusion fields are validated
    at construction and at every assignment, and read at each call.

    Attributes:
        sparse: The sparse retriever (BM25); it always receives the user's query.
        dense: The dense retriever; it receives ``dense_query(query)`` when set, or the
            ``dense_query=`` string passed to ``invoke``.
        alpha: Sparse weight in ``S_h = alpha * S_sparse + S_dense`` (0.3), in [0, 1].
        method: ``"alpha"`` or ``"rrf"``.
        normalization: ``"minmax"``, ``"zscore"`` or ``"none"``.
        rrf_k: RRF constant (60).
        k: Documents returned after fusion (constructor default; ``invoke(q, k=3)`` overrides).
        dense_query: Optional runnable ``query -> str`` for the dense side (see :func:`hyde_query`).
    """

    sparse: BaseRetriever
    dense: BaseRetriever
    dense_query: Optional[Runnable] = None
    _call_kwargs = ("dense_query",)

    # -- sides ---------------------------------------------------------------------------------
    def _store_search(self, retriever: BaseRetriever, asynchronous: bool) -> Optional[Callable]:
        """``search(query) -> [(document, relevance)]`` on the vector store of ``retriever``,
        with its own ``search_kwargs``, or ``None`` when the retriever is invoked as it is (RRF
        reads ranks only; an MMR search has no score per document; any other retriever writes
        ``relevance_score`` itself)."""
        if not (self.method == "alpha" and isinstance(retriever, VectorStoreRetriever)
                and retriever.search_type in ("similarity", "similarity_score_threshold")):
            return None
        path = self._relevance_path(retriever.vectorstore)
        search = getattr(retriever.vectorstore, _ASYNC_TWIN[path] if asynchronous else path)
        kwargs = {n: v for n, v in retriever.search_kwargs.items() if n != "score_threshold"}
        return functools.partial(search, **kwargs)

    @staticmethod
    def _relevance_path(store: Any) -> str:
        """The name of the store's method that answers ``(document, relevance)`` pairs, higher =
        more relevant (its async twin: :data:`_ASYNC_TWIN`).

        The store's own ``_similarity_search_with_relevance_scores`` maps its raw scores
        through its ``_select_relevance_score_fn``, read without the public method's warning
        about values outside [0, 1] (FAISS's squared L2 over unit vectors goes below 0; the
        order is right and fusion normalises each side); a store that overrides only the public
        method is asked through it; ``InMemoryVectorStore``'s ``similarity_search_with_score``
        is a cosine similarity. Any other store is refused: its raw score may be a distance.
        """
        cls = type(store)
        private, public = ("_similarity_search_with_relevance_scores",
                           "similarity_search_with_relevance_scores")
        if getattr(cls, private) is not getattr(VectorStore, private):
            return private
        try:
            store._select_relevance_score_fn()
            return private
        except NotImplementedError:
            if getattr(cls, public) is not getattr(VectorStore, public):
                return public
        if isinstance(store, InMemoryVectorStore) and cls.similarity_search_with_score is \
                InMemoryVectorStore.similarity_search_with_score:
            return "similarity_search_with_score"
        raise ValueError(
            f"HybridRetriever cannot tell what the scores of {cls.__name__} mean: it defines no "
            "relevance score function (_select_relevance_score_fn), and its "
            "similarity_search_with_score may answer a distance (lower = nearer) that alpha "
            f"fusion would rank as a similarity. Give {cls.__name__} a relevance function "
            "(e.g. its relevance_score_fn= argument, where it has one), or fuse by ranks with "
            "method='rrf'.")

    @staticmethod
    def _scored(retriever: Any, pairs: Sequence[tuple[Document, float]]) -> list[Document]:
        threshold = retriever.search_kwargs.get("score_threshold")
        return [Document(id=d.id, page_content=d.page_content,
                         metadata={**d.metadata, RELEVANCE_SCORE: float(s)})
                for d, s in pairs if threshold is None or s >= threshold]

    def _with_scores(self, retriever: BaseRetriever, query: str,
                     config: RunnableConfig) -> list[Document]:
        search = self._store_search(retriever, asynchronous=False)
        if search is None:
            return retriever.invoke(query, config=config)
        return self._scored(retriever, search(query))

    async def _awith_scores(self, retriever: BaseRetriever, query: str,
                            config: RunnableConfig) -> list[Document]:
        search = self._store_search(retriever, asynchronous=True)
        if search is None:
            return await retriever.ainvoke(query, config=config)
        return self._scored(retriever, await search(query))

    def _fuse(self, sparse: Sequence[Document], dense: Sequence[Document], k: int) -> list[Document]:
        s_units, d_units = documents_to_units(sparse), documents_to_units(dense)
        same_identity(s_units, d_units)
        units = fuse(s_units, d_units, method=self.method,
                     alpha=self.alpha, normalization=self.normalization, rrf_k=self.rrf_k, k=k)
        return units_to_documents(units)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, dense_query: str | None = None,
                                **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        if not query:
            return []
        if dense_query is None and self.dense_query is not None:
            dense_query = self.dense_query.invoke(
                query, config={"callbacks": run_manager.get_child("dense_query")})
        sparse = self._with_scores(self.sparse, query, {"callbacks": run_manager.get_child("sparse")})
        dense = self._with_scores(self.dense, _side_query(dense_query, query),
                                  {"callbacks": run_manager.get_child("dense")})
        return self._fuse(sparse, dense, k)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, dense_query: str | None = None,
                                       **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        if not query:
            return []
        if dense_query is None and self.dense_query is not None:
            dense_query = await self.dense_query.ainvoke(
                query, config={"callbacks": run_manager.get_child("dense_query")})
        sparse, dense = await asyncio.gather(
            self._awith_scores(self.sparse, query, {"callbacks": run_manager.get_child("sparse")}),
            self._awith_scores(self.dense, _side_query(dense_query, query),
                               {"callbacks": run_manager.get_child("dense")}))
        return self._fuse(sparse, dense, k)

    # -- built on one backend (in memory or Milvus); see langchain_funnel.milvus ---------------
    @classmethod
    def from_documents(cls, documents: Sequence[Document], *, backend: Any = None,
                       embedder: Any = None, candidates: int = 20,
                       dense_config: Optional[dict] = None, bm25_config: Optional[dict] = None,
                       **fusion: Any) -> "HybridRetriever":
        """Our BM25 and dense retrievers over ``documents`` (``candidates`` each), fused;
        ``backend=MilvusBackend(...)`` (or a URI) keeps both in Milvus. ``fusion``: ``alpha``,
        ``method``, ``k``, ..."""
        check_kwargs(f"{cls.__name__}.from_documents", fusion, _fusion_names(cls))  # before building
        sparse, dense = hybrid_sides(documents, backend, embedder, candidates, dense_config,
                                     **(bm25_config or {}))
        return cls(sparse=sparse, dense=dense, **fusion)

    @classmethod
    def from_backend(cls, backend: Any, *, embedder: Any = None, candidates: int = 20,
                     **fusion: Any) -> "HybridRetriever":
        """Re-open both sides built by :meth:`from_documents` on Milvus (no re-indexing)."""
        check_kwargs(f"{cls.__name__}.from_backend", fusion, _fusion_names(cls))  # before opening
        sparse, dense = hybrid_sides(None, backend, embedder, candidates)
        return cls(sparse=sparse, dense=dense, **fusion)


def _side_query(dense_query: Any, query: str) -> str:
    """The dense side's query: ``dense_query`` when given and not blank, else the user's."""
    return query if dense_query is None else (check_query(dense_query) or query)


def _fusion_names(cls: Any) -> list[str]:
    """The fields a hybrid factory forwards to the retriever (all but its two sides)."""
    return [n for n in cls.model_fields if n not in ("sparse", "dense")]


class RepackTransformer(RepackFields, TransformerBase):
    """Reorder documents that arrive best first: ``"forward"``, ``"reverse"`` (default: best
    last, next to the question) or ``"sides"`` (best at both ends).

    A ``BaseDocumentTransformer`` and a runnable: ``retriever | RepackTransformer()``. Each
    document gets ``funnel_retrieval_rank`` and ``funnel_repack_position`` in its metadata. It
    holds a :class:`~funnel_core.best_practices.repack.Repack` stage.
    """


class ExtractiveCompressor(ExtractiveCompressorFields, StageCompressor):
    """Keep the sentences most similar to the query (paper section 3.7), in original order.

    A ``BaseDocumentCompressor`` and a runnable over ``{"query", "documents"}`` (see
    ``rerank_chain``), holding a
    :class:`funnel_core.best_practices.compress.ExtractiveCompressor`; ``embedder`` shares an
    already loaded :class:`SentenceEmbedder`. ``funnel_compression_...`` metadata keys record
    tokens before/after.
    """


@checked_keywords
def query_classifier_branch(classifier: QueryClassifier, retrieval_chain: Runnable,
                            direct_chain: Runnable, *, query_key: str | None = None) -> Runnable:
    """A ``RunnableBranch``: ``retrieval_chain`` when the query needs retrieval, else
    ``direct_chain`` (e.g. ``prompt | llm`` with no context).

    The input is the query string, or a dict holding it under ``query_key``.
    """
    QueryClassifier.check_trained(classifier)

    def needs(x: Any) -> bool:
        if query_key is not None:
            if not isinstance(x, dict) or query_key not in x:
                raise TypeError(f"expected a dict with key {query_key!r}, got {type(x).__name__}.")
            x = x[query_key]
        return classifier.needs_retrieval(x)

    return RunnableBranch((RunnableLambda(needs).with_config(run_name="needs_retrieval"),
                           retrieval_chain), direct_chain)


def hybrid_sides(documents: Optional[Iterable[Document]], backend: Any, embedder: Any = None,
                 candidates: int = 20, dense_config: Optional[dict] = None,
                 **bm25_config: Any) -> tuple[Any, DenseRetriever]:
    """The sparse (BM25) and dense sides of a hybrid retriever on one backend: built from
    ``documents``, or re-opened (``documents=None``, Milvus only; see
    :func:`funnel_core.backends.milvus.hybrid_backends` for the collections)."""
    candidates = check_positive_int(candidates, "candidates")
    sb, db = hybrid_backends(backend, None if documents is not None else "HybridRetriever.from_backend")
    if documents is None:
        return BM25Retriever.from_backend(sb, k=candidates), DenseRetriever.from_backend(db, embedder, k=candidates)
    docs = list(documents)
    return (BM25Retriever.from_documents(docs, k=candidates, backend=sb, **bm25_config),
            DenseRetriever.from_documents(docs, embedder, backend=db, k=candidates, **(dense_config or {})))
