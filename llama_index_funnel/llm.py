"""Any LlamaIndex ``LLM`` as a ``funnel_core`` LLM provider (for RankRAG, FB-RAG and HyDE)."""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.llms.llm import LLM as LlamaIndexBaseLLM

from funnel_core.llm import LLM, as_llm, sampling_kwargs
from funnel_core.settings import checked_keywords

__all__ = ["LlamaIndexLLM", "as_provider"]  # stage_llm: for the adapters


class LlamaIndexLLM(LLM):
    """Wrap a LlamaIndex ``LLM`` (OpenAI, Ollama, ``MockLLM``...): text only (RankRAG parses its
    replies); a chat model gets the prompt as one user message. ``pass_sampling_params``: forward
    ``temperature``/``top_p``/``top_k``/``max_tokens`` per call (off: LlamaIndex integrations
    configure sampling on the LLM and many reject call arguments). ``n`` completions are ``n``
    calls per prompt (concurrent on the async path).
    """

    @checked_keywords
    def __init__(self, llm: LlamaIndexBaseLLM, *, pass_sampling_params: bool = False,
                 timeout: float | None = None) -> None:
        super().__init__(timeout=timeout)
        if not isinstance(llm, LlamaIndexBaseLLM):
            raise TypeError(f"LlamaIndexLLM wraps a llama_index LLM, got {type(llm).__name__}.")
        self.llm = llm
        self.pass_sampling_params = pass_sampling_params

    def __repr__(self) -> str:
        return f"LlamaIndexLLM({type(self.llm).__name__})"

    def _kwargs(self, temperature: float, top_p: float, top_k: int,
                max_new_tokens: int) -> dict[str, Any]:
        return sampling_kwargs(temperature, top_p, top_k, max_new_tokens) if self.pass_sampling_params else {}

    def _is_chat(self) -> bool:
        return bool(getattr(self.llm.metadata, "is_chat_model", False))

    def _one(self, prompt: str, kw: dict[str, Any]) -> str:
        if self._is_chat():
            resp = self.llm.chat([ChatMessage(role=MessageRole.USER, content=prompt)], **kw)
            return resp.message.content or ""
        return self.llm.complete(prompt, **kw).text

    async def _aone(self, prompt: str, kw: dict[str, Any]) -> str:
        if self._is_chat():
            resp = await self.llm.achat([ChatMessage(role=MessageRole.USER, content=prompt)], **kw)
            return resp.message.content or ""
        return (await self.llm.acomplete(prompt, **kw)).text

    def _generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                  top_k: int, max_new_tokens: int) -> list[list[str]]:
        kw = self._kwargs(temperature, top_p, top_k, max_new_tokens)
        return [[self._one(p, kw) for _ in range(n)] for p in prompts]

    async def _agenerate(self, prompts: list[str], *, n: int, temperature: float,  # type: ignore[override]
                         top_p: float, top_k: int, max_new_tokens: int) -> list[list[str]]:
        kw = self._kwargs(temperature, top_p, top_k, max_new_tokens)
        flat = await asyncio.gather(*(self._aone(p, kw) for p in prompts for _ in range(n)))
        return [list(flat[i * n:(i + 1) * n]) for i in range(len(prompts))]


def as_provider(llm: Any, **kwargs: Any) -> LLM:
    """A funnel_core provider from a LlamaIndex LLM, a funnel_core LLM, or a model name/folder."""
    if isinstance(llm, LlamaIndexBaseLLM):
        return LlamaIndexLLM(llm, **kwargs)  # a keyword it does not take is named, not dropped
    return as_llm(llm, **kwargs)


def stage_llm(llm: Any, timeout: float | None) -> Any:
    """What an adapter hands its stage as ``llm``: a LlamaIndex ``LLM`` wrapped as a funnel_core
    provider with ``timeout``; anything else (a model name/folder, a funnel_core provider) as it
    is (the stage builds or keeps it)."""
    return as_provider(llm, timeout=timeout) if isinstance(llm, LlamaIndexBaseLLM) else llm
