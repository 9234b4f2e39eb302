"""Fusion-in-Decoder cross-attention reranking (FunnelRAG section 3.1.3, equation 3).

A Fusion-in-Decoder (FiD) reader encodes every ``question + passage`` pair separately with a T5
encoder, concatenates the encoder outputs, and lets the decoder attend over all of them at once.
How much the decoder attends to a passage is a relevance signal: FunnelRAG scores passage ``k``
by the raw cross-attention score ``alpha = Q K^T`` (Appendix A.1; before the softmax) of the
first decoder token, averaged over the ``L`` layers, the ``H`` heads and the ``lr`` most-attended
("representative") tokens of the passage, the tokens being chosen separately in every layer and
head (Appendix A.2)::

    S_k = 1 / (L * H * lr) * sum_i sum_j sum_{t in top-lr(k, i, j)} alpha[0, i, j, t]     (eq. 3)

with the question's own tokens left out of the candidates (the paper's best setting, ``lr=4``).

:class:`FiDAttentionScorer` implements this for any T5 / FiD checkpoint (hub name or local
folder), with the aggregation schemes of the paper's Table 7 and the query-token ablation of
Table 8 as the paper writes them (:data:`AGGREGATIONS`), chunked encoding so memory stays bounded
for many passages, ``n`` decoder steps, and optionally the generated answer.

Implementation notes
--------------------
* ``alpha`` is read from the decoder's own forward: forward hooks capture the query projection
  of the decoder state and the key projection of the encoder states in every cross-attention
  module, and ``softmax(alpha)`` is checked against the model's attention probabilities on every
  call. ``score_on="log_attention"`` scores ``log softmax(alpha)`` instead, which differs from
  ``alpha`` by a constant per (layer, head, decoder position) shared by all passages (one
  softmax spans every passage's tokens) and so ranks exactly as ``alpha`` for eq. 3, (iv), (v)
  and Table 8; ``score_on="attention"`` scores the probabilities (not the paper).
* Passages are encoded in chunks of ``batch_size``; each chunk is padded only to its own longest
  passage, and the padding is *stripped* before the encoder outputs are concatenated ("packed"
  concatenation). T5 cross-attention has no position bias, so this is exactly the FiD
  concatenation with a padding mask, minus the masked columns: padding can never receive
  attention, and memory is ``sum(len(passage))`` rather than ``n * max_len``.
* Token roles come from the tokenizer's character offsets: a token belongs to the passage when it
  overlaps the ``{title}`` or ``{text}`` field of the input template, to the query when it
  overlaps ``{question}``; template words ("question:", "context:") and special tokens belong to
  neither and are never scored.
* ``decoder_steps > 1`` (not in the paper) averages the map over the greedy answer prefix's
  positions before the aggregation.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any, Sequence

from funnel_core import counters
from funnel_core.errors import check_positive_int
from funnel_core.hardware import autocast, normalize_dtype, requested_dtype, resolve_dtype
from funnel_core.models import LazyModel, load_pretrained, resolve_device, tokenizer_lock
from funnel_core.rerank.base import Reranker
from funnel_core.settings import Settings
from funnel_core.units import Unit

__all__ = ["FiDAttentionScorer", "FiDReader", "AGGREGATIONS", "FiDInputs", "aggregate_cross_attention",
           "DEFAULT_TEMPLATE", "DEFAULT_TEMPLATE_NO_TITLE", "DEFAULT_LAST_K", "SCORE_ON"]

DEFAULT_TEMPLATE = "question: {question} title: {title} context: {text}"
DEFAULT_TEMPLATE_NO_TITLE = "question: {question} context: {text}"

#: Named aggregation schemes of FunnelRAG Table 7 (Appendix C.1), written as the paper writes
#: them over ``alpha[0, i, j, k]`` (first decoder token, layer ``i``, head ``j``, token ``k`` of
#: the passage). Each value is ``(reduction, selects_tokens)``; only (i), (iv) and (v) select
#: representative tokens (the ``lr`` most-attended ones, chosen in every layer and head's own
#: map); (ii) and (iii) average over **all** the passage's tokens:
#:
#: * ``"mean"``          (i)   eq. 3: ``mean_{i,j} mean_{k in top-lr(i,j)} alpha[i, j, k]``
#: * ``"max_layers"``    (ii)  ``mean_{j,k} max_i alpha[i, j, k]``
#: * ``"max_heads"``     (iii) ``mean_{i,k} max_j alpha[i, j, k]``
#: * ``"max_tokens"``    (iv)  ``mean_{i,j} max_k alpha[i, j, k]``
#: * ``"last_k_layers"`` (v)   eq. 3 over the last ``last_k`` = 6 layers only
AGGREGATIONS: dict[str, tuple[str, bool]] = {
    "mean": ("mean", True),
    "max_layers": ("max_layers", False),
    "max_heads": ("max_heads", False),
    "max_tokens": ("max_tokens", True),
    "last_k_layers": ("last_k_layers", True),
}

#: What eq. 3 is computed on (``score_on``):
#:
#: * ``"alpha"`` (default): the raw cross-attention score ``alpha = Q K^T`` (times the model's
#:   scaling) before the softmax (Appendix A.1; the FiD reference implementation stores the scores
#:   before the softmax), read from the decoder's cross-attention projections and checked against
#:   the model's own attention probabilities on every call;
#: * ``"log_attention"``: ``log softmax(alpha)``. FiD's decoder attends over every passage's tokens
#:   in one softmax per (layer, head, decoder position), so ``log p = alpha - c[i, j]`` with a
#:   constant shared by all passages: (i), (iv), (v) and Table 8 rank exactly as on ``alpha``
#:   (their scores differ by one constant); (ii) and (iii) do not (the constant sits inside the max);
#: * ``"attention"``: the post-softmax probabilities (this package's earlier reading; not the paper).
SCORE_ON = ("alpha", "log_attention", "attention")

#: Layers averaged by ``"last_k_layers"`` (Table 7 (v): the last six decoder layers).
DEFAULT_LAST_K = 6


def aggregate_cross_attention(attn: Any, token_mask: Any, *, aggregation: str = "mean",
                              lr: int | None = 4, last_k: int = DEFAULT_LAST_K) -> float:
    """Score one passage from its cross-attention block (eq. 3 or a Table 7 scheme).

    Args:
        attn: Tensor ``[layers, heads, tokens]``: ``alpha`` (or log-attention / attention, see
            :data:`SCORE_ON`) of the (mean of the scored) decoder position(s) on this passage's
            tokens.
        token_mask: Bool tensor ``[tokens]``: which tokens may count (passage tokens, plus query
            tokens for Table 8's "w/ query").
        aggregation: A key of :data:`AGGREGATIONS`.
        lr: Representative tokens per (layer, head) for (i) and (v) (``None``: all candidate
            tokens); (ii), (iii) use all tokens and (iv) one, whatever ``lr`` is.
        last_k: Layers averaged by ``"last_k_layers"`` (all layers when the model has fewer).
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {sorted(AGGREGATIONS)}, got {aggregation!r}.")
    a = attn[:, :, token_mask]                                               # [L, H, T]
    n_tokens = a.shape[-1]
    if n_tokens == 0:
        return 0.0
    if aggregation == "max_layers":                                          # (ii)
        return float(a.max(dim=0).values.mean())
    if aggregation == "max_heads":                                           # (iii)
        return float(a.max(dim=1).values.mean())
    if aggregation == "max_tokens":                                          # (iv)
        return float(a.max(dim=-1).values.mean())
    if aggregation == "last_k_layers":                                       # (v)
        a = a[-last_k:]
    k = n_tokens if lr is None else min(lr, n_tokens)
    return float(a.topk(k, dim=-1).values.mean())                            # (i): mean_{i,j,top-lr}


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
        lr: Representative tokens per passage, layer and head for eq. 3 and (v) (paper: 4);
            ``None`` averages all passage tokens.
        aggregation: One of :data:`AGGREGATIONS` (Table 7 as the paper writes it): ``"mean"``
            (eq. 3), ``"max_layers"`` (ii), ``"max_heads"`` (iii), ``"max_tokens"`` (iv),
            ``"last_k_layers"`` (v).
        last_k: Layers used by ``"last_k_layers"`` (paper: the last 6).
        include_query_tokens: Table 8's "w/ query": the mean of ``alpha`` over every token of
            question + passage, no representative-token selection (``lr`` is not used; only
            with ``aggregation="mean"``). The paper's default excludes the question.
        score_on: ``"alpha"`` (default, eq. 3's raw pre-softmax score), ``"log_attention"``
            (rank-equivalent to alpha except for (ii)/(iii)) or ``"attention"`` (post-softmax
            probabilities, not the paper); see :data:`SCORE_ON`.
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
                 include_query_tokens: bool = False, score_on: str = "alpha",
                 decoder_steps: int = 1, return_answer: bool = False, max_answer_tokens: int = 20,
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
        if score_on not in SCORE_ON:
            raise ValueError(f"score_on must be one of {list(SCORE_ON)}, got {score_on!r}.")
        if include_query_tokens and aggregation != "mean":
            raise ValueError(f"include_query_tokens=True is Table 8's 'w/ query' (the mean over "
                             f"every question + passage token); it does not combine with "
                             f"aggregation={aggregation!r}: use aggregation='mean'.")
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
        self.score_on = score_on
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
        # the token the reader's decoder starts from (training shifts the labels right onto it);
        # a config that names none (transformers 5's T5Config sets none) starts at the pad token,
        # T5's convention. generate() is told the same start (it would use its own otherwise).
        start = getattr(model.config, "decoder_start_token_id", None)
        if start is None:
            start = tokenizer.pad_token_id
        prefix = torch.tensor([[start]], dtype=torch.long, device=device)
        need = max(self.decoder_steps - 1, self.max_answer_tokens if self.return_answer else 0)
        if need == 0:
            return prefix, None
        # no attention mask: encode() packs the passages without padding, so every position counts
        with torch.inference_mode(), self._autocast(device):
            generated = model.generate(
                encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
                decoder_start_token_id=start, max_new_tokens=need, do_sample=False, num_beams=1)
        answer = (tokenizer.decode(generated[0, 1:], skip_special_tokens=True).strip()
                  if self.return_answer else None)
        steps = generated[:, :self.decoder_steps]
        return steps, answer

    def _cross_attentions(self, encoder_states: Any, decoder_input_ids: Any) -> Any:
        """The model's per-layer cross-attention probabilities ``[1, heads, steps, N]`` for the
        given decoder positions over the concatenated encoder states (one decoder forward)."""
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        model, _, device = self._model.get()
        # no attention mask: encode() packs the passages without padding, so every position counts
        with torch.inference_mode(), self._autocast(device):
            out = model(encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
                        decoder_input_ids=decoder_input_ids, output_attentions=True,
                        use_cache=False)
        if not out.cross_attentions or out.cross_attentions[0] is None:
            raise RuntimeError(f"{self.model_name!r} returned no cross-attentions; load it with "
                               "attn_implementation='eager'.")
        return out.cross_attentions

    def cross_attention(self, encoder_states: Any, decoder_input_ids: Any) -> Any:
        """Cross-attention ``[layers, heads, N]`` of the decoder positions, averaged over them."""
        import torch

        # each layer: [1, heads, steps, N] -> mean over steps -> [heads, N]
        return torch.stack([a[0].float().mean(dim=1)
                            for a in self._cross_attentions(encoder_states, decoder_input_ids)])

    def raw_scores(self, encoder_states: Any, decoder_input_ids: Any) -> tuple[Any, Any]:
        """``alpha`` and the attention probabilities, each ``[layers, heads, N]`` (mean over the
        decoder positions), from one decoder forward.

        ``alpha = Q K^T * scaling`` is computed from the query projection of the decoder state
        and the key projection of the encoder states that every cross-attention module produces
        in the forward (captured with forward hooks; the forward itself is the model's own), so
        it works for T5 (``EncDecAttention.q`` / ``.k``) and for BERT-style decoders
        (``crossattention.self.query`` / ``.key``). ``softmax(alpha)`` must reproduce the
        model's own cross-attention probabilities; a model whose cross-attention adds a bias or
        a different scaling fails that check with an error naming ``score_on="log_attention"``.
        """
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        model, _, device = self._model.get()
        modules = _cross_attention_modules(model)
        if not modules:
            raise RuntimeError(f"found no decoder cross-attention projections in "
                               f"{self.model_name!r}; use score_on='log_attention' (rank-"
                               "equivalent to alpha for eq. 3, (iv), (v) and Table 8).")
        captured: list[dict[str, Any]] = [{} for _ in modules]
        handles = []
        for slot, (_, q_proj, k_proj, _, _) in zip(captured, modules):
            handles.append(q_proj.register_forward_hook(
                lambda _m, _i, out, slot=slot: slot.__setitem__("q", out)))
            handles.append(k_proj.register_forward_hook(
                lambda _m, _i, out, slot=slot: slot.__setitem__("k", out)))
        try:  # no attention mask, as in _cross_attentions
            with torch.inference_mode(), self._autocast(device):
                out = model(encoder_outputs=BaseModelOutput(last_hidden_state=encoder_states),
                            decoder_input_ids=decoder_input_ids, output_attentions=True,
                            use_cache=False)
        finally:
            for h in handles:
                h.remove()
        probs = out.cross_attentions
        if not probs or probs[0] is None or len(probs) != len(modules):
            raise RuntimeError(f"{self.model_name!r} returned {len(probs or [])} cross-attention "
                               f"maps for {len(modules)} cross-attention modules; load it with "
                               "attn_implementation='eager' or use score_on='log_attention'.")
        alphas, ps = [], []
        for slot, (_, _, _, scaling, n_heads), p in zip(captured, modules, probs):
            q, k = slot["q"][0].float(), slot["k"][0].float()               # [S, H*d], [N, H*d]
            d = q.shape[-1] // n_heads
            q = q.view(q.shape[0], n_heads, d).transpose(0, 1)               # [H, S, d]
            k = k.view(k.shape[0], n_heads, d).transpose(0, 1)               # [H, N, d]
            alpha = torch.matmul(q, k.transpose(1, 2)) * scaling             # [H, S, N]
            p = p[0].float()                                                 # [H, S, N]
            # bfloat16 keeps 8 bits of mantissa: logits of a trained reader (|alpha| ~ 10-20) are
            # off by up to ~0.1 after rounding, and so is a near-1 probability; a bias or another
            # scaling shifts whole rows far more than that
            tol = 1e-3 if (self.active_dtype or "float32") == "float32" else 1e-1
            err = float((torch.softmax(alpha, dim=-1) - p).abs().max())
            if err > tol:
                raise RuntimeError(
                    f"softmax(Q K^T) differs from {self.model_name!r}'s cross-attention by "
                    f"{err:.2g}: its cross-attention adds a bias or another scaling, so the raw "
                    "score alpha cannot be read here; use score_on='log_attention' (rank-"
                    "equivalent to alpha for eq. 3, (iv), (v) and Table 8).")
            alphas.append(alpha.mean(dim=1))
            ps.append(p.mean(dim=1))
        return torch.stack(alphas), torch.stack(ps)

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
        attn = self.scored_map(states, decoder_ids).cpu()                 # [L, H, N]
        # Table 8 "w/ query": every token of question + passage, no representative tokens
        lr = None if self.include_query_tokens else self.lr
        scores, pos = [], 0
        for n, pmask, qmask in zip(inputs.lengths, inputs.passage_mask, inputs.query_mask):
            mask = pmask | qmask if self.include_query_tokens else pmask
            scores.append(aggregate_cross_attention(attn[:, :, pos:pos + n], mask,
                                                    aggregation=self.aggregation, lr=lr,
                                                    last_k=self.last_k))
            pos += n
        return scores, answer

    def scored_map(self, encoder_states: Any, decoder_input_ids: Any) -> Any:
        """The ``[layers, heads, N]`` map eq. 3 aggregates, per :attr:`score_on`: ``alpha``,
        the mean over decoder positions of ``log softmax(alpha)``, or the attention itself."""
        if self.score_on == "alpha":
            return self.raw_scores(encoder_states, decoder_input_ids)[0]
        if self.score_on == "attention":
            return self.cross_attention(encoder_states, decoder_input_ids)
        return self._log_attention(encoder_states, decoder_input_ids)

    def _log_attention(self, encoder_states: Any, decoder_input_ids: Any) -> Any:
        import torch

        # log of each position's probabilities (never 0 in float32 softmax over finite scores;
        # clamped against underflow in half precision), then the mean over positions
        return torch.stack([a[0].float().clamp_min(1e-38).log().mean(dim=1)
                            for a in self._cross_attentions(encoder_states, decoder_input_ids)])

    def _count(self, pairs: int) -> None:
        super()._count(pairs)
        counters.add(fid_passages=pairs)  # the FiD share of pairs_scored, counted apart

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


class FiDReader:
    """A FiD reader answering a question from passages (greedy generation), for the evaluation
    harness's ``EM@k`` / ``F1@k``: each of a system's top-k units is one encoder passage (question,
    title and text, the reader's training format), as the reader was trained, not one prompt.

    Args:
        model: A FiD / T5 reader folder or hub name (e.g. one ``funnel train`` wrote with
            ``kind = "fid-reader"``).
        max_answer_tokens: The longest answer, in tokens.
        **scorer_kwargs: :class:`FiDAttentionScorer` settings (``max_length``, ``dtype``,
            ``device``, ``template``, ...).

    Its passages are counted like the scorer's (``pairs_scored``, ``fid_passages``); the harness
    keeps a reader's counts apart from the system's cost.
    """

    def __init__(self, model: str, *, max_answer_tokens: int = 20, **scorer_kwargs: Any) -> None:
        for key in ("return_answer", "top_n", "name"):
            if key in scorer_kwargs:
                raise ValueError(f"FiDReader sets {key} itself; remove it (got {key}={scorer_kwargs[key]!r}).")
        self.scorer = FiDAttentionScorer(model=model, return_answer=True, max_answer_tokens=max_answer_tokens,
                                         name="fid_reader", **scorer_kwargs)

    def answer(self, question: str, units: Sequence[Unit]) -> str:
        """The reader's answer to ``question`` from ``units`` (``""`` without any)."""
        units = list(units)
        if not units:
            return ""
        self.scorer.rank(question, units)
        return (self.scorer.last_answer or "").strip()

    def warm_up(self) -> None:
        self.scorer.warm_up()

    def __repr__(self) -> str:
        s = self.scorer
        return (f"FiDReader(model={s.model_name!r}, max_answer_tokens={s.max_answer_tokens}, "
                f"max_length={s.max_length}, dtype={s.dtype!r}, template={s.template!r})")


def _cross_attention_modules(model: Any) -> list[tuple[str, Any, Any, float, int]]:
    """``(name, query projection, key projection, scaling, heads)`` of every decoder
    cross-attention module, in layer order (T5 ``EncDecAttention``, BERT ``crossattention``)."""
    found = []
    for name, m in model.named_modules():
        lname = name.lower()
        if not ("encdecattention" in lname or "crossattention" in lname):
            continue
        q = getattr(m, "q", None) or getattr(m, "query", None)
        k = getattr(m, "k", None) or getattr(m, "key", None)
        heads = getattr(m, "n_heads", None) or getattr(m, "num_attention_heads", None)
        if q is None or k is None or heads is None:
            continue
        found.append((name, q, k, float(getattr(m, "scaling", 1.0)), int(heads)))
    return found


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
