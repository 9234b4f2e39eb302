"""LangChain objects for the "Searching for Best Practices in RAG" components.

* :class:`SentenceEmbedderEmbeddings` — LangChain ``Embeddings`` over
  :class:`funnel_core.embeddings.SentenceEmbedder` (all-MiniLM-L6-v2 offline by default), e.g.
  for ``InMemoryVectorStore``.
* :class:`HybridRetriever` — fuses any sparse and any dense LangChain retriever with the paper's
  ``S_h = alpha * S_sparse + S_dense`` (min-max normalised) or RRF. The dense side may receive a
  different query: ``dense_query`` (a runnable, e.g. :func:`hyde_query`) rewrites it, or pass
  ``invoke(q, dense_query="...")``.
* :func:`hyde_query` — HyDE as a runnable: asks an LLM for a hypothetical answer document.
* :class:`RepackTransformer` — forward / reverse (best last, default) / sides.
* :class:`ExtractiveCompressor` — query-based sentence selection (a ``StageCompressor``).
* :func:`query_classifier_branch` — a ``RunnableBranch`` that runs the RAG chain only for
  queries that need retrieval.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Iterable, Optional, Sequence

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableBranch, RunnableConfig, RunnableLambda
from langchain_core.vectorstores import VectorStoreRetriever
from pydantic import ConfigDict, Field

from funnel_core.backends.milvus import as_backend, hybrid_backends
from funnel_core.best_practices.classify import QueryClassifier
from funnel_core.best_practices.compress import ExtractiveCompressor as CoreExtractiveCompressor
from funnel_core.best_practices.fusion import check_fusion_config, fuse
from funnel_core.best_practices.repack import Repack
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.errors import check_positive_int, check_query
from funnel_core.funnel import warm_up_attributes
from funnel_core.settings import check_accepted, check_kwargs, checked_keywords
from langchain_funnel._base import (
    RELEVANCE_SCORE,
    StageCompressor,
    documents_to_units,
    units_to_documents,
)
from langchain_funnel.milvus import DenseRetriever, require_milvus
from langchain_funnel.rerank import TransformerBase
from langchain_funnel.retrievers import BM25Retriever

__all__ = [
    "SentenceEmbedderEmbeddings",
    "HybridRetriever",
    "hyde_query",
    "DEFAULT_HYDE_PROMPT",
    "RepackTransformer",
    "ExtractiveCompressor",
    "query_classifier_branch",
]

DEFAULT_HYDE_PROMPT = PromptTemplate.from_template(
    "Please write a passage to answer the question.\n"
    "Try to include as many key details as possible.\n\n"
    "Question: {question}\n\nPassage:"
)


class SentenceEmbedderEmbeddings(Embeddings):
    """LangChain embeddings over :class:`~funnel_core.embeddings.SentenceEmbedder`.

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

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        return await asyncio.to_thread(self.embed_query, text)


@checked_keywords
def hyde_query(llm: Runnable, prompt: PromptTemplate | None = None,
               include_original: bool = True) -> Runnable:
    """HyDE (Gao et al., 2022) as a runnable ``query -> text for the dense retriever``.

    The LLM writes a hypothetical passage answering the question; with ``include_original`` the
    question is kept in front of it (LlamaIndex's ``HyDEQueryTransform`` averages both
    embeddings; one text holding both is the single-vector equivalent). Works with chat models
    and plain LLMs. The prompt must have a ``{question}`` variable.
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


class HybridRetriever(BaseRetriever):
    """Hybrid search over any two LangChain retrievers (paper section 3.4.3).

    Scores are read from ``Document.metadata["relevance_score"]`` (funnel-rag retrievers and
    LangChain's rerankers write it). A
    similarity ``VectorStoreRetriever`` returns no scores, so its vector store is queried through
    ``similarity_search_with_score`` with the retriever's own ``search_kwargs``. A retriever
    that gives no scores can still be fused with ``method="rrf"``.

    The fusion fields (``alpha``, ``method``, ``normalization``, ``rrf_k``) are validated at
    construction and at every assignment, and read at each call
    (:func:`funnel_core.best_practices.fusion.fuse`).

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

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    sparse: BaseRetriever
    dense: BaseRetriever
    k: int = Field(default=4, description="Number of documents to return.")
    dense_query: Optional[Runnable] = None
    alpha: float = Field(
        default=0.3, description="Sparse weight in S_h = alpha * S_sparse + S_dense, in [0, 1] (method='alpha').")
    method: str = Field(
        default='alpha', description='alpha (weighted sum of normalised scores) or rrf (reciprocal rank fusion).')
    normalization: str = Field(
        default='minmax', description="Score normalisation of each side for method='alpha': minmax, zscore or none.")
    rrf_k: int = Field(default=60, description="RRF constant (method='rrf'; Cormack et al.: 60).")


    def __init__(self, **data: Any) -> None:
        check_accepted(type(self), data)
        super().__init__(**data)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("alpha", "method", "normalization", "rrf_k"):
            settings = {n: getattr(self, n) for n in ("alpha", "method", "normalization", "rrf_k")}
            settings[name] = value
            check_fusion_config(**settings)  # validated before the field changes
        super().__setattr__(name, value)

    def warm_up(self) -> "HybridRetriever":
        """Load the models of everything this retriever holds (see ``funnel_core`` ``Stage.warm_up``),
        e.g. at server start-up; returns ``self``."""
        return warm_up_attributes(self)

    def model_post_init(self, __context: Any) -> None:
        check_fusion_config(self.method, self.alpha, self.normalization, self.rrf_k)
        check_positive_int(self.k, "k")

    # -- sides ---------------------------------------------------------------------------------
    @staticmethod
    def _with_scores(retriever: BaseRetriever, query: str, config: RunnableConfig) -> list[Document]:
        if isinstance(retriever, VectorStoreRetriever) and retriever.search_type == "similarity":
            pairs = retriever.vectorstore.similarity_search_with_score(query, **retriever.search_kwargs)
            return [Document(id=d.id, page_content=d.page_content,
                             metadata={**d.metadata, RELEVANCE_SCORE: float(s)}) for d, s in pairs]
        return retriever.invoke(query, config=config)

    @staticmethod
    async def _awith_scores(retriever: BaseRetriever, query: str,
                            config: RunnableConfig) -> list[Document]:
        if isinstance(retriever, VectorStoreRetriever) and retriever.search_type == "similarity":
            pairs = await retriever.vectorstore.asimilarity_search_with_score(
                query, **retriever.search_kwargs)
            return [Document(id=d.id, page_content=d.page_content,
                             metadata={**d.metadata, RELEVANCE_SCORE: float(s)}) for d, s in pairs]
        return await retriever.ainvoke(query, config=config)

    def _fuse(self, sparse: Sequence[Document], dense: Sequence[Document], k: int) -> list[Document]:
        units = fuse(documents_to_units(sparse), documents_to_units(dense), method=self.method,
                     alpha=self.alpha, normalization=self.normalization, rrf_k=self.rrf_k, k=k)
        return units_to_documents(units)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, dense_query: str | None = None,
                                **kwargs: Any) -> list[Document]:
        check_kwargs(type(self).__name__, kwargs, ("k", "dense_query"))  # no silent typos
        query = check_query(query)
        k = self.k if k is None else check_positive_int(k, "k")
        if not query:
            return []
        if dense_query is None:
            dense_query = self.dense_query.invoke(query, config={"callbacks": run_manager.get_child(
                "dense_query")}) if self.dense_query is not None else query
        sparse = self._with_scores(self.sparse, query, {"callbacks": run_manager.get_child("sparse")})
        dense = self._with_scores(self.dense, check_query(dense_query) or query,
                                  {"callbacks": run_manager.get_child("dense")})
        return self._fuse(sparse, dense, k)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, dense_query: str | None = None,
                                       **kwargs: Any) -> list[Document]:
        check_kwargs(type(self).__name__, kwargs, ("k", "dense_query"))  # no silent typos
        query = check_query(query)
        k = self.k if k is None else check_positive_int(k, "k")
        if not query:
            return []
        if dense_query is None:
            dense_query = await self.dense_query.ainvoke(query, config={
                "callbacks": run_manager.get_child("dense_query")}) \
                if self.dense_query is not None else query
        sparse, dense = await asyncio.gather(
            self._awith_scores(self.sparse, query, {"callbacks": run_manager.get_child("sparse")}),
            self._awith_scores(self.dense, check_query(dense_query) or query,
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


def _fusion_names(cls: Any) -> list[str]:
    """The fields a hybrid factory forwards to the retriever (all but its two sides)."""
    return [n for n in cls.model_fields if n not in ("sparse", "dense")]


class RepackTransformer(TransformerBase):
    """Reorder documents that arrive best first: ``"forward"``, ``"reverse"`` (default: best
    last, next to the question) or ``"sides"`` (best at both ends).

    A ``BaseDocumentTransformer`` and a runnable: ``retriever | RepackTransformer()``. Each
    document gets ``funnel_retrieval_rank`` and ``funnel_repack_position`` in its metadata. It
    holds a :class:`~funnel_core.best_practices.repack.Repack` stage.
    """

    stage_class: ClassVar[type] = Repack

    order: str = Field(
        default='reverse', description='forward, reverse (best last, next to the question) or sides.')
    name: Optional[str] = Field(default=None, description='Stage name in traces (None: repack).')


    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        return units_to_documents(self.stage.run("", documents_to_units(list(documents))))

    async def atransform_documents(self, documents: Sequence[Document],
                                   **kwargs: Any) -> list[Document]:
        return self.transform_documents(documents)

    def invoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        if not isinstance(input, (list, tuple)):
            raise TypeError(f"RepackTransformer takes a list of Documents, got {type(input).__name__}.")
        return self._call_with_config(self.transform_documents, input, config)


class ExtractiveCompressor(StageCompressor):
    """Keep the sentences most similar to the query (paper section 3.7), in original order.

    A ``BaseDocumentCompressor`` and a runnable over ``{"query", "documents"}`` (see
    ``rerank_chain``), holding a
    :class:`funnel_core.best_practices.compress.ExtractiveCompressor`; ``embedder`` shares an
    already loaded :class:`SentenceEmbedder`. ``funnel_compression_...`` metadata keys record
    tokens before/after.
    """

    stage_class: ClassVar[type] = CoreExtractiveCompressor

    method: str = Field(
        default='embedding', description='embedding (cosine similarity), bm25 sentence scoring, or random '
                                         '(a control: random sentences up to the same budget).')
    ratio: float = Field(default=0.4, description='Share of input tokens to keep, in (0, 1].')
    seed: int = Field(default=0, description='Seed of the random control (with the query).')
    max_tokens: Optional[int] = Field(
        default=None, description='Absolute token budget (the smaller of the two wins).')
    scope: str = Field(
        default='global', description='global (one budget over all units) or unit (one budget per unit).')
    min_sentences: int = Field(
        default=1, description='Sentences always kept per scope (the best ones).')
    model: Optional[str] = Field(
        default=None, description='Sentence-embedding model; None = the packaged MiniLM.')
    batch_size: int = Field(default=64, description='Sentences per forward pass.')
    device: Optional[str] = Field(default=None, description='Torch device; None = best available.')
    cache_size: int = Field(
        default=0, description='Sentence embeddings kept in an LRU cache (0 = off).')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces (None: extractive_compressor).')
    dtype: str = Field(
        default='auto', description='Precision of the embedding model: auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively).')

    embedder: Optional[SentenceEmbedder] = Field(default=None, exclude=True,
                                                 description="Share an already loaded embedder.")


@checked_keywords
def query_classifier_branch(classifier: QueryClassifier, retrieval_chain: Runnable,
                            direct_chain: Runnable, *, query_key: str | None = None) -> Runnable:
    """A ``RunnableBranch``: ``retrieval_chain`` when the query needs retrieval, else
    ``direct_chain`` (e.g. ``prompt | llm`` with no context).

    The input is the query string, or a dict holding it under ``query_key``.
    """
    if not isinstance(classifier, QueryClassifier):
        raise TypeError(f"classifier must be a QueryClassifier, got {type(classifier).__name__}.")
    classifier._require_fitted()

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
    ``documents``, or re-opened (``documents=None``, Milvus only). On Milvus the collections are
    ``<collection>_bm25`` and ``<collection>_dense`` (``collection`` default ``funnel_hybrid``)."""
    candidates = check_positive_int(candidates, "candidates")
    if documents is None:
        sb, db = hybrid_backends(require_milvus(backend, "HybridRetriever.from_backend"))
        return (BM25Retriever.from_backend(sb, k=candidates),
                DenseRetriever.from_backend(db, embedder, k=candidates))
    b = as_backend(backend)
    docs = list(documents)
    sb_, db_ = hybrid_backends(b) if b is not None else (None, None)
    sparse = BM25Retriever.from_documents(docs, k=candidates, backend=sb_, **bm25_config)
    dense = DenseRetriever.from_documents(docs, embedder, backend=db_, k=candidates,
                                          **(dense_config or {}))
    return sparse, dense
