"""Fusion-in-Decoder cross-attention reranking (FunnelRAG section 3.1.3, equation 3).

A Fusion-in-Decoder (FiD) reader encodes every ``question + passage`` pair separately with a T5
encoder, concatenates the encoder outputs, and lets the decoder attend over all of them at once.
How much the decoder attends to a passage is a relevance signal: FunnelRAG scores passage ``k``
by the cross-attention of the first decoder token, averaged over the ``L`` layers, the ``H``
heads and the ``lr`` most-attended ("representative") tokens of the passage, the tokens being
chosen separately in every layer and head (Appendix A.2)::

    S_k = 1 / (L * H * lr) * sum_l sum_h sum_{t in top-lr(k, l, h)} alpha[l, h, t]     (eq. 3)

with the question's own tokens left out of the candidates (the paper's best setting, ``lr=4``).

:class:`FiDAttentionScorer` implements this for any T5 / FiD checkpoint (hub name or local
folder), with the aggregation schemes of the paper's Table 7 and the query-token ablation of
Table 8 selectable, chunked encoding so memory stays bounded for many passages, ``n`` decoder
steps, and optionally the generated answer.

Implementation notes
--------------------
* Passages are encoded in chunks of ``batch_size``; each chunk is padded only to its own longest
  passage, and the padding is *stripped* before the encoder outputs are concatenated ("packed"
  concatenation). T5 cross-attention has no position bias, so this is exactly the FiD
  concatenation with a padding mask, minus the masked columns: padding can never receive
  attention, and memory is ``sum(len(passage))`` rather than ``n * max_len``.
* Token roles come from the tokenizer's character offsets: a token belongs to the passage when it
  overlaps the ``{title}`` or ``{text}`` field of the input template, to the query when it
  overlaps ``{question}``; template words ("question:", "context:") and special tokens belong to
  neither and are never scored.
* Aggregation order (Appendix A.2): mean over the scored decoder positions; then, for every
  layer and head separately, the mean of that head's ``lr`` most-attended candidate tokens; then
  heads (mean, or max for Table 7 (iii)) and layers (mean, max for (ii), or the last ``last_k``
  = 6 for (v)). ``aggregation="averaged_map_*"`` selects the tokens from the head- and
  layer-averaged map instead (not the paper's order; kept for comparison).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.hardware import autocast, normalize_dtype, requested_dtype, resolve_dtype
from funnel_core.models import LazyModel, load_pretrained, resolve_device, tokenizer_lock
from funnel_core.rerank.base import Reranker
from funnel_core.settings import Settings
from funnel_core.units import Unit

__all__ = ["FiDAttentionScorer", "AGGREGATIONS", "FiDInputs", "aggregate_cross_attention",
           "DEFAULT_TEMPLATE", "DEFAULT_TEMPLATE_NO_TITLE", "DEFAULT_LAST_K"]

DEFAULT_TEMPLATE = "question: {question} title: {title} context: {text}"
DEFAULT_TEMPLATE_NO_TITLE = "question: {question} context: {text}"

#: Named aggregation schemes: FunnelRAG Table 7 (Appendix C.1) and, under ``averaged_map_*``,
#: the earlier averaged-map variants. Each value is ``(layers, heads, tokens, order)``:
#:
#: * ``order="per_head"`` (the paper, eq. 3 / Appendix A.2): for every layer ``l`` and head
#:   ``h`` the ``lr`` most-attended candidate tokens are selected *in that head's own map* and
#:   averaged (``tokens="topk"``; ``"max"`` keeps the single most-attended token instead), giving
#:   ``s[l, h]``; the heads are then combined (mean or max) inside each layer, and the layers
#:   (mean, max, or mean of the last ``last_k``), in the nesting of eq. 3
#:   (``sum_l sum_h sum_t``): ``S = layers_l( heads_h( tokens_t a[l, h, t] ) )``.
#: * ``order="averaged_map"`` (not in the paper, kept for comparison): the map is first reduced
#:   over heads, then over layers, and the top-``lr`` tokens are taken from that single averaged
#:   map. The two orders pick different passages on peaky maps.
AGGREGATIONS: dict[str, tuple[str, str, str, str]] = {
    "mean": ("mean", "mean", "topk", "per_head"),            # (i) eq. 3
    "max_layers": ("max", "mean", "topk", "per_head"),       # (ii) max over layers
    "max_heads": ("mean", "max", "topk", "per_head"),        # (iii) max over heads
    "max_tokens": ("mean", "mean", "max", "per_head"),       # (iv) max over tokens
    "last_k_layers": ("last_k", "mean", "topk", "per_head"),  # (v) mean of the last k layers
    "averaged_map_mean": ("mean", "mean", "topk", "averaged_map"),
    "averaged_map_max_layers": ("max", "mean", "topk", "averaged_map"),
    "averaged_map_max_heads": ("mean", "max", "topk", "averaged_map"),
    "averaged_map_max_tokens": ("mean", "mean", "max", "averaged_map"),
    "averaged_map_last_k_layers": ("last_k", "mean", "topk", "averaged_map"),
}

#: Layers averaged by ``"last_k_layers"`` (Table 7 (v): the last six decoder layers).
DEFAULT_LAST_K = 6


def _reduce(x: Any, op: str, dim: int, last_k: int) -> Any:
    if op == "max":
        return x.max(dim=dim).values
    if op == "last_k":
        return x.narrow(dim, max(0, x.shape[dim] - last_k), min(last_k, x.shape[dim])).mean(dim=dim)
    return x.mean(dim=dim)


def aggregate_cross_attention(attn: Any, token_mask: Any, *, aggregation: str = "mean",
                              lr: int | None = 4, last_k: int = DEFAULT_LAST_K) -> float:
    """Score one passage from its cross-attention block (eq. 3 or a Table 7 scheme).

    Args:
        attn: Tensor ``[layers, heads, tokens]`` — the attention the (mean of the scored)
            decoder position(s) pays to this passage's tokens.
        token_mask: Bool tensor ``[tokens]``: which tokens may count (passage tokens, plus query
            tokens when they are included).
        aggregation: A key of :data:`AGGREGATIONS`.
        lr: Representative tokens per (layer, head) (``None``: all candidate tokens).
        last_k: Layers averaged by ``"last_k_layers"`` (all layers when the model has fewer).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)}, got {aggregation!r}.")
    layers_op, heads_op, tokens_op, order = AGGREGATIONS[aggregation]
    a = attn[:, :, token_mask]
    n_tokens = a.shape[-1]
    if n_tokens == 0:
        return 0.0
    k = n_tokens if lr is None else min(lr, n_tokens)
    if order == "averaged_map":
        a = _reduce(a, heads_op, 1, last_k)                                  # [L, T]
        a = _reduce(a, layers_op, 0, last_k)                                 # [T]
        return float(a.max()) if tokens_op == "max" else float(a.topk(k).values.mean())
    if tokens_op == "max":
        s = a.max(dim=-1).values                                             # [L, H]
    else:
        s = a.topk(k, dim=-1).values.mean(dim=-1)                            # [L, H]
    s = _reduce(s, heads_op, 1, last_k)                                      # [L]
    return float(_reduce(s, layers_op, 0, last_k))


@dataclass
class FiDInputs:
    """Tokenized FiD inputs of one query: per passage, its ids and token roles (no padding)."""

    input_ids: list[Any]       # LongTensor [len_i] per passage
    passage_mask: list[Any]    # BoolTensor [len_i]: title/text tokens
    query_mask: list[Any]      # BoolTensor [len_i]: question tokens

    @property
    def lengths(self) -> list[int]:
        return [int(x.shape[0]) for x in self.input_ids]


def _render(template: str, fields: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Format ``template`` and return the text with the character span of every field."""
    out, spans, pos = [], {}, 0
    for literal, field_name, spec, conv in string.Formatter().parse(template):
        out.append(literal)
        pos += len(literal)
        if field_name is None:
            continue
        if field_name not in fields:
            raise KeyError(f"template field {{{field_name}}} is unknown; use {{question}}, "
                           "{title} and {text}.")
        value = format(fields[field_name], spec or "")
        spans[field_name] = (pos, pos + len(value))
        out.append(value)
        pos += len(value)
    return "".join(out), spans


class FiDAttentionScorer(Settings, Reranker):
    """Rerank passages by the cross-attention a Fusion-in-Decoder T5 reader pays to them.

    Works with any T5 / FiD checkpoint saved by ``save_pretrained`` (a hub name such as
    ``google/flan-t5-base`` or a local folder, e.g. one written by
    :func:`funnel_core.train.fid.train_fid`). Titles are read from ``unit.metadata[title_key]``
    when the stage runs on units; :meth:`score` (texts only) uses the no-title template.

    Args:
        model: Hub name or local folder of a T5 encoder-decoder checkpoint.
        template: Input format with ``{question}``, ``{title}`` and ``{text}`` (FiD convention).
        template_no_title: Format used when a passage has no title.
        title_key: Metadata key holding a unit's title.
        lr: Representative tokens per passage, layer and head (paper: 4); ``None`` averages all
            passage tokens.
        aggregation: One of :data:`AGGREGATIONS` (Table 7): ``"mean"`` (eq. 3), ``"max_layers"``,
            ``"max_heads"``, ``"max_tokens"``, ``"last_k_layers"``; ``"averaged_map_<scheme>"``
            picks the tokens from the head/layer-averaged map (not the paper's order).
        last_k: Layers used by ``"last_k_layers"`` (paper: the last 6).
        include_query_tokens: Let the question's tokens inside each passage input count (Table 8
            ablation; the paper excludes them).
        decoder_steps: Decoder positions whose cross-attention is averaged (1 = the first token,
            as in the paper; more positions use the greedily generated answer prefix).
        return_answer: Also generate the reader's answer and store it in
            ``funnel["fid_answer"]`` of every returned unit (and in :attr:`last_answer`).
        max_answer_tokens: Generation budget for the answer.
        max_length: Tokens per (question + passage) input; longer inputs are truncated.
        batch_size: Passages encoded per encoder forward pass (bounds memory).
        device: ``"cpu"``, ``"cuda"``, ... (default: best available).
        top_n: Keep at most this many units (see :class:`~funnel_core.rerank.base.Reranker`).
        score_threshold: Drop units scoring below this.
        normalize: Map scores through a sigmoid.
        name: Stage name in traces and in the score history (``Unit.funnel["score_<name>"]``).
        dtype: ``"auto"`` (default; :mod:`funnel_core.hardware`: bfloat16 autocast only where the
            hardware runs it natively — AVX-512-BF16/AMX CPUs, GPUs of compute capability >= 8 —,
            float16 weights on older GPUs, float32 otherwise), ``"float32"``, ``"bfloat16"``
            (autocast, weights stay float32) or ``"float16"``. The cross-attention probabilities
            are then bf16-rounded (about 3 significant digits); the tests check that the ranking
            stays that of float32 on a real reader. An explicit bf16 request on hardware without
            native bf16 warns once. :attr:`active_dtype` is what it resolved to, once loaded.
    """

    name = "fid_attention"
    #: Settings whose edit loads the model again; any other edit keeps it.
    load_settings = frozenset({"model", "device", "dtype"})
    setting_attrs = {"model": "model_name"}  # ``self.model`` is the loaded model

    def __init__(self, *, model: str, template: str = DEFAULT_TEMPLATE,
                 template_no_title: str = DEFAULT_TEMPLATE_NO_TITLE, title_key: str = "title",
                 lr: int | None = 4, aggregation: str = "mean", last_k: int = DEFAULT_LAST_K,
                 include_query_tokens: bool = False, decoder_steps: int = 1,
                 return_answer: bool = False, max_answer_tokens: int = 20,
                 max_length: int = 256, batch_size: int = 16, device: str | None = None,
                 top_n: int | None = None,
                 score_threshold: float | None = None, normalize: bool = False,
                 name: str | None = None, dtype: str = "auto") -> None:
        super().__init__(top_n=top_n, score_threshold=score_threshold, normalize=normalize,
                         batch_size=batch_size, name=name)
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a hub name or a local folder path, got {model!r}.")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)}, got "
                             f"{aggregation!r}.")
        for t, need in ((template, ("question", "text")), (template_no_title, ("question", "text"))):
            fields = {f for _, f, _, _ in string.Formatter().parse(t) if f}
            missing = [f for f in need if f not in fields]
            if missing:
                raise ValueError(f"template {t!r} lacks the field(s) {missing}; e.g. "
                                 f"{DEFAULT_TEMPLATE!r}.")
        self.model_name = model
        self.template = template
        self.template_no_title = template_no_title
        self.title_key = title_key
        self.lr = check_positive_int(lr, "lr", allow_none=True)
        self.aggregation = aggregation
        self.last_k = check_positive_int(last_k, "last_k")
        self.include_query_tokens = bool(include_query_tokens)
        self.decoder_steps = check_positive_int(decoder_steps, "decoder_steps")
        self.return_answer = bool(return_answer)
        self.max_answer_tokens = check_positive_int(max_answer_tokens, "max_answer_tokens")
        self.max_length = check_positive_int(max_length, "max_length")
        self.device = device
        self.dtype = normalize_dtype(dtype)
        self.last_answer: str | None = None
        self._model = LazyModel(self._load)

    # -- loading ---------------------------------------------------------------------------
    def _load(self) -> tuple[Any, Any, str]:
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        device = resolve_device(self.device)
        tokenizer = load_pretrained(AutoTokenizer.from_pretrained, self.model_name,
                                    what="FiD tokenizer", padding_side="right")
        active = resolve_dtype(requested_dtype(self.dtype), device)
        dtype = torch.float16 if active == "float16" else torch.float32
        model = load_pretrained(AutoModelForSeq2SeqLM.from_pretrained, self.model_name,
                                what="FiD (T5) model", attn_implementation="eager", dtype=dtype)
        if not getattr(model.config, "is_encoder_decoder", False):
            raise TypeError(f"{self.model_name!r} is not an encoder-decoder model; FiD needs a "
                            "T5-style checkpoint (use AttentionLMScorer for causal LMs).")
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError(f"the tokenizer of {self.model_name!r} is not a fast tokenizer; FiD "
                            "scoring needs character offsets (install `tokenizers`).")
        model.to(device).eval()
        model._funnel_dtype = active  # read by active_dtype, moves with the loaded model
        return model, tokenizer, device

    @property
    def active_dtype(self) -> str | None:
        """The precision the loaded model runs in (``dtype`` resolved on its device; ``None``
        until loaded). It travels with the loaded model to a stage rebuilt around it."""
        return getattr(self.model, "_funnel_dtype", None) if self._model.loaded else None

    def _autocast(self, device: str) -> Any:
        return autocast(self.active_dtype or "float32", device)

    @property
    def model(self) -> Any:
        """The loaded seq2seq model (loads on first access)."""
        return self._model.get()[0]

    @property
    def tokenizer(self) -> Any:
        return self._model.get()[1]

    # -- inputs ----------------------------------------------------------------------------
    def build_inputs(self, query: str, texts: Sequence[str],
                     titles: Sequence[str | None] | None = None) -> FiDInputs:
        """Tokenize every (question, title, passage) input and mark query / passage tokens."""
        import torch

        tokenizer = self.tokenizer
        titles = list(titles) if titles is not None else [None] * len(texts)
        rendered, spans = [], []
        for text, title in zip(texts, titles):
            if title:
                s, sp = _render(self.template, {"question": query, "title": str(title), "text": text})
            else:
                s, sp = _render(self.template_no_title, {"question": query, "title": "", "text": text})
            rendered.append(s)
            spans.append(sp)
        with tokenizer_lock(tokenizer):
            enc = tokenizer(rendered, truncation=True, max_length=self.max_length,
                            return_offsets_mapping=True, return_special_tokens_mask=True)
        ids, pmask, qmask = [], [], []
        for i in range(len(rendered)):
            offsets = enc["offset_mapping"][i]
            special = enc["special_tokens_mask"][i]
            sp = spans[i]

            def overlaps(field: str, a: int, b: int) -> bool:
                if field not in sp or b <= a:
                    return False
                lo, hi = sp[field]
                return a < hi and b > lo

            p = [not s and (overlaps("text", a, b) or overlaps("title", a, b))
                 for (a, b), s in zip(offsets, special)]
            q = [not s and not pp and overlaps("question", a, b)
                 for (a, b), s, pp in zip(offsets, special, p)]
            ids.append(torch.tensor(enc["input_ids"][i], dtype=torch.long))
            pmask.append(torch.tensor(p, dtype=torch.bool))
            qmask.append(torch.tensor(q, dtype=torch.bool))
        return FiDInputs(ids, pmask, qmask)

    # -- model passes ----------------------------------------------------------------------
    def encode(self, inputs: FiDInputs) -> Any:
        """Encode passages in chunks of ``batch_size``; return the packed states ``[1, N, d]``.

        ``N = sum(len_i)``: each passage's padding is stripped before concatenation.
        """
        import torch

        model, tokenizer, device = self._model.get()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        pieces: list[Any] = []
        with torch.inference_mode(), self._autocast(device):
            for start in range(0, len(inputs.input_ids), self.batch_size):
                chunk = inputs.input_ids[start:start + self.batch_size]
                width = max(int(x.shape[0]) for x in chunk)
                batch = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for j, x in enumerate(chunk):
                    batch[j, :x.shape[0]] = x
                    mask[j, :x.shape[0]] = 1
                states = model.encoder(input_ids=batch.to(device),
                                       attention_mask=mask.to(device)).last_hidden_state
                pieces.extend(states[j, :int(x.shape[0])] for j, x in enumerate(chunk))
        return torch.cat(pieces, dim=0).unsqueeze(0)

    def _decoder_prefix(self, encoder_states: Any) -> tuple[Any, str | None]:
        """Decoder input ids for the scored positions, and the answer when asked for."""
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        model, tokenizer, device = self._model.get()
        start = model.config.decoder_start_token_id
        if start is None:
            start = tokenizer.pad_token_id
        prefix = torch.tensor([[start]], dtype=torch.long, device=device)
        need = max(self.decoder_steps - 1, self.max_answer_tokens if self.return_answer else 0)
        if need == 0:
            return prefix, None
        mask = torch.ones(encoder_states.shape[:2], dtype=torch.long, device=device)
        with torch.inference_mode(), self._autocast(device):
            generated = model.generate(
                encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
                attention_mask=mask, decoder_input_ids=prefix, max_new_tokens=need,
                do_sample=False, num_beams=1)
        answer = (tokenizer.decode(generated[0, 1:], skip_special_tokens=True).strip()
                  if self.return_answer else None)
        steps = generated[:, :self.decoder_steps]
        return steps, answer

    def cross_attention(self, encoder_states: Any, decoder_input_ids: Any) -> Any:
        """Cross-attention ``[layers, heads, N]`` of the decoder positions, averaged over them."""
        import torch

        model, _, device = self._model.get()
        mask = torch.ones(encoder_states.shape[:2], dtype=torch.long, device=device)
        from transformers.modeling_outputs import BaseModelOutput

        with torch.inference_mode(), self._autocast(device):
            out = model(encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
                        attention_mask=mask, decoder_input_ids=decoder_input_ids,
                        output_attentions=True, use_cache=False)
        if not out.cross_attentions or out.cross_attentions[0] is None:
            raise RuntimeError(f"{self.model_name!r} returned no cross-attentions; load it with "
                               "attn_implementation='eager'.")
        # each layer: [1, heads, steps, N] -> mean over steps -> [heads, N]
        return torch.stack([a[0].float().mean(dim=1) for a in out.cross_attentions])

    # -- scoring ---------------------------------------------------------------------------
    def score_with_titles(self, query: str, texts: Sequence[str],
                          titles: Sequence[str | None] | None = None) -> tuple[list[float], str | None]:
        """Scores (eq. 3 or the chosen scheme) and the generated answer (``None`` unless asked)."""
        texts = list(texts)
        if not texts:
            return [], None
        inputs = self.build_inputs(query, texts, titles)
        states = self.encode(inputs)
        decoder_ids, answer = self._decoder_prefix(states)
        attn = self.cross_attention(states, decoder_ids).cpu()           # [L, H, N]
        scores, pos = [], 0
        for n, pmask, qmask in zip(inputs.lengths, inputs.passage_mask, inputs.query_mask):
            mask = pmask | qmask if self.include_query_tokens else pmask
            scores.append(aggregate_cross_attention(attn[:, :, pos:pos + n], mask,
                                                    aggregation=self.aggregation, lr=self.lr,
                                                    last_k=self.last_k))
            pos += n
        return scores, answer

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Scores of untitled passages (see :meth:`score_with_titles`)."""
        scores, answer = self.score_with_titles(query, texts)
        self.last_answer = answer
        return scores

    def rank(self, query: str, units: Sequence[Unit], top_n: int | None = None) -> list[Unit]:
        """Like :meth:`Reranker.rank`, reading titles from ``unit.metadata[title_key]``."""
        units = list(units)
        titles = []
        for u in units:
            if not isinstance(u, Unit):
                raise TypeError(f"{type(self).__name__} expects Unit objects, got "
                                f"{type(u).__name__}.")
            t = u.metadata.get(self.title_key)
            titles.append(str(t) if t else None)
        answer_box: dict[str, str | None] = {}

        def score(q: str, texts: Sequence[str]) -> list[float]:
            s, answer_box["answer"] = self.score_with_titles(q, texts, titles)
            return s

        out = _RankWith(self, score).rank(query, units, top_n)
        self.last_answer = answer_box.get("answer")
        if self.return_answer:
            for u in out:
                u.funnel["fid_answer"] = self.last_answer
        return out


class _RankWith(Reranker):
    """Borrow :meth:`Reranker.rank`'s bookkeeping with a custom score function."""

    def __init__(self, parent: Reranker, fn: Any) -> None:
        self.__dict__.update({k: v for k, v in parent.__dict__.items()
                              if k in ("top_n", "batch_size", "score_threshold", "normalize")})
        self.name = parent.name
        self._fn = fn
        self._parent = parent

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        return self._fn(query, texts)

    def _count(self, pairs: int) -> None:
        self._parent._count(pairs)  # the work is the parent's
