"""monoT5 reranking (Nogueira et al., 2020), the reranker "Searching for Best Practices in RAG"
recommends as the best balance of quality and speed.

A T5 model reads ``"Query: {q} Document: {d} Relevant:"`` and its first decoder step is read at
two vocabulary entries, ``true`` and ``false``. The raw score is the logit difference
``logit(true) - logit(false)``, so ``sigmoid(score)`` equals the softmax probability of ``true``
over the two (``normalize=True`` returns exactly that probability).

Truncation never cuts the query away: the prompt is assembled from token ids, and only the
document is shortened to fit ``max_length`` (a query longer than half of it is clipped to half).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.hardware import autocast, fp32_output_head, normalize_dtype, requested_dtype, resolve_dtype
from funnel_core.models import LazyModel, load_pretrained, resolve_device, tokenizer_lock
from funnel_core.rerank.base import Reranker
from funnel_core.settings import Settings

__all__ = ["MonoT5Scorer", "DEFAULT_MONOT5"]

DEFAULT_MONOT5 = "castorini/monot5-base-msmarco"


def _single_token(tokenizer: Any, word: str) -> int:
    ids = tokenizer.encode(word, add_special_tokens=False)
    if not ids:
        raise ValueError(f"the tokenizer maps {word!r} to no token; pass true_token/false_token "
                         "words that the model's vocabulary holds.")
    # SentencePiece may emit a bare "▁" piece first; the word piece is the last one.
    return ids[-1] if len(ids) > 1 and tokenizer.convert_ids_to_tokens(ids[0]) in ("▁", "Ġ") else ids[0]


class MonoT5Scorer(Settings, Reranker):
    """Rerank with a monoT5 sequence-to-sequence relevance model.

    Args:
        model: Hub name or local folder of a T5 checkpoint fine-tuned as monoT5
            (default ``castorini/monot5-base-msmarco``).
        batch_size: Pairs per forward pass.
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` (automatic).
        max_length: Encoder tokens per prompt; the document is truncated to fit.
        sort_by_length: Batch prompts of similar length together.
        template: The prompt; must contain ``{query}`` before ``{document}``.
        true_token: The word whose first-step logit means "relevant".
        false_token: The word whose first-step logit means "not relevant".
        normalize: Return ``P(true)`` in (0, 1) instead of the logit difference.
        top_n: Keep at most this many units (see :class:`~funnel_core.rerank.base.Reranker`).
        score_threshold: Drop units scoring below this.
        name: Stage name in traces and in ``metadata["scores"]``.
        model_kwargs: Extra keyword arguments for ``from_pretrained``.
        dtype: ``"auto"`` (default; :mod:`funnel_core.hardware`: bfloat16 autocast only where the
            hardware runs it natively — AVX-512-BF16/AMX CPUs, GPUs of compute capability >= 8 —,
            float16 weights on older GPUs, float32 otherwise), ``"float32"``, ``"bfloat16"``
            (autocast, weights stay float32; the true/false logits are still computed in
            float32) or ``"float16"``. An explicit bf16 request on hardware without native bf16
            warns once. :attr:`active_dtype` is what it resolved to, once loaded.
    """

    name = "monot5"
    #: Settings whose edit loads the model again; any other edit keeps it.
    load_settings = frozenset({"model", "device", "max_length", "template", "true_token",
                               "false_token", "model_kwargs", "dtype"})

    def __init__(self, model: str | os.PathLike = DEFAULT_MONOT5, *, batch_size: int = 16,
                 device: str | None = None, max_length: int = 512,
                 sort_by_length: bool = True,
                 template: str = "Query: {query} Document: {document} Relevant:",
                 true_token: str = "true", false_token: str = "false", normalize: bool = False,
                 top_n: int | None = None, score_threshold: float | None = None,
                 name: str | None = None, model_kwargs: dict[str, Any] | None = None,
                 dtype: str = "auto") -> None:
        super().__init__(top_n=top_n, score_threshold=score_threshold, normalize=normalize,
                         batch_size=batch_size, name=name)
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model must be a hub name or a local folder path, got "
                            f"{type(model).__name__}.")
        q, d = template.find("{query}"), template.find("{document}")
        if q < 0 or d < 0 or q > d:
            raise ValueError(f"template must contain '{{query}}' before '{{document}}', got "
                             f"{template!r}.")
        self.model = os.fspath(model)
        self.device = device
        self.max_length = check_positive_int(max_length, "max_length")
        self.sort_by_length = bool(sort_by_length)
        self.template = template
        self.true_token, self.false_token = true_token, false_token
        self.model_kwargs = dict(model_kwargs or {})
        self.dtype = normalize_dtype(dtype)
        self._model = LazyModel(self._load)

    def _load(self) -> Callable[..., list[float]]:
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        device = resolve_device(self.device)
        tokenizer = load_pretrained(AutoTokenizer.from_pretrained, self.model_name, what="tokenizer")
        model = load_pretrained(AutoModelForSeq2SeqLM.from_pretrained, self.model_name,
                                what="monoT5 model", **self.model_kwargs)
        active = resolve_dtype(requested_dtype(self.dtype), device)
        if active == "float16":
            model = model.half()
        elif active == "bfloat16":
            fp32_output_head(model)  # true/false logits in fp32: no bf16 steps, no ties
        model = model.to(device).eval()
        true_id = _single_token(tokenizer, self.true_token)
        false_id = _single_token(tokenizer, self.false_token)
        start = model.config.decoder_start_token_id
        if start is None:
            start = tokenizer.pad_token_id
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        max_length = self.max_length
        head, rest = self.template.split("{query}", 1)
        middle, tail = rest.split("{document}", 1)

        def ids(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False) if text else []

        head_ids, middle_ids, tail_ids = ids(head), ids(middle.rstrip()), ids(tail)
        fixed = len(head_ids) + len(middle_ids) + len(tail_ids) + len(eos)
        if fixed >= self.max_length:
            raise ValueError(f"max_length={self.max_length} leaves no room for the query and the "
                             f"document (the template alone takes {fixed} tokens); raise it.")

        def build(query_ids: list[int], doc_ids: list[int]) -> list[int]:
            room = max_length - fixed
            q = query_ids[: max(1, room // 2)] if len(query_ids) > room // 2 else query_ids
            return head_ids + q + middle_ids + doc_ids[: room - len(q)] + tail_ids + eos

        @torch.inference_mode()
        def score(queries: list[str], texts: list[str], batch_size: int,
                  sort_by_length: bool) -> list[float]:
            with tokenizer_lock(tokenizer):
                qcache = {q: ids(q.strip()) for q in set(queries)}
                docs = tokenizer([" " + t.strip() for t in texts], add_special_tokens=False)["input_ids"]
            prompts = [build(qcache[q], d) for q, d in zip(queries, docs)]
            order = list(range(len(prompts)))
            if sort_by_length:
                order.sort(key=lambda i: -len(prompts[i]))
            out = [0.0] * len(prompts)
            for b in range(0, len(order), batch_size):
                idx = order[b:b + batch_size]
                width = max(len(prompts[i]) for i in idx)
                input_ids = torch.full((len(idx), width), pad, dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                for row, i in enumerate(idx):
                    input_ids[row, : len(prompts[i])] = torch.tensor(prompts[i])
                    mask[row, : len(prompts[i])] = 1
                dec = torch.full((len(idx), 1), start, dtype=torch.long)
                with autocast(active, device):
                    logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                   decoder_input_ids=dec.to(device)).logits[:, 0, :].float()
                diff = (logits[:, true_id] - logits[:, false_id]).tolist()
                for i, s in zip(idx, diff):
                    out[i] = s
            return out

        score.model = model  # type: ignore[attr-defined]
        score._funnel_dtype = active  # type: ignore[attr-defined]
        score.tokenizer = tokenizer  # type: ignore[attr-defined]
        score.token_ids = (true_id, false_id)  # type: ignore[attr-defined]
        score.prompt = lambda q, t: build(ids(q.strip()), ids(" " + t.strip()))  # type: ignore[attr-defined]
        return score

    @property
    def active_dtype(self) -> str | None:
        """The precision the loaded model runs in (``dtype`` resolved on its device; ``None``
        until loaded). It travels with the loaded model to a stage rebuilt around it."""
        return getattr(self._model.get(), "_funnel_dtype", None) if self._model.loaded else None

    @property
    def model_name(self) -> str:
        """The model that loads (``model``)."""
        return self.model

    def load(self) -> "MonoT5Scorer":
        """Load the model now instead of on first use; returns ``self``."""
        self._model.get()
        return self

    def prompt_ids(self, query: str, text: str) -> list[int]:
        """The encoder input ids of one (query, text) prompt, after truncation."""
        return self._model.get().prompt(query, text)

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """``logit(true) - logit(false)`` of each text (sigmoid of it = P(true))."""
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"texts must be strings, got {type(t).__name__}.")
        if not texts:
            return []
        return [float(s) for s in self._model.get()([query] * len(texts), texts, self.batch_size,
                                                     self.sort_by_length)]

    def __repr__(self) -> str:
        return (f"MonoT5Scorer(model={self.model_name!r}, max_length={self.max_length}, "
                f"dtype={self.dtype!r})")
