"""LlamaIndex objects for the "Searching for Best Practices in RAG" components (each class names
its paper section and its ``funnel_core`` stage)."""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.base.response.schema import Response
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.llms import LLM
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle

from funnel_core.backends.milvus import hybrid_backends
from funnel_core.best_practices.classify import QueryClassifier
from funnel_core.best_practices.fields import (
    FUSION_SETTINGS,
    HYBRID_CANDIDATES,
    ExtractiveCompressorFields,
    FusionFields,
    RepackFields,
)
from funnel_core.best_practices.fusion import check_fusion_config, fuse
from funnel_core.best_practices.hyde import HyDE
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.errors import check_positive_int, check_query
from funnel_core.funnel import WarmUpMixin
from funnel_core.settings import check_accepted, check_kwargs, checked_keywords, field_defaults, keyword_names
from llama_index_funnel._base import TOP_K, PromptlessTransform, StagePostprocessor, nodes_to_units, units_to_nodes
from llama_index_funnel.dense import DenseRetriever
from llama_index_funnel.llm import as_provider
from llama_index_funnel.retrievers import BM25Retriever

__all__ = ["SentenceEmbedderEmbedding", "HybridRetriever", "HyDETransform", "RepackPostprocessor",
           "ExtractiveCompressorPostprocessor", "QueryClassifierGate", "QueryClassifierQueryEngine"]


class SentenceEmbedderEmbedding(BaseEmbedding):
    """LlamaIndex embedding model over :class:`~funnel_core.embeddings.SentenceEmbedder` (a
    ``VectorStoreIndex`` built offline). ``model_name``, ``embed_batch_size`` and ``device`` build
    one (``model_name=None``: the packaged all-MiniLM-L6-v2); ``embedder=`` shares a loaded one."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    device: Optional[str] = Field(default=None, description="Torch device, None = best available.")
    _embedder: SentenceEmbedder = PrivateAttr()

    def __init__(self, model_name: Optional[str] = None, embed_batch_size: int = 64,
                 device: Optional[str] = None, embedder: Optional[SentenceEmbedder] = None,
                 **kwargs: Any) -> None:
        check_accepted(type(self), kwargs)  # a typo raises, naming the accepted fields
        embedder = embedder or SentenceEmbedder(model_name, device=device, batch_size=embed_batch_size)
        super().__init__(model_name=embedder.model_name_or_path, embed_batch_size=embed_batch_size,
                         device=device, **kwargs)
        self._embedder = embedder

    @classmethod
    def class_name(cls) -> str:
        return "SentenceEmbedderEmbedding"

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._embedder.encode([query])[0].tolist()

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._embedder.encode([text])[0].tolist()

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    def _get_text_embeddings(self, texts: List[str]) -> List[Embedding]:
        return self._embedder.encode(list(texts)).tolist()

    async def _aget_text_embeddings(self, texts: List[str]) -> List[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


#: The fusion settings' defaults, declared once in :class:`~funnel_core.best_practices.fields.FusionFields`.
_FUSION: dict[str, Any] = field_defaults(FusionFields)


class HybridRetriever(WarmUpMixin, BaseRetriever):
    """Hybrid search over two LlamaIndex retrievers (paper section 3.4.3).

    ``sparse_retriever`` (e.g. BM25) receives only the query string, ``dense_retriever`` (e.g.
    ``index.as_retriever()``) the query bundle as is, HyDE embedding strings included;
    ``similarity_top_k`` nodes are returned (``None``: the whole fused union). Fusion settings:
    see :class:`~funnel_core.best_practices.fields.FusionFields` (attributes, validated when
    edited). Scores are fused; ``funnel_...`` metadata keys keep each side's score and rank.
    Usage with HyDE::

        hyde = HyDEQueryTransform(llm=llm, include_original=True)
        retriever = TransformRetriever(HybridRetriever(bm25, vector_retriever), hyde)
    """

    @checked_keywords
    def __init__(self, sparse_retriever: BaseRetriever, dense_retriever: BaseRetriever, *,
                 similarity_top_k: Optional[int] = TOP_K,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False,
                 alpha: float = _FUSION["alpha"], method: str = _FUSION["method"],
                 normalization: str = _FUSION["normalization"], rrf_k: int = _FUSION["rrf_k"]) -> None:
        for label, r in (("sparse_retriever", sparse_retriever), ("dense_retriever", dense_retriever)):
            if not isinstance(r, BaseRetriever):
                raise TypeError(f"{label} must be a LlamaIndex BaseRetriever, got {type(r).__name__}.")
        self.alpha = check_fusion_config(method, alpha, normalization, rrf_k)
        self.method, self.normalization, self.rrf_k = method, normalization, rrf_k
        self.similarity_top_k = check_positive_int(similarity_top_k, "similarity_top_k", allow_none=True)
        self._sparse, self._dense = sparse_retriever, dense_retriever
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FUSION_SETTINGS and "rrf_k" in self.__dict__:
            settings = {**{n: self.__dict__[n] for n in FUSION_SETTINGS}, name: value}
            value = {**settings, "alpha": check_fusion_config(**settings)}[name]
        super().__setattr__(name, value)

    def _fuse(self, sparse: List[NodeWithScore], dense: List[NodeWithScore]) -> List[NodeWithScore]:
        units = fuse(nodes_to_units(sparse), nodes_to_units(dense), method=self.method,
                     alpha=self.alpha, normalization=self.normalization, rrf_k=self.rrf_k,
                     k=self.similarity_top_k)
        return units_to_nodes(units, [*sparse, *dense])

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        if not check_query(query_bundle.query_str):
            return []
        sparse = self._sparse.retrieve(QueryBundle(query_bundle.query_str))  # the query string only
        dense = self._dense.retrieve(query_bundle)
        return self._fuse(sparse, dense)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        if not check_query(query_bundle.query_str):
            return []
        sparse, dense = await asyncio.gather(
            self._sparse.aretrieve(QueryBundle(query_bundle.query_str)),
            self._dense.aretrieve(query_bundle))
        return self._fuse(sparse, dense)

    # -- built on one backend (in memory or Milvus, see hybrid_backends) ----------------------
    @classmethod
    def from_defaults(cls, nodes: Any, *, backend: Any = None, embedder: Any = None,
                      candidates: int = HYBRID_CANDIDATES, dense_config: Optional[dict] = None,
                      bm25_config: Optional[dict] = None, **fusion: Any) -> "HybridRetriever":
        """Our BM25 and dense retrievers over ``nodes`` (``candidates`` each), fused;
        ``backend=MilvusBackend(...)`` (or a URI) keeps both in Milvus. ``fusion``: ``alpha``,
        ``method``, ``similarity_top_k``, ..."""
        check_kwargs(f"{cls.__name__}.from_defaults", fusion, _fusion_names(cls))  # before building
        sb, db = hybrid_backends(backend)
        k = check_positive_int(candidates, "candidates")
        return cls(BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=k, backend=sb, **(bm25_config or {})),
                   DenseRetriever.from_defaults(nodes, embedder, backend=db, similarity_top_k=k,
                                                **(dense_config or {})), **fusion)

    @classmethod
    def from_backend(cls, backend: Any, *, embedder: Any = None, candidates: int = HYBRID_CANDIDATES,
                     **fusion: Any) -> "HybridRetriever":
        """Re-open both sides built by :meth:`from_defaults` on Milvus (no re-indexing)."""
        check_kwargs(f"{cls.__name__}.from_backend", fusion, _fusion_names(cls))  # before opening
        sb, db = hybrid_backends(backend, f"{cls.__name__}.from_backend")
        k = check_positive_int(candidates, "candidates")
        return cls(BM25Retriever.from_backend(sb, similarity_top_k=k),
                   DenseRetriever.from_backend(db, embedder, similarity_top_k=k), **fusion)


class HyDETransform(PromptlessTransform):
    """HyDE as a query transform (:class:`~funnel_core.best_practices.hyde.HyDE`, whose settings
    ``**settings`` are; ``transform.hyde`` holds it): the returned ``QueryBundle`` keeps
    ``query_str``, lists the hypothetical documents in ``custom_embedding_strs`` and carries the
    HyDE vector as its ``embedding``, which retrievers search with (in :class:`HybridRetriever`,
    only the dense side). ``llm``: a ``HyDE``, a LlamaIndex LLM, a funnel_core LLM or a causal-LM
    folder. ``embed_model``: the searched index's (default ``Settings.embed_model``; with our
    ``DenseRetriever``, ``SentenceEmbedderEmbedding(embedder=index.embedder)``).
    """

    def __init__(self, llm: Any, embed_model: Optional[BaseEmbedding] = None, **settings: Any) -> None:
        super().__init__()
        self.hyde = HyDE.of(type(self).__name__, llm, settings, as_provider, ("embed_model",))
        self._embed_model = embed_model

    @property
    def embed_model(self) -> BaseEmbedding:
        if self._embed_model is None:
            from llama_index.core import Settings as LlamaSettings

            self._embed_model = LlamaSettings.embed_model
        return self._embed_model

    def _run(self, query_bundle: QueryBundle, metadata: dict) -> QueryBundle:
        query = check_query(query_bundle.query_str)
        if not query:
            return query_bundle
        docs = self.hyde.documents(query)
        embed = self.embed_model
        v = self.hyde.combine(query, docs, embed.get_query_embedding,
                               lambda texts: embed.get_text_embedding_batch(list(texts)))
        return QueryBundle(query_str=query_bundle.query_str, image_path=query_bundle.image_path,
                           custom_embedding_strs=[d for d in docs if d.strip()] or None,
                           embedding=[float(x) for x in v])


def _fusion_names(cls: type) -> list[str]:
    """The keywords a hybrid factory forwards to the retriever's constructor."""
    return [n for n in keyword_names(cls) if n not in ("sparse_retriever", "dense_retriever")]


class RepackPostprocessor(RepackFields, StagePostprocessor):
    """Reorder the final nodes (a :class:`~funnel_core.best_practices.repack.Repack`); put it last
    in ``node_postprocessors``."""


class ExtractiveCompressorPostprocessor(ExtractiveCompressorFields, StagePostprocessor):
    """Keep the sentences most similar to the query (paper section 3.7), in original order: an
    :class:`~funnel_core.best_practices.compress.ExtractiveCompressor`."""


class QueryClassifierGate(WarmUpMixin, BaseRetriever):
    """Retrieve only when the query needs it (paper section 3.1): for a query that ``classifier``
    (a trained :class:`~funnel_core.best_practices.classify.QueryClassifier`) labels "sufficient",
    ``retriever`` is not called and ``[]`` is returned, so a ``RetrieverQueryEngine`` answers from
    the request alone. ``last_decision``: the latest ``{"query", "needs_retrieval", "p_retrieval"}``.
    """

    @checked_keywords
    def __init__(self, retriever: BaseRetriever, classifier: QueryClassifier,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise TypeError(f"retriever must be a LlamaIndex BaseRetriever, got {type(retriever).__name__}.")
        self._retriever, self.classifier = retriever, QueryClassifier.check_trained(classifier)
        self.last_decision: Optional[dict] = None
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _decide(self, query: str) -> bool:
        self.last_decision = self.classifier.decide(query)
        return bool(self.last_decision["needs_retrieval"])

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return self._retriever.retrieve(query_bundle) if self._decide(query_bundle.query_str) else []

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        need = await asyncio.to_thread(self._decide, query_bundle.query_str)
        return await self._retriever.aretrieve(query_bundle) if need else []


class QueryClassifierQueryEngine(CustomQueryEngine):
    """Route a query to a RAG query engine or straight to the LLM.

    "retrieval" queries go to ``query_engine``; "sufficient" ones to ``llm.complete``. The
    response's ``metadata["needs_retrieval"]`` says which path answered.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    query_engine: BaseQueryEngine = Field(description="The retrieval-augmented query engine.")
    llm: LLM = Field(description="LLM that answers queries needing no retrieval.")
    classifier: QueryClassifier = Field(description="A trained QueryClassifier.")

    def __init__(self, **data: Any) -> None:
        check_accepted(type(self), data)  # a typo raises, naming the accepted fields
        super().__init__(**data)

    def model_post_init(self, __context: Any) -> None:
        QueryClassifier.check_trained(self.classifier)

    @staticmethod
    def _retrieved(resp: Any) -> Any:
        resp.metadata = {**(resp.metadata or {}), "needs_retrieval": True}
        return resp

    def custom_query(self, query_str: str) -> Any:
        if self.classifier.needs_retrieval(query_str):
            return self._retrieved(self.query_engine.query(query_str))
        return Response(str(self.llm.complete(query_str)), metadata={"needs_retrieval": False})

    async def acustom_query(self, query_str: str) -> Any:
        if await asyncio.to_thread(self.classifier.needs_retrieval, query_str):
            return self._retrieved(await self.query_engine.aquery(query_str))
        return Response(str(await self.llm.acomplete(query_str)), metadata={"needs_retrieval": False})

