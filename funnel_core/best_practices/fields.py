"""The user-facing settings of the best-practice stages' adapters, declared once for LlamaIndex and LangChain.

Each model below lists the settings of one core stage as pydantic fields (name, type, default,
description); the LlamaIndex and the LangChain adapter of that stage both inherit it, so editors,
mypy and the docs see every field and each default is written once.
``tests/adapters/test_adapter_fields.py`` checks every field against the stage's constructor.
Imported only by the adapter packages: pydantic comes with both frameworks, and the stages
themselves do not need it.
"""

from __future__ import annotations

from typing import ClassVar, Optional

from pydantic import BaseModel, Field

from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.best_practices.repack import Repack

__all__ = ["RepackFields", "ExtractiveCompressorFields"]


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
    dtype: str = Field(
        default='auto', description='Precision of the embedding model: auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the hardware runs it natively).')
