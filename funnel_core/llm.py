"""One small interface to the LLMs that RankRAG and FB-RAG use inside retrieval.

A provider is an :class:`LLM`. Three providers exist:

* :class:`TransformersLLM` (here) — a local causal LM from a hub name or a folder, GGUF files
  included (``gguf_file=``), with the tokenizer's chat template, left padding, batching, a
  device, sampling parameters and *next-token log-probabilities* (what RankRAG needs for its
  one-forward-pass True/False score);
* ``llama_index_funnel.llm.LlamaIndexLLM`` — any LlamaIndex ``LLM``;
* ``langchain_funnel.llm.LangChainLLM`` — any LangChain chat model or LLM.

Subclasses implement :meth:`LLM._generate` (and optionally :meth:`LLM._next_token_logprobs`);
the public methods add the same failure policy for every provider:

* arguments are checked (``n >= 1``, ``0 <= top_p <= 1``, ...) before anything runs;
* a provider exception becomes an :class:`LLMError` that names the provider and the batch;
* with ``timeout=`` seconds, a call that takes longer raises :class:`LLMTimeoutError`;
* a result of the wrong shape (a prompt without its ``n`` texts) raises :class:`LLMError`.

A call either returns every output or raises: callers (rerankers, FB-RAG) compute all their
scores before they build a single result, so a failing provider never leaves a half-scored list.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import string
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from funnel_core import counters
from funnel_core.errors import FunnelError, check_positive_int, check_probability
from funnel_core.hardware import normalize_dtype, resolve_dtype
from funnel_core.models import (
    SMOLLM2_GGUF,
    LazyModel,
    gguf_model_kwargs,
    load_pretrained,
    resolve_device,
    smollm2_path,
    tokenizer_lock,
)

__all__ = ["LLM", "LLMError", "LLMTimeoutError", "TransformersLLM", "as_llm", "logsumexp", "check_prompt_template",
           "sampling_kwargs", "AdapterLLM", "LLM_DESCRIPTION"]


class LLMError(FunnelError, RuntimeError):
    """A language-model provider failed or returned something unusable."""


class LLMTimeoutError(LLMError, TimeoutError):
    """A language-model call took longer than the provider's ``timeout``."""


def logsumexp(values: Sequence[float]) -> float:
    """Stable ``log(sum(exp(v)))``; ``-inf`` for an empty sequence."""
    values = [v for v in values if v != -math.inf]
    if not values:
        return -math.inf
    m = max(values)
    return m + math.log(math.fsum(math.exp(v - m) for v in values))


def sampling_kwargs(temperature: float, top_p: float, top_k: int, max_new_tokens: int) -> dict[str, Any]:
    """The sampling settings as the frameworks' LLM calls name them (``temperature``,
    ``max_tokens``; ``top_p`` below 1 and ``top_k`` above 0 only): what the LlamaIndex and
    LangChain providers pass on when asked to (``pass_sampling_params=True``)."""
    kw: dict[str, Any] = {"temperature": temperature, "max_tokens": max_new_tokens}
    if top_p < 1.0:
        kw["top_p"] = top_p
    if top_k > 0:
        kw["top_k"] = top_k
    return kw


def _check_prompts(prompts: Any) -> list[str]:
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of strings, got a single str; wrap it in a list.")
    prompts = list(prompts)
    for p in prompts:
        if not isinstance(p, str):
            raise TypeError(f"every prompt must be a str, got {type(p).__name__} ({p!r:.60}).")
    return prompts


class LLM(ABC):
    """A text-generation provider.

    Every successful :meth:`generate` / :meth:`next_token_logprobs` adds its prompts to
    ``llm_calls`` in :mod:`funnel_core.counters`; :class:`TransformersLLM` also adds the prompt
    tokens it read and the completion tokens it generated.

    Args:
        timeout: Seconds one call (one batch) may take; ``None`` waits forever. On timeout the
            call raises :class:`LLMTimeoutError` and its (late) result is discarded.
    """

    #: Whether :meth:`next_token_logprobs` is available (local models); text-only providers
    #: (remote chat APIs) leave it ``False`` and callers fall back to generate-and-parse.
    supports_logprobs: bool = False

    def __init__(self, *, timeout: float | None = None) -> None:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or timeout <= 0):
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}.")
        self.timeout = timeout

    # -- to implement ----------------------------------------------------------------------
    @abstractmethod
    def _generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                  top_k: int, max_new_tokens: int) -> list[list[str]]:
        """``n`` completions for each prompt (the prompt is the user message)."""

    def _next_token_logprobs(self, prompts: list[str],
                             candidates: list[str]) -> list[list[float]]:
        raise NotImplementedError

    async def _agenerate(self, prompts: list[str], **params: Any) -> list[list[str]]:
        """Async twin; by default :meth:`_generate` in a worker thread."""
        return await asyncio.to_thread(self._generate, prompts, **params)

    # -- public API ------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str], *, n: int = 1, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, max_new_tokens: int = 64) -> list[list[str]]:
        """Generate ``n`` completions per prompt.

        Args:
            prompts: User messages (a chat template is applied by providers that have one).
            n: Completions per prompt (FB-RAG samples K = 5).
            temperature: 0 means greedy decoding (``n`` equal outputs for local models).
            top_p: Nucleus-sampling mass (1.0 disables it).
            top_k: Top-k sampling (0 disables it).
            max_new_tokens: Maximum length of each completion, in tokens.

        Returns:
            ``len(prompts)`` lists of ``n`` strings each.

        Raises:
            LLMError: the provider failed or returned the wrong number of outputs.
            LLMTimeoutError: the call took longer than ``timeout``.
        """
        prompts = _check_prompts(prompts)
        params = self._check_params(n, temperature, top_p, top_k, max_new_tokens)
        if not prompts:
            return []
        out = self._guarded("generate", len(prompts), lambda: self._generate(prompts, **params))
        out = self._check_shape(out, len(prompts), n)
        counters.add(llm_calls=len(prompts))
        return out

    async def agenerate(self, prompts: Sequence[str], *, n: int = 1, temperature: float = 0.0,
                        top_p: float = 1.0, top_k: int = 0,
                        max_new_tokens: int = 64) -> list[list[str]]:
        """Async twin of :meth:`generate` (same checks, errors and timeout)."""
        prompts = _check_prompts(prompts)
        params = self._check_params(n, temperature, top_p, top_k, max_new_tokens)
        if not prompts:
            return []
        try:
            coro = self._agenerate(prompts, **params)
            out = await (asyncio.wait_for(coro, self.timeout) if self.timeout else coro)
        except asyncio.TimeoutError as exc:
            raise LLMTimeoutError(self._timeout_message("generate", len(prompts))) from exc
        except LLMError:
            raise
        except Exception as exc:
            raise LLMError(self._failure_message("generate", len(prompts), exc)) from exc
        out = self._check_shape(out, len(prompts), n)
        counters.add(llm_calls=len(prompts))
        return out

    def next_token_logprobs(self, prompts: Sequence[str],
                            candidates: Sequence[str]) -> list[list[float]]:
        """Log-probability of each candidate being the *first token* of the answer.

        One forward pass per batch, no generation. A candidate's probability sums over its
        spellings with and without a leading space (``"True"`` / ``" True"``).

        Returns:
            ``len(prompts)`` lists of ``len(candidates)`` log-probabilities.

        Raises:
            NotImplementedError: the provider exposes text only (see :attr:`supports_logprobs`).
        """
        if not self.supports_logprobs:
            raise NotImplementedError(
                f"{type(self).__name__} exposes generated text only, not token log-probabilities; "
                "use generate() and parse the answer (RankRAGScorer(mode='generate') does this).")
        prompts = _check_prompts(prompts)
        candidates = _check_prompts(candidates)
        if not candidates:
            raise ValueError("candidates must name at least one answer word, e.g. ['True', 'False'].")
        if not prompts:
            return []
        out = self._guarded("next_token_logprobs", len(prompts),
                            lambda: self._next_token_logprobs(prompts, candidates))
        if len(out) != len(prompts) or any(len(row) != len(candidates) for row in out):
            raise LLMError(f"{self!r} returned log-probabilities of the wrong shape for "
                           f"{len(prompts)} prompts x {len(candidates)} candidates.")
        counters.add(llm_calls=len(prompts))
        return [[float(v) for v in row] for row in out]

    # -- policy ----------------------------------------------------------------------------
    @staticmethod
    def _check_params(n: int, temperature: float, top_p: float, top_k: int,
                      max_new_tokens: int) -> dict[str, Any]:
        check_positive_int(n, "n (completions per prompt)")
        check_positive_int(max_new_tokens, "max_new_tokens")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {temperature!r}.")
        check_probability(top_p, "top_p")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {top_k!r}.")
        return dict(n=n, temperature=float(temperature), top_p=float(top_p), top_k=top_k,
                    max_new_tokens=max_new_tokens)

    def _timeout_message(self, what: str, n_prompts: int) -> str:
        return (f"{self!r} did not finish {what} for a batch of {n_prompts} prompt(s) within "
                f"timeout={self.timeout}s; raise the timeout, lower batch_size/max_new_tokens, "
                "or use a faster provider. Nothing was scored.")

    def _failure_message(self, what: str, n_prompts: int, exc: BaseException) -> str:
        return (f"{self!r} failed during {what} for a batch of {n_prompts} prompt(s): "
                f"{type(exc).__name__}: {exc}. Nothing was scored.")

    def _guarded(self, what: str, n_prompts: int, fn: Any) -> Any:
        try:
            if self.timeout is None:
                return fn()
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                         thread_name_prefix="funnel-llm")
            try:
                return pool.submit(fn).result(timeout=self.timeout)
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
        except concurrent.futures.TimeoutError as exc:
            raise LLMTimeoutError(self._timeout_message(what, n_prompts)) from exc
        except (LLMError, NotImplementedError):
            raise
        except Exception as exc:
            raise LLMError(self._failure_message(what, n_prompts, exc)) from exc

    def _check_shape(self, out: Any, n_prompts: int, n: int) -> list[list[str]]:
        if not isinstance(out, list) or len(out) != n_prompts:
            raise LLMError(f"{self!r} returned {len(out) if isinstance(out, list) else type(out).__name__}"
                           f" outputs for {n_prompts} prompts.")
        clean = []
        for row in out:
            if len(row) != n:
                raise LLMError(f"{self!r} returned {len(row)} completions for a prompt, expected n={n}.")
            clean.append([str(t) for t in row])
        return clean

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


#: What ``funnel train`` records beside LoRA adapters kept alone: the dtype of the base weights
#: they were trained over (``{"base_dtype": "bfloat16"}``).
ADAPTER_FILE = "funnel_adapter.json"


def lora_base(path: str) -> tuple[str, str | None, str | None] | None:
    """``(base model, GGUF file, base dtype)`` of a folder of LoRA adapters
    (``adapter_config.json``, as ``funnel train`` writes with ``merge = false``): the base it
    names (``"smollm2"``: the packaged SmolLM2) and the dtype of the base weights the adapters
    were trained over (:data:`ADAPTER_FILE`; ``None`` when not recorded); ``None`` when ``path``
    is no such folder."""
    folder = Path(path)
    if not (folder / "adapter_config.json").is_file():
        return None
    base = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{str(folder / 'adapter_config.json')!r} names no base model (base_model_name_or_path); "
                         "set it to the model the adapters were trained on.")
    recorded = folder / ADAPTER_FILE
    base_dtype = json.loads(recorded.read_text(encoding="utf-8")).get("base_dtype") if recorded.is_file() else None
    if base == "smollm2":
        return str(smollm2_path()), SMOLLM2_GGUF, base_dtype
    return str(base), None, base_dtype


class TransformersLLM(LLM):
    """A local causal LM through ``transformers`` (loaded lazily, on first use).

    Args:
        model_name_or_path: Hub name or local folder.
        gguf_file: Name of a GGUF file inside that folder (dequantised on load), e.g.
            ``funnel_core.testing.SMOLLM2_GGUF``.
        device: ``"cpu"``, ``"cuda"``, ... (``None`` picks CUDA, then MPS, then CPU).
        batch_size: Prompts per forward pass / ``generate`` call.
        max_length: Longest prompt in tokens; longer prompts lose their *start* (left truncation
            keeps the question and the answer slot that end every prompt of this package).
        system_prompt: Optional system message for chat templates.
        use_chat_template: Wrap prompts in the tokenizer's chat template when it has one.
        dtype: ``"auto"`` (default; :mod:`funnel_core.hardware`): the weights are loaded in
            bfloat16 only where the hardware runs it natively (AVX-512-BF16/AMX CPUs, GPUs of
            compute capability >= 8), in float16 on older GPUs, in float32 otherwise. float16 is
            never used on a CPU (float32 instead, with a warning); an explicit bf16 request on
            hardware without native bf16 warns once. :attr:`active_dtype` is what it resolved
            to. Whatever the weights, :meth:`next_token_logprobs` computes the last position's
            vocabulary logits in float32 (a half-precision head gives them in steps of 1/16 to
            1/8, and True/False scores tie).
        seed: Seed for sampling (``None`` leaves torch's global generator alone).
        timeout: See :class:`LLM`.

    Example::

        from funnel_core.models import smollm2_path, SMOLLM2_GGUF
        llm = TransformersLLM(smollm2_path(), gguf_file=SMOLLM2_GGUF)
        llm.generate(["What is BM25?"], n=2, temperature=0.7, top_p=0.9, top_k=50)
    """

    supports_logprobs = True

    def __init__(self, model_name_or_path: str, *, gguf_file: str | None = None,
                 device: str | None = None, batch_size: int = 8, max_length: int = 2048,
                 system_prompt: str | None = None, use_chat_template: bool = True,
                 seed: int | None = None,
                 timeout: float | None = None, dtype: str = "auto") -> None:
        super().__init__(timeout=timeout)
        if not isinstance(model_name_or_path, str) or not model_name_or_path.strip():
            raise TypeError(f"model_name_or_path must be a hub name or folder, got {model_name_or_path!r}.")
        self.model_name_or_path = model_name_or_path
        self.gguf_file = gguf_file
        self.device = device
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.max_length = check_positive_int(max_length, "max_length")
        self.system_prompt = system_prompt
        self.use_chat_template = use_chat_template
        self.dtype = normalize_dtype(dtype)
        self.seed = seed
        self._model = LazyModel(self._load)

    def __repr__(self) -> str:
        gguf = f", gguf_file={self.gguf_file!r}" if self.gguf_file else ""
        return f"TransformersLLM({self.model_name_or_path!r}{gguf})"

    # -- loading ---------------------------------------------------------------------------
    def _load(self) -> tuple[Any, Any, str]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(self.device)
        base = lora_base(self.model_name_or_path) if self.gguf_file is None else None
        source, gguf, base_dtype = base or (self.model_name_or_path, self.gguf_file, None)
        extra = {"gguf_file": gguf} if gguf else {}
        what = "causal LM" + (f" (GGUF file {gguf!r})" if gguf else "")
        tokenizer = load_pretrained(AutoTokenizer.from_pretrained, self.model_name_or_path if base else source,
                                    what=f"tokenizer of the {what}", padding_side="left",
                                    truncation_side="left", **({} if base else extra))
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        active = resolve_dtype(self.dtype, device)
        loader: Any = AutoModelForCausalLM.from_pretrained  # its decorated type hides the signature
        model = load_pretrained(loader, source, what=what, dtype=getattr(torch, base_dtype or active),
                                **gguf_model_kwargs(gguf))
        if base:  # LoRA adapters: merged into the base as it was in training, then in the active dtype
            from peft import PeftModel

            model = load_pretrained(lambda path: PeftModel.from_pretrained(model, path), self.model_name_or_path,
                                    what="LoRA adapters").merge_and_unload().to(getattr(torch, active))
        model.to(device).eval()
        model._funnel_dtype = active  # read by active_dtype
        if model.generation_config.pad_token_id is None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
        return model, tokenizer, device

    @property
    def tokenizer(self) -> Any:
        return self._model.get()[1]

    @property
    def active_dtype(self) -> str | None:
        """The dtype of the loaded weights (``None`` until loaded)."""
        return getattr(self._model.get()[0], "_funnel_dtype", None) if self._model.loaded else None

    def format_prompt(self, prompt: str) -> str:
        """The exact text the model reads for ``prompt`` (chat template applied if any)."""
        tokenizer = self.tokenizer
        if self.use_chat_template and getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": prompt}]
            if self.system_prompt:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return prompt

    def _encode(self, prompts: list[str]) -> Any:
        model, tokenizer, device = self._model.get()
        texts = [self.format_prompt(p) for p in prompts]
        with tokenizer_lock(tokenizer):
            enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True,
                            max_length=self.max_length, add_special_tokens=False)
        counters.add(llm_prompt_tokens=int(enc["attention_mask"].sum()))
        return {k: v.to(device) for k, v in enc.items()}

    # -- generation ------------------------------------------------------------------------
    def _generate(self, prompts: list[str], *, n: int, temperature: float, top_p: float,
                  top_k: int, max_new_tokens: int) -> list[list[str]]:
        import torch

        model, tokenizer, _ = self._model.get()
        if self.seed is not None:
            torch.manual_seed(self.seed)
        sample = temperature > 0
        gen_kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=sample,
                                          pad_token_id=tokenizer.pad_token_id)
        if sample:
            gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k)
        else:  # greedy: the model's own sampling defaults must not leak in
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)
        outputs: list[list[str]] = []
        step = max(1, self.batch_size // n) if sample else self.batch_size
        for start in range(0, len(prompts), step):
            batch = prompts[start:start + step]
            enc = self._encode(batch)
            width = enc["input_ids"].shape[1]
            with torch.inference_mode():
                if sample and n > 1:
                    seqs = self._sample_shared_prefill(model, enc, n, gen_kwargs)
                else:
                    seqs = model.generate(**enc, **gen_kwargs)
            counters.add(llm_completion_tokens=int((seqs[:, width:] != tokenizer.pad_token_id).sum()))
            texts = tokenizer.batch_decode(seqs[:, width:], skip_special_tokens=True)
            texts = [t.strip() for t in texts]
            if sample and n > 1:
                outputs.extend(texts[i * n:(i + 1) * n] for i in range(len(batch)))
            else:
                outputs.extend([t] * n for t in texts)
        return outputs

    @staticmethod
    def _sample_shared_prefill(model: Any, enc: dict, n: int, gen_kwargs: dict) -> Any:
        """``n`` samples per prompt with the prompt read once (its KV cache copied n times).

        ``generate(num_return_sequences=n)`` would read every prompt ``n`` times; for FB-RAG's
        long contexts and K = 5 the shared prefill is most of the cost. Falls back to the plain
        path when the model's cache cannot be repeated.
        """
        ids, mask = enc["input_ids"], enc["attention_mask"]
        try:
            out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
            cache = out.past_key_values
            cache.batch_repeat_interleave(n)
        except (AttributeError, TypeError, NotImplementedError):
            return model.generate(**enc, num_return_sequences=n, **gen_kwargs)
        rep_ids = ids.repeat_interleave(n, dim=0)
        rep_mask = mask.repeat_interleave(n, dim=0)
        return model.generate(input_ids=rep_ids, attention_mask=rep_mask, past_key_values=cache,
                              **gen_kwargs)

    # -- scoring ---------------------------------------------------------------------------
    def candidate_token_ids(self, candidate: str) -> list[int]:
        """First-token ids of ``candidate`` as the answer would start: bare and after a space.

        A spelling whose first token is whitespace only (a tokenizer that splits ``" True"``
        into a space and ``True``) contributes nothing: that token starts every answer word.
        """
        tokenizer = self.tokenizer
        ids = []
        for spelling in (candidate, " " + candidate.lstrip()):
            toks = tokenizer.encode(spelling, add_special_tokens=False)
            if not toks or not tokenizer.decode(toks[:1]).strip():
                continue
            if toks[0] not in ids:
                ids.append(toks[0])
        if not ids:
            raise ValueError(f"the tokenizer of {self!r} turns candidate {candidate!r} into no tokens.")
        return ids

    def _next_token_logprobs(self, prompts: list[str],
                             candidates: list[str]) -> list[list[float]]:
        import torch

        model, _, _ = self._model.get()
        cand_ids = [self.candidate_token_ids(c) for c in candidates]
        rows: list[list[float]] = []
        head = model.get_output_embeddings()
        hook = None
        if isinstance(head, torch.nn.Linear) and head.weight.dtype != torch.float32:
            hook = head.register_forward_hook(_fp32_linear_output)
        try:
            for start in range(0, len(prompts), self.batch_size):
                enc = self._encode(prompts[start:start + self.batch_size])
                with torch.inference_mode():
                    # left padding: the last position of every row is its real last token
                    logits = model(**enc, use_cache=False, logits_to_keep=1).logits[:, -1, :]
                    logp = torch.log_softmax(logits.float(), dim=-1).cpu()
                for row in logp:
                    rows.append([logsumexp([float(row[i]) for i in ids]) for ids in cand_ids])
        finally:
            if hook is not None:
                hook.remove()
        return rows


def _fp32_linear_output(module: Any, args: tuple, output: Any) -> Any:
    """Forward hook: the linear layer's output recomputed in float32 (from its half weights)."""
    import torch

    x = args[0]
    bias = None if module.bias is None else module.bias.float()
    return torch.nn.functional.linear(x.float(), module.weight.float(), bias)


def as_llm(llm: Any, **kwargs: Any) -> LLM:
    """An :class:`LLM` from an LLM, a hub name or a folder (kwargs go to :class:`TransformersLLM`).

    Framework models are converted by the adapters (``llama_index_funnel.llm.as_provider``,
    ``langchain_funnel.llm.as_provider``).
    """
    if isinstance(llm, LLM):
        return llm
    if isinstance(llm, str):
        return TransformersLLM(llm, **kwargs)
    raise TypeError(
        f"expected a funnel_core LLM or a model name/folder, got {type(llm).__name__}; wrap a "
        "LlamaIndex LLM with llama_index_funnel.llm.LlamaIndexLLM or a LangChain model with "
        "langchain_funnel.llm.LangChainLLM.")


#: The ``llm`` field of the adapters that read with an LLM (RankRAG, FB-RAG).
LLM_DESCRIPTION = ("The framework's model (a LlamaIndex LLM; a LangChain chat model or LLM), a funnel_core "
                   "LLM provider, or a causal-LM hub name/folder.")


class AdapterLLM:
    """Mixin of the adapters whose stage reads with an ``llm`` (RankRAG, FB-RAG), in both
    frameworks: the ``llm`` field keeps what the user gave (a framework model, a funnel_core
    :class:`LLM`, or a model name/folder); the stage gets :attr:`wrap_llm` of it (the adapter
    package's ``stage_llm``: a framework model wrapped as a provider with the ``timeout``
    field), again when ``timeout`` changes."""

    #: ``f(llm, timeout)`` -> what the stage takes as ``llm``; set by each adapter class.
    wrap_llm: ClassVar[Callable[[Any, Any], Any]]

    def _stage_value(self, name: str, value: Any) -> Any:
        if name == "llm":
            return type(self).wrap_llm(value, self.timeout)  # type: ignore[attr-defined]
        return super()._stage_value(name, value)  # type: ignore[misc]

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "timeout" and not isinstance(self.llm, (str, LLM)):  # type: ignore[attr-defined]
            self.stage.llm = type(self).wrap_llm(self.llm, value)  # type: ignore[attr-defined]


def check_prompt_template(template: Any, required: Sequence[str], what: str = "prompt",
                          optional: Sequence[str] = ()) -> str:
    """Check that ``template`` is a ``str.format`` template with exactly the ``required`` fields
    (and, where it has them, some of the ``optional`` ones).

    Raises ``ValueError`` naming the missing (or unknown) placeholders and showing the fix.
    """
    if not isinstance(template, str):
        raise TypeError(f"{what} must be a str template, got {type(template).__name__}.")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError as exc:
        raise ValueError(f"{what} is not a valid str.format template ({exc}); write literal "
                         "braces as '{{' and '}}'.") from exc
    missing = [f for f in required if f not in fields]
    unknown = sorted(f for f in fields if f not in required and f not in optional)
    if missing or unknown:
        parts = []
        if missing:
            parts.append("missing " + ", ".join("{" + f + "}" for f in missing))
        if unknown:
            parts.append("unknown " + ", ".join("{" + f + "}" for f in unknown))
        others = (f" (optional: {', '.join('{' + f + '}' for f in optional)})" if optional
                  else "")
        raise ValueError(f"{what} must contain the placeholders "
                         f"{', '.join('{' + f + '}' for f in required)}{others} and no others: "
                         f"{'; '.join(parts)}. Got: {template!r:.200}")
    return template
