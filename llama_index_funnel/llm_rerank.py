"""LLM-driven retrieval for LlamaIndex: RankRAG reranking and FB-RAG forward lookup.

* :class:`RankRAGRerank` — node postprocessor: P("True") of an LLM judge per (query, node).
* :class:`ForwardLookupQueryTransform` — a ``BaseQueryTransform`` that samples K
  ``Rationale/Answer`` outputs and attaches them to the query bundle
  (:class:`ForwardLookupQueryBundle`; their texts also go to ``custom_embedding_strs`` so an
  embedding retriever behind a ``TransformRetriever`` searches with them).
* :class:`ForwardLookupRetriever` — FB-RAG Stages I-III over a long context or over the nodes
  of any base retriever; reuses the samples of a :class:`ForwardLookupQueryBundle`.

The LLM can be a LlamaIndex ``LLM`` (text only: RankRAG parses its replies), a ``funnel_core``
provider, or a hub name / folder of a local causal LM (RankRAG reads True/False logits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.llms.llm import LLM as LlamaIndexBaseLLM
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from funnel_core.config import (
    ForwardLookupConfig,
    ForwardVariantConfig,
    LLMProviderConfig,
    RankRAGConfig,
    adapter_base,
)
from funnel_core.errors import check_query
from funnel_core.fbrag import ForwardLookup, ForwardLookupResult, ForwardSample, chunk_context, variant_config
from funnel_core.funnel import warm_up_attributes
from funnel_core.units import Unit, text_digest
from llama_index_funnel._base import StagePostprocessor, nodes_to_units, units_to_nodes
from llama_index_funnel.llm import as_provider

__all__ = ["RankRAGRerank", "ForwardLookupQueryTransform", "ForwardLookupQueryBundle",
           "ForwardLookupRetriever"]


class RankRAGRerank(adapter_base(RankRAGConfig, StagePostprocessor,  # type: ignore[misc]
                                 defaults={"top_n": 5})):
    """RankRAG reranking as a LlamaIndex node postprocessor (sync + async, rerank events).

    The fields are those of :class:`funnel_core.config.RankRAGConfig`; ``llm`` may also be a
    LlamaIndex ``LLM``.

    Example::

        from llama_index.core.query_engine import RetrieverQueryEngine
        rerank = RankRAGRerank(llm=smollm2_path(), gguf_file=SMOLLM2_GGUF, top_n=5)
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    _llm_provider: Any = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "RankRAGRerank"

    def _model_name(self) -> str:
        return self.llm if isinstance(self.llm, str) else type(self.llm).__name__

    def _config_values(self) -> dict[str, Any]:
        values = super()._config_values()
        if isinstance(self.llm, LlamaIndexBaseLLM):  # converted once per (LLM, timeout)
            key = (id(self.llm), self.timeout)
            if self._llm_provider is None or self._llm_provider[0] != key:
                self._llm_provider = (key, as_provider(self.llm, timeout=self.timeout))
            values["llm"] = self._llm_provider[1]
        return values


@dataclass
class ForwardLookupQueryBundle(QueryBundle):
    """A ``QueryBundle`` carrying FB-RAG's forward-lookup samples (rationales and answers)."""

    samples: List[ForwardSample] = field(default_factory=list)
    reader_context: str = ""


def _forward(llm: Any, config: ForwardLookupConfig, provider: LLMProviderConfig) -> ForwardLookup:
    return ForwardLookup.from_settings(as_provider(llm, **provider.provider_kwargs(llm)), config)


class ForwardLookupQueryTransform(BaseQueryTransform):
    """FB-RAG Stage II as a query transform: sample K ``Rationale: ... Answer: ...`` outputs.

    The light LLM reads a context chosen, in this order, from: ``metadata["context"]`` of the
    ``run`` call; the nodes of ``retriever`` for the query; the BM25 Stage I chunks of
    ``context``; or nothing (closed-book lookup). The returned
    :class:`ForwardLookupQueryBundle` keeps ``query_str`` and adds the samples; with
    ``embed_samples`` the sample texts join the query in ``custom_embedding_strs``.

    Args:
        llm: LlamaIndex LLM, funnel_core LLM, or a local causal-LM name/folder.
        context: A long text (or list of texts) to read from.
        retriever: Any LlamaIndex retriever whose nodes the LLM reads instead.
        embed_samples: Put ``[query, R_1 A_1, ..., R_K A_K]`` in ``custom_embedding_strs``.

    The sampling and reading arguments (``samples``, ``temperature``, ``top_p``, ``top_k``,
    ``max_new_tokens``, ``prompt``, ``recall_k``, ``reader_words``, ``chunk_words``) are fields
    of :class:`funnel_core.config.ForwardLookupConfig`, passed as ``**settings``.
    """

    def __init__(self, llm: Any, *, context: str | Sequence[str] | None = None,
                 retriever: Optional[BaseRetriever] = None, embed_samples: bool = True,
                 **settings: Any) -> None:
        mine, settings = LLMProviderConfig.split(settings)
        provider = LLMProviderConfig(**mine)
        config = variant_config("F", **settings)  # Stage II reads: the forward side only
        self.forward = _forward(llm, config, provider)
        self.units = (chunk_context(context, config.chunk_words,
                                    id_prefix=f"chunk-{text_digest(context)}")
                      if context is not None else None)
        self.retriever = retriever
        self.embed_samples = embed_samples

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        return None

    def _context_for(self, query: str, metadata: Dict) -> str:
        if metadata.get("context"):
            return str(metadata["context"])
        if self.retriever is not None:
            nodes = self.retriever.retrieve(query)
            return "\n\n".join(n.node.get_content(MetadataMode.NONE) for n in nodes)
        if self.units is not None:
            stage1, _ = self.forward.recall(query, self.units)
            return self.forward.reader_context(stage1)
        return "(no context given: answer from what you know)"

    def _run(self, query_bundle: QueryBundle, metadata: Dict) -> QueryBundle:
        query = check_query(query_bundle.query_str)
        if not query:
            return query_bundle
        context = self._context_for(query, metadata or {})
        samples = self.forward.sample(query, context)
        strs = list(query_bundle.custom_embedding_strs or [query])
        if self.embed_samples:
            strs += [s.lookup_text for s in samples if s.lookup_text]
        return ForwardLookupQueryBundle(query_str=query_bundle.query_str,
                                        image_path=query_bundle.image_path,
                                        custom_embedding_strs=strs, embedding=None,
                                        samples=samples, reader_context=context)


class ForwardLookupRetriever(BaseRetriever):
    """FB-RAG Stages I-III as a LlamaIndex retriever.

    Candidates are the ``chunk_words``-word chunks of ``context``, or the nodes that
    ``retriever`` returns for the query. Each node's metadata holds ``backward_scores``,
    ``forward_scores``, ``samples`` and ``position``; ``score`` is S_FB. Given a
    :class:`ForwardLookupQueryBundle` (from :class:`ForwardLookupQueryTransform` in a
    ``TransformRetriever``), its samples are reused instead of sampling again.

    Args:
        llm: LlamaIndex LLM, funnel_core LLM, or a local causal-LM name/folder.
        context: A long text or a list of texts.
        retriever: A base retriever (instead of ``context``).
        callback_manager: LlamaIndex callback manager.
        **settings: The fields of :class:`funnel_core.config.ForwardVariantConfig` (``variant``:
            ``"FB"`` (Ours-FB, default), ``"F"`` (Ours-F) or ``"B"`` (BM25 only), whose weights
            ``eta_backward``/``eta_forward`` override; the provider's ``timeout``,
            ``gguf_file``, ``device`` when ``llm`` is a name) and of
            :class:`funnel_core.config.ForwardLookupConfig` (``k`` = chunks returned, 3 here;
            ``budget_words``, ``chunk_words``, sampling...).
    """

    def __init__(self, llm: Any, *, context: str | Sequence[str] | None = None,
                 retriever: Optional[BaseRetriever] = None,
                 callback_manager: Optional[CallbackManager] = None, **settings: Any) -> None:
        if (context is None) == (retriever is None):
            raise ValueError("ForwardLookupRetriever needs exactly one of context= (a long "
                             "text) or retriever= (a base retriever).")
        mine, settings = ForwardVariantConfig.split(settings)
        variant = ForwardVariantConfig(**mine)
        config = variant.stage_config(**{"k": 3, **settings})
        self.forward = _forward(llm, config, variant)
        self.units: Optional[list[Unit]] = (
            chunk_context(context, config.chunk_words, id_prefix=f"chunk-{text_digest(context)}")
            if context is not None else None)
        self.retriever = retriever
        super().__init__(callback_manager=callback_manager)

    def warm_up(self) -> "ForwardLookupRetriever":
        """Load the models of everything this retriever holds (see ``funnel_core`` ``Stage.warm_up``),
        e.g. at server start-up; returns ``self``."""
        return warm_up_attributes(self)

    @staticmethod
    def _samples(query_bundle: QueryBundle) -> Optional[list[ForwardSample]]:
        if isinstance(query_bundle, ForwardLookupQueryBundle) and query_bundle.samples:
            return list(query_bundle.samples)
        return None

    def _finish(self, res: ForwardLookupResult, originals: Sequence[Any]) -> List[NodeWithScore]:
        return units_to_nodes(res.units, originals)

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        originals: Sequence[Any] = ()
        units = self.units
        if units is None:
            assert self.retriever is not None
            originals = self.retriever.retrieve(QueryBundle(query_str=query))
            units = nodes_to_units(originals)
        return self._finish(self.forward.search(query, units, self._samples(query_bundle)),
                            originals)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        originals: Sequence[Any] = ()
        units = self.units
        if units is None:
            assert self.retriever is not None
            originals = await self.retriever.aretrieve(QueryBundle(query_str=query))
            units = nodes_to_units(originals)
        res = await self.forward.asearch(query, units, self._samples(query_bundle))
        return self._finish(res, originals)
