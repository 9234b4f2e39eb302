"""LangChain objects for the "Searching for Best Practices in RAG" components (the *Best
practices in RAG* page): embeddings, hybrid retrieval, HyDE, repacking, compression, query
classification."""

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
from funnel_core.best_practices.fields import HYBRID_CANDIDATES, ExtractiveCompressorFields, FusionFields, RepackFields
from funnel_core.best_practices.fusion import fuse, same_identity
from funnel_core.best_practices.hyde import HyDE, HyDERetrieve
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.errors import check_positive_int, check_query
from funnel_core.settings import check_kwargs, checked_keywords
from langchain_funnel._base import (
    DEFAULT_K,
    RELEVANCE_SCORE,
    KRetriever,
    StageCompressor,
    documents_to_units,
    units_to_documents,
)
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
    """LangChain embeddings over :class:`~funnel_core.embeddings.SentenceEmbedder` (its
    settings; ``embedder=`` shares a loaded one); async methods run in a worker thread."""

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
    """HyDE as a runnable ``query -> text for the dense retriever``: the LLM's hypothetical
    passage (after the question with ``include_original``), embedded as one text. An
    approximation: :class:`HyDERetriever` averages the embeddings as the paper does. The prompt
    needs a ``{question}`` variable."""
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
    """Raw ``similarity_search_with_score_by_vector`` score -> relevance (higher = better): the
    store's ``_select_relevance_score_fn``; identity for ``InMemoryVectorStore`` (a cosine);
    ``None`` when the store says neither (its score may be a distance: none is written)."""
    if not callable(getattr(store, "similarity_search_with_score_by_vector", None)):
        return None
    try:
        return store._select_relevance_score_fn()  # type: ignore[no-any-return]
    except NotImplementedError:
        return (lambda s: s) if isinstance(store, InMemoryVectorStore) else None


class HyDERetriever(KRetriever):
    """Dense retrieval with the HyDE vector ``v`` of :class:`~funnel_core.best_practices.hyde.HyDE`
    (``hyde``), embedded by ``vectorstore.embeddings`` or, over a funnel_core dense ``index``
    (exactly one of the two), by its embedder. ``relevance_score`` is the store's relevance
    (:func:`_vector_relevance`); ``funnel_hyde_documents`` counts the documents in ``v``. Build
    with :meth:`from_llm` or pass ``hyde=HyDE(...)``."""

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
                 k: int = DEFAULT_K, **settings: Any) -> "HyDERetriever":
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
    """Hybrid search over any two LangChain retrievers (paper section 3.4.3; fusion settings:
    :class:`~funnel_core.best_practices.fields.FusionFields`).

    ``sparse`` gets the user's query; ``dense`` gets ``dense_query(query)`` when that runnable
    is set (e.g. :func:`hyde_query`), or ``invoke(q, dense_query="...")``. Scores are read from
    ``metadata["relevance_score"]``; for ``method="alpha"`` a similarity
    ``VectorStoreRetriever``'s store is asked for relevances (:meth:`_relevance_path`).
    Documents without ids are matched across the sides by text
    (:func:`~funnel_core.best_practices.fusion.same_identity`).
    """

    sparse: BaseRetriever
    dense: BaseRetriever
    dense_query: Optional[Runnable] = None
    _call_kwargs = ("dense_query",)

    # -- sides ---------------------------------------------------------------------------------
    def _store_search(self, retriever: BaseRetriever, asynchronous: bool) -> Optional[Callable]:
        """``search(query) -> [(document, relevance)]`` on ``retriever``'s vector store with its
        ``search_kwargs``; ``None``: invoke the retriever as it is (RRF, MMR, not a store)."""
        if not (self.method == "alpha" and isinstance(retriever, VectorStoreRetriever)
                and retriever.search_type in ("similarity", "similarity_score_threshold")):
            return None
        path = self._relevance_path(retriever.vectorstore)
        search = getattr(retriever.vectorstore, _ASYNC_TWIN[path] if asynchronous else path)
        kwargs = {n: v for n, v in retriever.search_kwargs.items() if n != "score_threshold"}
        return functools.partial(search, **kwargs)

    @staticmethod
    def _relevance_path(store: Any) -> str:
        """The store's method answering ``(document, relevance)`` pairs (async twin:
        :data:`_ASYNC_TWIN`): the private ``_similarity_search_with_relevance_scores`` (no
        warning on FAISS's values below 0; fusion normalises), the public one when only that is
        overridden, ``InMemoryVectorStore``'s cosine ``similarity_search_with_score``; any
        other store is refused (its score may be a distance)."""
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
                       embedder: Any = None, candidates: int = HYBRID_CANDIDATES,
                       dense_config: Optional[dict] = None, bm25_config: Optional[dict] = None,
                       **fusion: Any) -> "HybridRetriever":
        """Our BM25 and dense retrievers over ``documents`` (``candidates`` each), fused;
        ``backend=`` (a ``MilvusBackend`` or URI) keeps both in Milvus; ``fusion``: the fields."""
        check_kwargs(f"{cls.__name__}.from_documents", fusion, _fusion_names(cls))  # before building
        sparse, dense = hybrid_sides(documents, backend, embedder, candidates, dense_config,
                                     **(bm25_config or {}))
        return cls(sparse=sparse, dense=dense, **fusion)

    @classmethod
    def from_backend(cls, backend: Any, *, embedder: Any = None, candidates: int = HYBRID_CANDIDATES,
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
    """Reorder documents that arrive best first: a :class:`~funnel_core.best_practices.repack.Repack`
    stage as a document transformer and runnable (``retriever | RepackTransformer()``)."""


class ExtractiveCompressor(ExtractiveCompressorFields, StageCompressor):
    """Keep the sentences most similar to the query (paper section 3.7): a
    :class:`funnel_core.best_practices.compress.ExtractiveCompressor` as a document compressor."""


@checked_keywords
def query_classifier_branch(classifier: QueryClassifier, retrieval_chain: Runnable,
                            direct_chain: Runnable, *, query_key: str | None = None) -> Runnable:
    """A ``RunnableBranch``: ``retrieval_chain`` when the query (a string, or a dict's
    ``query_key``) needs retrieval, else ``direct_chain`` (e.g. ``prompt | llm``)."""
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
                 candidates: int = HYBRID_CANDIDATES, dense_config: Optional[dict] = None,
                 **bm25_config: Any) -> tuple[Any, DenseRetriever]:
    """The BM25 and dense sides of a hybrid retriever on one backend, built from ``documents``
    or re-opened (``None``; :func:`funnel_core.backends.milvus.hybrid_backends`)."""
    candidates = check_positive_int(candidates, "candidates")
    sb, db = hybrid_backends(backend, None if documents is not None else "HybridRetriever.from_backend")
    if documents is None:
        return BM25Retriever.from_backend(sb, k=candidates), DenseRetriever.from_backend(db, embedder, k=candidates)
    docs = list(documents)
    return (BM25Retriever.from_documents(docs, k=candidates, backend=sb, **bm25_config),
            DenseRetriever.from_documents(docs, embedder, backend=db, k=candidates, **(dense_config or {})))
