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

from typing import Any, Callable, ClassVar, Optional, Union

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import Field, PrivateAttr

from funnel_core.fbrag import ForwardLookup, chunk_context, variant_weights
from funnel_core.llm import LLM
from funnel_core.rerank.fields import RankRAGFields
from funnel_core.settings import StageAdapter
from funnel_core.units import Unit, text_digest
from langchain_funnel._base import StageCompressor, UnitRetriever, documents_to_units, units_to_documents
from langchain_funnel.llm import as_provider

__all__ = ["RankRAGReranker", "ForwardLookupRetriever"]


def _provider(llm: Any, timeout: Optional[float]) -> Any:
    """A LangChain model wrapped as a funnel_core provider; a name or a provider as it is."""
    return llm if isinstance(llm, (str, LLM)) else as_provider(llm, timeout=timeout)


class RankRAGReranker(RankRAGFields, StageCompressor):
    """RankRAG reranking as a LangChain document compressor: a
    :class:`~funnel_core.rerank.rankrag.RankRAGScorer`; ``llm`` may also be a LangChain model.

    Example::

        reranker = RankRAGReranker(llm=chat_model, top_n=3)
        retriever = FunnelRetriever.from_stages(bm25_retriever, reranker)
    """

    llm: Any = Field(description="LangChain chat model/LLM, funnel_core LLM provider, or a "
                                 "causal-LM name/folder.")

    def _stage_value(self, name: str, value: Any) -> Any:
        return _provider(value, self.timeout) if name == "llm" else value

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "timeout" and not isinstance(self.llm, (str, LLM)):
            self.stage.llm = self._stage_value("llm", self.llm)  # the new timeout


class ForwardLookupRetriever(StageAdapter, UnitRetriever):
    """FB-RAG Stages I-III as a LangChain retriever (``k`` = chunks returned): a
    :class:`~funnel_core.fbrag.ForwardLookup`.

    Candidates are the ``chunk_words``-word chunks of ``context`` or the documents that
    ``retriever`` returns. ``metadata`` holds ``relevance_score`` (S_FB), ``funnel_backward_score``,
    ``funnel_forward_scores_json``, ``funnel_samples_json`` and ``funnel_position``; documents
    come in their original order unless ``order_preserving=False``. ``variant`` picks the weights
    (``"FB"``, ``"F"``, ``"B"``); ``eta_backward``/``eta_forward`` override them. Edits are
    honoured at the next call.

    Example::

        retriever = ForwardLookupRetriever(llm=chat_model, context=long_text, variant="FB", k=3)
        docs = retriever.invoke("Who wrote Hamlet?")
    """

    stage_class: ClassVar[type] = ForwardLookup

    llm: Any = Field(description="LangChain chat model/LLM, funnel_core LLM, or a causal-LM name/folder.")
    context: Optional[Union[str, list[str]]] = Field(default=None, description="The long context.")
    retriever: Optional[BaseRetriever] = Field(default=None, description="Base retriever instead of context.")
    k: Optional[int] = Field(default=3, description="Chunks returned.")
    variant: str = Field(default="FB", description="FB (Ours-FB), F (Ours-F) or B (BM25 only).")
    eta_backward: Optional[float] = Field(
        default=None, description="Overrides the variant's weight of the backward score.")
    eta_forward: Optional[float] = Field(
        default=None, description="Overrides the variant's weight of the forward score.")
    samples: int = Field(default=5, description='K outputs sampled by the light LLM.')
    temperature: float = Field(default=1.0, description='Sampling temperature.')
    top_p: float = Field(default=0.9, description='Nucleus sampling mass.')
    top_k: int = Field(default=50, description='Top-k sampling.')
    max_new_tokens: int = Field(default=128, description='Tokens per sampled output.')
    prompt: Optional[str] = Field(
        default=None, description='Template with {context} and {question}; None = FORWARD_PROMPT.')
    recall_k: int = Field(default=20, description='Stage I chunks the light LLM reads.')
    reader_words: Optional[int] = Field(
        default=None, description='Cap on the words the light LLM reads.')
    budget_words: Optional[int] = Field(default=None, description='Word budget of the selection.')
    budget_tokens: Optional[int] = Field(default=None, description='Token budget of the selection.')
    order_preserving: bool = Field(
        default=True, description='Return chunks in their original order.')
    normalize: bool = Field(
        default=True, description='Divide each BM25 score vector by its maximum before weighting.')
    chunk_words: int = Field(default=300, description='Chunk size in words.')
    bm25: Optional[dict[str, Any]] = Field(
        default=None, description='BM25 settings of Stage I and the backward score.')
    name: Optional[str] = Field(default=None, description='Stage name in traces.')

    token_counter: Optional[Callable[[str], int]] = Field(
        default=None, exclude=True, description="f(text) -> tokens for budget_tokens (None: "
                                                "whitespace tokens).")
    timeout: Optional[float] = Field(default=None, description="Seconds per LLM call.")
    gguf_file: Optional[str] = Field(default=None, description="GGUF file, when llm is a name.")
    device: Optional[str] = Field(default=None, description="Torch device, when llm is a name.")
    dtype: str = Field(default="auto", description="Weights of the local model, when llm is a name.")

    _stage: Optional[ForwardLookup] = PrivateAttr(default=None)
    _units_key: Any = PrivateAttr(default=None)
    _units: Optional[list[Unit]] = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        if (self.context is None) == (self.retriever is None):
            raise ValueError("ForwardLookupRetriever needs exactly one of context= (a long text) "
                             "or retriever= (a base retriever).")
        super().model_post_init(__context)  # builds (and validates) the stage

    def _stage_value(self, name: str, value: Any) -> Any:
        if name == "llm":
            return _provider(value, self.timeout)
        if name in ("eta_backward", "eta_forward"):
            eta_b, eta_f = variant_weights(self.variant, self.eta_backward, self.eta_forward)
            return eta_b if name == "eta_backward" else eta_f
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "variant":
            variant_weights(value)  # validated before the field changes
        super().__setattr__(name, value)
        if name in ("variant", "eta_backward", "eta_forward"):  # both weights follow
            eta_b, eta_f = variant_weights(self.variant, self.eta_backward, self.eta_forward)
            self.stage.eta_backward, self.stage.eta_forward = eta_b, eta_f
        elif name == "timeout" and not isinstance(self.llm, (str, LLM)):
            self.stage.llm = _provider(self.llm, self.timeout)

    @property
    def forward(self) -> ForwardLookup:
        """The ``funnel_core`` stage doing the work."""
        return self.stage

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
