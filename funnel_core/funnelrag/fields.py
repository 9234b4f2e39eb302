"""The user-facing settings of the FunnelRAG stages' adapters, declared once for LlamaIndex and LangChain.

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

from funnel_core.funnelrag.chunking import LaterChunking

__all__ = ["LaterChunkingFields"]


class LaterChunkingFields(BaseModel):
    """The settings of :class:`~funnel_core.funnelrag.chunking.LaterChunking`, for both adapters."""

    stage_class: ClassVar[type] = LaterChunking

    words: int = Field(default=100, description='Target passage size in words.')
    overlap: int = Field(default=0, description='Words repeated between consecutive passages.')
    level: str = Field(default='passage', description='Granularity name of the passages.')
    sentence_aware: bool = Field(default=True, description='End passages at sentence ends.')
    name: Optional[str] = Field(
        default=None, description='Stage name in traces (None: later_chunking(<words>w)).')
