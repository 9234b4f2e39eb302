"""Any LangChain chat model or LLM as a ``funnel_core`` LLM provider (for HyDE, RankRAG and
FB-RAG): text only, through ``model.batch`` / ``abatch``; a chat model gets a ``HumanMessage``."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel, BaseLanguageModel
from langchain_core.messages import BaseMessage, HumanMessage

from funnel_core.llm import LLM, as_llm, sampling_kwargs
from funnel_core.settings import checked_keywords

__all__ = ["LangChainLLM", "as_provider", "message_text"]  # stage_llm: for the adapters


def message_text(output: Any) -> str:
    """The text of a chat-model message (str or content blocks: its ``text``, the ``type: text``
    blocks joined) or of an LLM string output."""
    if isinstance(output, BaseMessage):
        return str(output.text)
    return output if isinstance(output, str) else str(output)


class LangChainLLM(LLM):
    """Wrap a LangChain ``BaseChatModel`` or ``BaseLLM`` (``timeout``: :class:`funnel_core.llm.LLM`).

    Args:
        pass_sampling_params: Bind the sampling settings to the model per call (off: each
            integration names them differently and many reject unknown ones).
        max_concurrency: ``max_concurrency`` for ``batch``/``abatch``.
    """

    @checked_keywords
    def __init__(self, model: BaseLanguageModel, *, pass_sampling_params: bool = False,
                 max_concurrency: int | None = None, timeout: float | None = None) -> None:
        super().__init__(timeout=timeout)
        if not isinstance(model, BaseLanguageModel):
            raise TypeError(f"LangChainLLM wraps a LangChain chat model or LLM, got "
                            f"{type(model).__name__}.")
        self.model = model
        self.pass_sampling_params = pass_sampling_params
        self.max_concurrency = max_concurrency

    def __repr__(self) -> str:
        return f"LangChainLLM({type(self.model).__name__})"

    def _batch_args(self, prompts: list[str], n: int, *sampling: Any) -> tuple[Any, list[Any], dict[str, Any]]:
        """The runnable, its inputs (each prompt ``n`` times) and its batch config."""
        model = self.model.bind(**sampling_kwargs(*sampling)) if self.pass_sampling_params else self.model
        chat = isinstance(self.model, BaseChatModel)
        inputs = [[HumanMessage(content=p)] if chat else p for p in prompts for _ in range(n)]
        return model, inputs, {"max_concurrency": self.max_concurrency} if self.max_concurrency else {}

    def _generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                  top_k: int, max_new_tokens: int) -> list[list[str]]:
        model, inputs, config = self._batch_args(prompts, n, temperature, top_p, top_k, max_new_tokens)
        return _regroup(model.batch(inputs, config=config), n)

    async def _agenerate(self, prompts: list[str], *, n: int, temperature: float,  # type: ignore[override]
                         top_p: float, top_k: int, max_new_tokens: int) -> list[list[str]]:
        model, inputs, config = self._batch_args(prompts, n, temperature, top_p, top_k, max_new_tokens)
        return _regroup(await model.abatch(inputs, config=config), n)


def _regroup(outputs: list[Any], n: int) -> list[list[str]]:
    """The texts of a flat batch, ``n`` per prompt."""
    texts = [message_text(o) for o in outputs]
    return [texts[i:i + n] for i in range(0, len(texts), n)]


def as_provider(model: Any, **kwargs: Any) -> LLM:
    """A funnel_core provider from a LangChain model, a funnel_core LLM, or a model name/folder."""
    if isinstance(model, BaseLanguageModel):
        return LangChainLLM(model, **kwargs)  # a keyword it does not take is named, not dropped
    return as_llm(model, **kwargs)


def stage_llm(llm: Any, timeout: float | None) -> Any:
    """An adapter's ``llm`` for its stage: a LangChain model wrapped with ``timeout``; a model
    name/folder or a funnel_core provider as it is."""
    return llm if isinstance(llm, (str, LLM)) else as_provider(llm, timeout=timeout)
