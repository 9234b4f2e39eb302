"""LLM-driven retrieval for LangChain: RankRAG reranking and FB-RAG forward lookup.

* :class:`RankRAGReranker` — document compressor (and LCEL Runnable): P("True") of an LLM
  judge per (query, document).
* :class:`ForwardLookupRetriever` — FB-RAG Stages I-III over a long context or over the
  documents of any base retriever; ``k`` chunks (constructor or ``invoke(q, k=3)``), their
  forward/backward scores and the LLM samples in ``Document.metadata``.

The LLM can be a LangChain chat model or LLM (text only: RankRAG parses its replies), a
``funnel_core`` provider, or a hub name / folder of a local causal LM (RankRAG reads logits).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import Field, PrivateAttr

from funnel_core.config import ForwardLookupConfig, ForwardVariantConfig, RankRAGConfig, adapter_base
from funnel_core.fbrag import ForwardLookup, chunk_context
from funnel_core.llm import LLM
from funnel_core.units import Unit, text_digest
from langchain_funnel._base import StageCompressor, UnitRetriever, documents_to_units, units_to_documents
from langchain_funnel.llm import as_provider

__all__ = ["RankRAGReranker", "ForwardLookupRetriever"]


class RankRAGReranker(adapter_base(RankRAGConfig, StageCompressor,  # type: ignore[misc]
                                   defaults={"top_n": 5})):
    """RankRAG reranking as a LangChain document compressor; the fields are those of
    :class:`funnel_core.config.RankRAGConfig`, and ``llm`` may also be a LangChain model.

    Example::

        reranker = RankRAGReranker(llm=chat_model, top_n=3)
        retriever = FunnelRetriever.from_stages(bm25_retriever, reranker)
    """

    _llm_provider: Any = PrivateAttr(default=None)

    def _config_values(self) -> dict[str, Any]:
        values = super()._config_values()
        if not isinstance(self.llm, (str, LLM)):  # a LangChain model: converted once
            key = (id(self.llm), self.timeout)
            if self._llm_provider is None or self._llm_provider[0] != key:
                self._llm_provider = (key, as_provider(self.llm, timeout=self.timeout))
            values["llm"] = self._llm_provider[1]
        return values


class ForwardLookupRetriever(adapter_base(  # type: ignore[misc]
        ForwardLookupConfig, adapter_base(ForwardVariantConfig, UnitRetriever),
        exclude=("eta_backward", "eta_forward"), defaults={"k": 3})):
    """FB-RAG Stages I-III as a LangChain retriever (``k`` = chunks returned).

    Candidates are the ``chunk_words``-word chunks of ``context`` or the documents that
    ``retriever`` returns. ``metadata`` holds ``relevance_score`` (S_FB), ``funnel_backward_score``,
    ``funnel_forward_scores_json``, ``funnel_samples_json`` and ``funnel_position``; documents come in their original order
    unless ``order_preserving=False``. The settings are the fields of
    :class:`funnel_core.config.ForwardLookupConfig` and of
    :class:`funnel_core.config.ForwardVariantConfig` (``variant``, whose weights
    ``eta_backward``/``eta_forward`` override, and the provider's ``timeout``, ``gguf_file``,
    ``device``); edits are honoured at the next call.

    Example::

        retriever = ForwardLookupRetriever(llm=chat_model, context=long_text, variant="FB", k=3)
        docs = retriever.invoke("Who wrote Hamlet?")
    """

    llm: Any = Field(description="LangChain chat model/LLM, funnel_core LLM, or a causal-LM name/folder.")
    context: Optional[Union[str, list[str]]] = Field(default=None, description="The long context.")
    retriever: Optional[BaseRetriever] = Field(default=None, description="Base retriever instead of context.")

    _forward: Optional[ForwardLookup] = PrivateAttr(default=None)
    _provider_key: Any = PrivateAttr(default=None)
    _units_key: Any = PrivateAttr(default=None)
    _units: Optional[list[Unit]] = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        if (self.context is None) == (self.retriever is None):
            raise ValueError("ForwardLookupRetriever needs exactly one of context= (a long text) "
                             "or retriever= (a base retriever).")
        _ = self.forward  # validates every setting now

    @property
    def variant_config(self) -> ForwardVariantConfig:
        """The variant and provider settings of the current field values."""
        return ForwardVariantConfig(**{n: getattr(self, n)
                                       for n in ForwardVariantConfig.field_names()})

    @property
    def config(self) -> ForwardLookupConfig:
        """The core configuration from the current field values."""
        names = [n for n in ForwardLookupConfig.field_names()
                 if n not in ("eta_backward", "eta_forward")]
        return self.variant_config.stage_config(**{n: getattr(self, n) for n in names})

    @property
    def forward(self) -> ForwardLookup:
        """The ``funnel_core`` stage doing the work, for the current settings."""
        config, provider = self.config, self.variant_config
        key = (id(self.llm), provider.timeout, provider.gguf_file, provider.device)
        fwd = self._forward
        if fwd is None or key != self._provider_key:
            fwd = ForwardLookup.from_settings(
                as_provider(self.llm, **provider.provider_kwargs(self.llm)), config)
        elif fwd.config != config:
            fwd = ForwardLookup.from_settings(fwd.llm, config)  # same provider, new settings
        self._forward, self._provider_key = fwd, key
        return fwd

    @property
    def units(self) -> Optional[list[Unit]]:
        """The chunks of ``context`` (``None`` with a base retriever)."""
        if self.context is None:
            return None
        key = (id(self.context), self.chunk_words)
        if self._units is None or key != self._units_key:
            self._units = chunk_context(self.context, self.chunk_words,
                                        id_prefix=f"chunk-{text_digest(self.context)}")
            self._units_key = key
        return self._units

    def _search(self, query: str, k: int) -> list[Unit]:
        units = self.units
        if units is None:
            assert self.retriever is not None
            units = documents_to_units(self.retriever.invoke(query))
        return self.forward.search(query, units, k=k).units

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        if not query:
            return []
        units = self.units
        if units is None:
            assert self.retriever is not None
            units = documents_to_units(await self.retriever.ainvoke(query))
        return units_to_documents((await self.forward.asearch(query, units, k=k)).units)
