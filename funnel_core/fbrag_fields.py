"""The user-facing settings of FB-RAG's ``ForwardLookupRetriever``, declared once for LlamaIndex and LangChain.

:class:`ForwardLookupFields` lists the settings of :class:`~funnel_core.fbrag.ForwardLookup` as
pydantic fields (name, type, default, description), plus the adapters' own ``context`` and
``variant``; the LlamaIndex and the LangChain ``ForwardLookupRetriever`` both inherit it (first
in their bases), so editors, mypy and the docs see every field and each default is written once;
so do the settings of LlamaIndex's ``ForwardLookupQueryTransform`` (which may have no context).
``tests/adapters/test_adapter_fields.py`` checks every field against the stage's constructor.
It also holds what both adapters do alike with these fields: the weights that follow
``variant``, the chunks of ``context`` and the framework LLM wrapped for the stage
(:class:`~funnel_core.llm.AdapterLLM`). Imported only by the adapter packages: pydantic comes
with both frameworks, and the stage itself does not need it.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional, Union

from pydantic import BaseModel, Field, PrivateAttr

from funnel_core.fbrag import DEFAULT_K, ForwardLookup, chunk_context, variant_weights
from funnel_core.llm import LLM_DESCRIPTION, AdapterLLM
from funnel_core.units import Unit, text_digest

__all__ = ["ForwardLookupFields"]

#: The fields whose change moves the stage's two weights.
_WEIGHTS = ("variant", "eta_backward", "eta_forward")


class ForwardLookupFields(AdapterLLM, BaseModel):
    """The settings of :class:`~funnel_core.fbrag.ForwardLookup`, for both adapters' ``ForwardLookupRetriever``.

    ``variant`` picks the two weights (``"FB"``: 0.5 / 0.5, ``"F"``: 0 / 1, ``"B"``: 1 / 0);
    ``eta_backward``/``eta_forward`` left at ``None`` follow it, a number overrides it. An edit
    of any of the three sets both weights of the stage; an edit of ``chunk_words`` chunks
    ``context`` again at the next call.
    """

    stage_class: ClassVar[type] = ForwardLookup
    #: Whether exactly one of ``context`` and ``retriever`` is required (the LlamaIndex query
    #: transform takes either, both or neither: it can look forward closed-book).
    needs_candidates: ClassVar[bool] = True

    llm: Any = Field(description=LLM_DESCRIPTION)
    context: Optional[Union[str, list[str]]] = Field(
        default=None, description="The long context (a text or a list of texts) to chunk.")
    k: Optional[int] = Field(default=DEFAULT_K, description="Chunks returned.")
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

    _units_key: Any = PrivateAttr(default=None)
    _units: Optional[list[Unit]] = PrivateAttr(default=None)

    def _weights(self) -> tuple[float, float]:
        """``(eta_backward, eta_forward)`` of the stage: the variant's, each overridden by its field."""
        return variant_weights(self.variant, self.eta_backward, self.eta_forward)

    def _stage_value(self, name: str, value: Any) -> Any:
        if name in ("eta_backward", "eta_forward"):
            eta_b, eta_f = self._weights()
            return eta_b if name == "eta_backward" else eta_f
        return super()._stage_value(name, value)  # type: ignore[misc]

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "variant":
            variant_weights(value)  # validated before the field changes
        super().__setattr__(name, value)
        stage = (getattr(self, "__pydantic_private__", None) or {}).get("_stage")
        if name in _WEIGHTS and stage is not None:
            # the larger weight first: the stage refuses both weights at 0 on the way (B -> F)
            for key, eta in sorted(zip(("eta_backward", "eta_forward"), self._weights()),
                                   key=lambda pair: -pair[1]):
                setattr(stage, key, eta)

    def model_post_init(self, __context: Any) -> None:
        """Exactly one of ``context`` and the adapter's base ``retriever`` (a field of each
        adapter: its framework's retriever type; see :attr:`needs_candidates`); the context is chunked now, so an empty one
        raises here rather than at the first query. Then the adapter's stage is built."""
        if self.needs_candidates and (self.context is None) == (getattr(self, "retriever", None) is None):
            raise ValueError(f"{type(self).__name__} needs exactly one of context= (a long text) "
                             "or retriever= (a base retriever).")
        _ = self.units
        super().model_post_init(__context)

    @property
    def units(self) -> Optional[list[Unit]]:
        """The ``chunk_words``-word chunks of ``context`` (``None`` without a context)."""
        if self.context is None:
            return None
        key = (id(self.context), self.chunk_words)
        if self._units is None or key != self._units_key:
            self._units = chunk_context(self.context, self.chunk_words,
                                        id_prefix=f"chunk-{text_digest(self.context)}")
            self._units_key = key
        return self._units
