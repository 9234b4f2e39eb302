"""The user-facing settings of the best-practice stages' adapters, declared once for LlamaIndex and LangChain.

Each model below lists the settings of one core stage as pydantic fields (name, type, default,
description); the LlamaIndex and the LangChain adapter of that stage both inherit it, so editors,
mypy and the docs see every field and each default is written once.
``tests/adapters/test_adapter_fields.py`` checks every field against the stage's constructor.
Imported only by the adapter packages: pydantic comes with both frameworks, and the stages
themselves do not need it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from pydantic import BaseModel, Field

from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.best_practices.fusion import check_fusion_config
from funnel_core.best_practices.repack import Repack

__all__ = ["RepackFields", "ExtractiveCompressorFields", "FusionFields", "FUSION_SETTINGS", "HYBRID_CANDIDATES"]

#: The fusion settings of :class:`~funnel_core.best_practices.fusion.HybridRetrieve` that both
#: frameworks' ``HybridRetriever`` offer (their sides are framework retrievers, not stages).
FUSION_SETTINGS = ("alpha", "method", "normalization", "rrf_k")
#: Units each side fetches in the ``HybridRetriever`` factories that build both sides.
HYBRID_CANDIDATES = 20


class FusionFields(BaseModel):
    """The fusion settings of :class:`~funnel_core.best_practices.fusion.HybridRetrieve`, for
    both frameworks' ``HybridRetriever``: LangChain's inherits the fields, LlamaIndex's (not a
    pydantic model) takes their defaults. Validated together (:func:`check_fusion_config`) at
    construction and at every assignment, before the field changes."""

    alpha: float = Field(
        default=0.3, description="Sparse weight in S_h = alpha * S_sparse + S_dense, in [0, 1] (method='alpha').")
    method: str = Field(
        default='alpha', description='alpha (weighted sum of normalised scores) or rrf (reciprocal rank fusion).')
    normalization: str = Field(
        default='minmax', description="Score normalisation of each side for method='alpha': minmax, zscore or none.")
    rrf_k: int = Field(default=60, description="RRF constant (method='rrf'; Cormack et al.: 60).")

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        check_fusion_config(self.method, self.alpha, self.normalization, self.rrf_k)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in FUSION_SETTINGS:
            check_fusion_config(**{**{n: getattr(self, n) for n in FUSION_SETTINGS}, name: value})
        super().__setattr__(name, value)


class RepackFields(BaseModel):
    """The settings of :class:`~funnel_core.best_practices.repack.Repack`, for both adapters."""

    stage_class: ClassVar[type] = Repack

    order: str = Field(default="reverse", description="forward, reverse (best last, next to the "
                                                      "question) or sides.")
    name: Optional[str] = Field(default=None, description="Stage name in traces (None: repack).")


class ExtractiveCompressorFields(BaseModel):
    """The settings of :class:`~funnel_core.best_practices.compress.ExtractiveCompressor`, for both adapters."""

    stage_class: ClassVar[type] = ExtractiveCompressor

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
    embedder: Optional[Any] = Field(
        default=None, exclude=True, description="A loaded SentenceEmbedder to share (None: one is built from "
                                                "model, batch_size, device and dtype on first use).")
    dtype: str = Field(
        default='auto', description='Precision of the embedding model: auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively).')
