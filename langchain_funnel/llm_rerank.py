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

from funnel_core.config import RankRAGConfig, adapter_base
from funnel_core.forward import FORWARD_PROMPT, PRESETS, ForwardLookup, chunk_context
from funnel_core.llm import LLM
from funnel_core.units import Unit, text_digest
from langchain_funnel._base import StageCompressor, UnitRetriever, documents_to_units, units_to_documents
from langchain_funnel.llm import as_provider

__all__ = ["RankRAGReranker", "ForwardLookupRetriever"]


def _provider(llm: Any, timeout: Optional[float], gguf_file: Optional[str],
              device: Optional[str], **extra: Any) -> Any:
    kwargs: dict[str, Any] = {"timeout": timeout}
    if isinstance(llm, str):
        kwargs.update(gguf_file=gguf_file, device=device, **extra)
    return as_provider(llm, **kwargs)


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


class ForwardLookupRetriever(UnitRetriever):
    """FB-RAG Stages I-III as a LangChain retriever (``k`` = chunks returned).

    Candidates are the ``chunk_words``-word chunks of ``context`` or the documents that
    ``retriever`` returns. ``Document.metadata`` holds ``score`` (S_FB), ``backward_scores``,
    ``forward_scores``, ``samples`` and ``position``; documents come in their original order
    unless ``order_preserving=False``.

    Example::

        retriever = ForwardLookupRetriever(llm=chat_model, context=long_text, variant="FB", k=3)
        docs = retriever.invoke("Who wrote Hamlet?")
    """

    llm: Any = Field(description="LangChain chat model/LLM, funnel_core LLM, or a causal-LM name/folder.")
    context: Optional[Union[str, list[str]]] = Field(default=None, description="The long context.")
    retriever: Optional[BaseRetriever] = Field(default=None, description="Base retriever instead of context.")
    k: int = Field(default=3, description="Chunks returned.")
    variant: str = Field(default="FB", description="'FB' (Ours-FB), 'F' (Ours-F) or 'B' (BM25 only).")
    eta_backward: Optional[float] = Field(default=None, description="Overrides the variant's eta_B.")
    eta_forward: Optional[float] = Field(default=None, description="Overrides the variant's eta_F.")
    budget_words: Optional[int] = Field(default=None, description="Word budget of the selection.")
    budget_tokens: Optional[int] = Field(default=None, description="Token budget of the selection.")
    order_preserving: bool = Field(default=True, description="Return chunks in original order.")
    samples: int = Field(default=5, description="K outputs sampled by the light LLM.")
    temperature: float = Field(default=1.0)
    top_p: float = Field(default=0.9)
    top_k: int = Field(default=50)
    max_new_tokens: int = Field(default=128)
    prompt: str = Field(default=FORWARD_PROMPT, description="Template with {context} and {question}.")
    recall_k: int = Field(default=20, description="Stage I chunks the LLM reads.")
    reader_words: Optional[int] = Field(default=None, description="Cap on words the LLM reads.")
    chunk_words: int = Field(default=300, description="Chunk size in words.")
    timeout: Optional[float] = Field(default=None, description="Seconds per LLM call.")
    gguf_file: Optional[str] = Field(default=None)
    device: Optional[str] = Field(default=None)

    _forward: ForwardLookup = PrivateAttr()
    _units: Optional[list[Unit]] = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        if (self.context is None) == (self.retriever is None):
            raise ValueError("ForwardLookupRetriever needs exactly one of context= (a long text) "
                             "or retriever= (a base retriever).")
        if self.variant not in PRESETS:
            raise ValueError(f"unknown FB-RAG variant {self.variant!r}; choose one of {sorted(PRESETS)}.")
        eta_b, eta_f = PRESETS[self.variant]
        self._forward = ForwardLookup(
            llm=_provider(self.llm, self.timeout, self.gguf_file, self.device),
            eta_backward=eta_b if self.eta_backward is None else self.eta_backward,
            eta_forward=eta_f if self.eta_forward is None else self.eta_forward,
            budget_words=self.budget_words, budget_tokens=self.budget_tokens,
            order_preserving=self.order_preserving, samples=self.samples,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_new_tokens=self.max_new_tokens, prompt=self.prompt, recall_k=self.recall_k,
            reader_words=self.reader_words, chunk_words=self.chunk_words)
        if self.context is not None:
            self._units = chunk_context(self.context, self.chunk_words,
                                        id_prefix=f"chunk-{text_digest(self.context)}")

    @property
    def forward(self) -> ForwardLookup:
        """The ``funnel_core`` stage doing the work."""
        return self._forward

    def _search(self, query: str, k: int) -> list[Unit]:
        units = self._units
        if units is None:
            assert self.retriever is not None
            units = documents_to_units(self.retriever.invoke(query))
        return self._forward.search(query, units, k=k).units

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        if not query:
            return []
        units = self._units
        if units is None:
            assert self.retriever is not None
            units = documents_to_units(await self.retriever.ainvoke(query))
        return units_to_documents((await self._forward.asearch(query, units, k=k)).units)
