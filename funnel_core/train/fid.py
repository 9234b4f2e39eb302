"""Fusion-in-Decoder reader training (FunnelRAG Appendix A.3; Izacard & Grave, 2021).

A T5 model learns to generate the answer from the question and ``N`` passages: each
``question: ... title: ... context: ...`` input is encoded *separately* by the encoder, the
``N`` encoder outputs are concatenated (with their padding masked), and the decoder is trained
with teacher forcing and the usual language-modelling (cross-entropy) loss on the answer tokens.

The model stays a stock ``T5ForConditionalGeneration``, or a stock ``EncoderDecoderModel``
warm-started from a BERT encoder (BERT2BERT, Rothe et al., 2020: the encoder and the decoder both
start from e.g. the packaged all-MiniLM-L6-v2, the decoder's cross-attention and LM-head transform
start random; :func:`init_fid_from_encoder`): FiD only changes how the encoder is called. The checkpoint written by :func:`train_fid` is therefore a plain ``save_pretrained``
folder that :class:`funnel_core.rerank.fid.FiDAttentionScorer` (and ``transformers``) load.

Example::

    examples = [FiDExample(question="who wrote Hamlet?", answers=["Shakespeare"],
                           passages=[("Hamlet", "Hamlet is a tragedy by Shakespeare."), ...])]
    result = train_fid("google/flan-t5-base", examples, "models/fid", n_passages=20, epochs=2)
    scorer = FiDAttentionScorer(model=result.output_dir)
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.models import load_pretrained, resolve_device
from funnel_core.rerank.fid import DEFAULT_TEMPLATE, DEFAULT_TEMPLATE_NO_TITLE

__all__ = ["FiDExample", "FiDTrainResult", "fid_collate", "fid_loss", "train_fid",
           "evaluate_fid_loss", "init_fid_from_encoder", "encode_examples", "EncodedExamples"]



@dataclass
class FiDExample:
    """One training example: a question, its gold answers and its retrieved passages.

    ``passages`` items are plain texts, ``(title, text)`` pairs, or dicts with ``"text"`` and an
    optional ``"title"``. The first answer is the training target.
    """

    question: str
    answers: list[str]
    passages: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"FiDExample.question must be a non-empty str, got {self.question!r}.")
        if isinstance(self.answers, str):
            self.answers = [self.answers]
        if not self.answers or not all(isinstance(a, str) and a.strip() for a in self.answers):
            raise ValueError(f"FiDExample.answers must hold at least one non-empty str, got "
                             f"{self.answers!r} for question {self.question!r}.")
        if not self.passages:
            raise ValueError(f"FiDExample for {self.question!r} has no passages; FiD reads the "
                             "answer from retrieved passages.")


@dataclass
class FiDTrainResult:
    """What :func:`train_fid` did: the loss per step, per epoch, and where the model is."""

    output_dir: str
    step_losses: list[float]
    epoch_losses: list[float]
    steps: int
    seconds: float = 0.0
    stopped_early: bool = False
    dtype: str = "float32"  # the compute precision used: "bfloat16" (autocast) or "float32"
    encode_seconds: float = 0.0  # freeze_encoder: the one encoder pass over every example


def _title_text(p: Any) -> tuple[str | None, str]:
    if isinstance(p, str):
        return None, p
    if isinstance(p, tuple) and len(p) == 2:
        return p[0], p[1]
    if isinstance(p, dict) and "text" in p:
        return p.get("title"), p["text"]
    raise TypeError(f"a passage must be a str, a (title, text) pair or a dict with 'text', got "
                    f"{type(p).__name__}.")


def fid_collate(tokenizer: Any, examples: Sequence[FiDExample], *, n_passages: int,
                max_length: int = 256, answer_max_length: int = 32,
                template: str = DEFAULT_TEMPLATE,
                template_no_title: str = DEFAULT_TEMPLATE_NO_TITLE) -> dict[str, Any]:
    """Tensors for a batch: ``input_ids``/``attention_mask`` ``[B, n_passages, L]``, ``labels``.

    Examples with fewer than ``n_passages`` passages get fully masked empty slots; extra
    passages are dropped (keep the best first). Label padding is ``-100`` (ignored by the loss).
    """
    import torch

    texts, slots = [], []
    for ex in examples:
        ps = ex.passages[:n_passages]
        for p in ps:
            title, text = _title_text(p)
            t = template if title else template_no_title
            texts.append(t.format(question=ex.question, title=title or "", text=text))
        slots.append(len(ps))
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="longest",
                    return_tensors="pt")
    width = enc["input_ids"].shape[1]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(examples), n_passages, width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), n_passages, width), dtype=torch.long)
    row = 0
    for b, n in enumerate(slots):
        input_ids[b, :n] = enc["input_ids"][row:row + n]
        mask[b, :n] = enc["attention_mask"][row:row + n]
        row += n
    labels = _answer_labels(tokenizer, [ex.answers[0] for ex in examples], answer_max_length)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def _answer_labels(tokenizer: Any, answers: list[str], max_length: int) -> Any:
    """Answer token ids ending in EOS, padded with -100.

    The answer is tokenised *without* the tokenizer's special tokens (a BERT tokenizer would add
    ``[CLS] ... [SEP]``, and the decoder already starts from its own start token), then the EOS
    (T5: ``</s>``; BERT2BERT: ``[SEP]``, see :func:`init_fid_from_encoder`) is appended.
    """
    import torch

    eos = tokenizer.eos_token_id
    if eos is None:
        eos = getattr(tokenizer, "sep_token_id", None)
    rows = []
    for ids in tokenizer(answers, truncation=True, max_length=max_length,
                         add_special_tokens=False)["input_ids"]:
        ids = list(ids)[:max_length - 1 if eos is not None else max_length]
        if eos is not None:
            ids.append(eos)
        rows.append(ids)
    labels = torch.full((len(rows), max(len(r) for r in rows)), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        labels[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return labels


def fid_loss(model: Any, input_ids: Any, attention_mask: Any, labels: Any) -> Any:
    """The FiD forward pass and its LM loss.

    The encoder runs on ``[B * n, L]`` (each passage alone); its outputs are reshaped to
    ``[B, n * L]`` with the matching mask, and the decoder (teacher forcing on ``labels``)
    attends over all passages at once.
    """
    from transformers.modeling_outputs import BaseModelOutput

    b, n, length = input_ids.shape
    states = model.encoder(input_ids=input_ids.view(b * n, length),
                           attention_mask=attention_mask.view(b * n, length)).last_hidden_state
    states = states.reshape(b, n * length, states.shape[-1])
    out = model(encoder_outputs=BaseModelOutput(last_hidden_state=states),
                attention_mask=attention_mask.view(b, n * length), labels=labels,
                use_cache=False)
    return out.loss


def _load(model: Any, device: str) -> tuple[Any, Any]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    if isinstance(model, (str, os.PathLike)):
        tokenizer = load_pretrained(AutoTokenizer.from_pretrained, str(model), what="FiD tokenizer",
                                    padding_side="right")
        model = load_pretrained(AutoModelForSeq2SeqLM.from_pretrained, str(model),
                                what="FiD (T5 or EncoderDecoderModel) model",
                                attn_implementation="eager")
    else:
        raise TypeError(f"model must be a hub name or a local folder, got {type(model).__name__}.")
    return model.to(device), tokenizer


def _batches(examples: Sequence[Any], batch_size: int, rng: random.Random | None):
    order = list(range(len(examples)))
    if rng is not None:
        rng.shuffle(order)
    for i in range(0, len(order), batch_size):
        yield [examples[j] for j in order[i:i + batch_size]]


def evaluate_fid_loss(model: Any, examples: Sequence[FiDExample], *, n_passages: int = 10,
                      batch_size: int = 4, max_length: int = 256, answer_max_length: int = 32,
                      device: str | None = None, tokenizer: Any = None) -> float:
    """Mean LM loss (per batch, weighted by examples) of a model on ``examples``, no training.

    ``model`` is a hub name / folder, or an already loaded model together with ``tokenizer``.
    """
    import torch

    device = resolve_device(device)
    if tokenizer is None:
        model, tokenizer = _load(model, device)
    model.eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for batch in _batches(list(examples), batch_size, None):
            t = fid_collate(tokenizer, batch, n_passages=n_passages, max_length=max_length,
                            answer_max_length=answer_max_length)
            loss = fid_loss(model, *(t[k].to(device) for k in ("input_ids", "attention_mask", "labels")))
            total += float(loss) * len(batch)
            count += len(batch)
    return total / max(count, 1)


def train_fid(model: str | os.PathLike, examples: Sequence[FiDExample],
              output_dir: str | os.PathLike, *, n_passages: int = 10, epochs: int = 1,
              batch_size: int = 2, learning_rate: float = 1e-4, weight_decay: float = 0.01,
              warmup_ratio: float = 0.1, max_grad_norm: float = 1.0, max_length: int = 256,
              answer_max_length: int = 32, accumulation_steps: int = 1,
              device: str | None = None, seed: int = 0, save_every_epoch: bool = False,
              progress: bool = True, max_seconds: float | None = None,
              bf16: bool = False, dtype: str = "auto", freeze_encoder: bool = False,
              freeze_embeddings: bool = False, checkpointer: Any = None) -> FiDTrainResult:
    """Train a T5 checkpoint as a Fusion-in-Decoder reader and save it to ``output_dir``.

    AdamW with linear warm-up and decay, gradient clipping, teacher forcing, LM loss on the
    first gold answer (Appendix A.3). Runs on CPU or GPU (``device``); a tqdm bar shows the
    running loss.

    Args:
        model: Hub name or local folder of the T5 checkpoint to start from.
        examples: Training examples (question, answers, passages).
        output_dir: Folder for the final checkpoint (model + tokenizer, ``save_pretrained``);
            with ``save_every_epoch`` also ``epoch-<i>/`` sub-folders.
        n_passages: Passages per question (the paper's FiD reads the top passages of the
            previous stage).
        epochs: Passes over the examples.
        batch_size: Examples per optimiser step.
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_ratio: Share of the steps with a linear warm-up.
        max_grad_norm: Gradient clipping norm.
        max_length: Tokens per (question + passage) input.
        answer_max_length: Tokens of the target answer.
        accumulation_steps: Batches per optimiser step.
        device: ``"cpu"``, ``"cuda"``... (default: best available).
        seed: Shuffling and initialisation seed.
        progress: Show a tqdm progress bar.
        max_seconds: Stop after the optimiser step that passes this wall-clock budget (the
            learning-rate schedule still spans the full run; ``stopped_early`` says so).
        bf16: An explicit request for bfloat16 autocast of the forward pass (weights and
            optimiser stay fp32); on hardware without native bf16 it warns once (25-30x slower
            steps were measured there). ``False`` (default) leaves it to ``dtype``.
        dtype: ``"auto"`` (default; :mod:`funnel_core.hardware`): bfloat16 autocast only where
            the hardware runs bf16 natively (AVX-512-BF16/AMX CPUs, GPUs of compute capability
            >= 8), float32 otherwise; ``"float32"`` or ``"bfloat16"``. float16 is not used for
            training (it would need loss scaling): it trains in float32. The result's ``dtype``
            records the precision used.
        freeze_encoder: Keep the encoder fixed and train the decoder (self-attention,
            cross-attention, feed-forward) only. The encoder then runs once per example, before
            the first step, without gradients, and its outputs (float16 in memory) are reused by
            every epoch: the way to train a reader on a CPU (see :func:`encode_examples`). The
            passages still pass through the encoder with the question, as FiD reads them.
        freeze_embeddings: Keep the word embeddings (and an output matrix tied to them) fixed.
        checkpointer: A :class:`~funnel_core.train.checkpoint.Checkpointer`: the run saves its
            state every few minutes and resumes from a saved one, skipping the steps taken.

    Returns:
        :class:`FiDTrainResult` with the loss of every optimiser step and the mean loss of every
        epoch.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    examples = list(examples)
    if not examples:
        raise ValueError("train_fid needs at least one FiDExample, got an empty list.")
    for ex in examples:
        if not isinstance(ex, FiDExample):
            raise TypeError(f"examples must be FiDExample objects, got {type(ex).__name__}.")
    for name, v in (("n_passages", n_passages), ("epochs", epochs), ("batch_size", batch_size),
                    ("accumulation_steps", accumulation_steps), ("max_length", max_length),
                    ("answer_max_length", answer_max_length)):
        check_positive_int(v, name)
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}.")
    out = Path(output_dir)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    device = resolve_device(device)
    from funnel_core.hardware import autocast, requested_dtype, resolve_dtype

    active = resolve_dtype(requested_dtype(dtype, bf16=bf16), device)
    if active == "float16":
        active = "float32"
    net, tokenizer = _load(model, device)
    if freeze_encoder:
        net.get_encoder().requires_grad_(False)
    if freeze_embeddings:
        for emb in (net.get_input_embeddings(), net.get_decoder().get_input_embeddings()):
            emb.weight.requires_grad_(False)
        if net.get_output_embeddings() is not None:
            net.get_output_embeddings().weight.requires_grad_(False)
    net.train()
    collate: dict[str, Any] = dict(n_passages=n_passages, max_length=max_length,
                                   answer_max_length=answer_max_length)
    cached = encode_examples(net, tokenizer, examples, device=device, dtype=active, progress=progress,
                             **collate) if freeze_encoder else None

    decay = [p for n, p in net.named_parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in net.named_parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate)
    batches_per_epoch = math.ceil(len(examples) / batch_size)
    total_steps = max(1, math.ceil(batches_per_epoch / accumulation_steps) * epochs)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(warmup_ratio * total_steps),
                                                total_steps)

    step_losses: list[float] = []
    epoch_losses: list[float] = []
    done_batches = 0  # batches already trained by a run this one resumes
    resumed = checkpointer.load(net, optimizer, scheduler) if checkpointer is not None else None
    if resumed:
        step_losses, epoch_losses = list(resumed["step_losses"]), list(resumed["epoch_losses"])
        done_batches = int(resumed["batches"])
    bar = tqdm(total=batches_per_epoch * epochs, desc="FiD training", disable=not progress,
               initial=done_batches)
    steps = len(step_losses)
    import time

    t0 = time.perf_counter()
    stopped = False
    seen_batches = 0
    for epoch in range(epochs):
        running, seen, pending = 0.0, 0, 0.0
        for i, index_batch in enumerate(_batches(list(range(len(examples))), batch_size, rng)):
            seen_batches += 1
            if seen_batches <= done_batches:  # resumed: this batch was trained before
                continue
            batch = [examples[j] for j in index_batch]
            with autocast(active, device):
                if cached is not None:
                    loss = _cached_loss(net, cached, index_batch, tokenizer, batch, answer_max_length, device)
                else:
                    t = fid_collate(tokenizer, batch, **collate)
                    loss = fid_loss(net, *(t[k].to(device)
                                           for k in ("input_ids", "attention_mask", "labels")))
            (loss / accumulation_steps).backward()
            value = float(loss.detach())
            pending += value / accumulation_steps
            running += value * len(batch)
            seen += len(batch)
            last = i + 1 == batches_per_epoch
            if (i + 1) % accumulation_steps == 0 or last:
                torch.nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                step_losses.append(pending)
                pending = 0.0
                steps += 1
                if checkpointer is not None:
                    checkpointer.save(net, optimizer, scheduler,
                                      {"batches": seen_batches, "step_losses": step_losses,
                                       "epoch_losses": epoch_losses})
                if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                    stopped = True
            bar.update(1)
            bar.set_postfix(epoch=epoch, loss=f"{running / max(seen, 1):.4f}")
            if stopped:
                break
        if seen:
            epoch_losses.append(running / seen)
        if save_every_epoch:
            _save(net, tokenizer, out / f"epoch-{epoch}")
        if stopped:
            break
    bar.close()
    net.eval()
    _save(net, tokenizer, out)
    return FiDTrainResult(output_dir=str(out), step_losses=step_losses,
                          epoch_losses=epoch_losses, steps=steps,
                          seconds=time.perf_counter() - t0, stopped_early=stopped, dtype=active,
                          encode_seconds=cached.seconds if cached is not None else 0.0)


@dataclass
class EncodedExamples:
    """Encoder outputs of every training example, computed once (``freeze_encoder``).

    ``states[i]`` is ``[n_i, L_i, d]`` float16 (the example's passages, cut to its longest one),
    ``masks[i]`` ``[n_i, L_i]``; slots beyond an example's passages are fully masked."""

    states: list[Any]
    masks: list[Any]
    seconds: float


def encode_examples(model: Any, tokenizer: Any, examples: Sequence[FiDExample], *, n_passages: int,
                    max_length: int = 256, answer_max_length: int = 32, device: str = "cpu",
                    dtype: str = "float32", batch_size: int = 8,
                    progress: bool = True) -> EncodedExamples:
    """Run the (frozen) encoder over every example's ``question + passage`` inputs once.

    Why this is the CPU recipe: with the encoder fixed, its forward pass is the same in every
    epoch and needs no backward pass, so it is paid once instead of ``3 x epochs`` times; the
    decoder, which is what FiD post-ranking reads (its cross-attention), is what trains.
    """
    import time

    import torch
    from tqdm.auto import tqdm

    from funnel_core.hardware import autocast

    t0 = time.perf_counter()
    encoder = model.get_encoder()
    states, masks = [], []
    with torch.inference_mode(), autocast(dtype, device):
        for start in tqdm(range(0, len(examples), batch_size), desc="FiD encoding", disable=not progress):
            chunk = examples[start:start + batch_size]
            t = fid_collate(tokenizer, chunk, n_passages=n_passages, max_length=max_length,
                            answer_max_length=answer_max_length)
            b, n, length = t["input_ids"].shape
            ids, mask = t["input_ids"].view(b * n, length), t["attention_mask"].view(b * n, length)
            keep = mask.sum(dim=1) > 0
            out = torch.zeros((b * n, length, encoder.config.hidden_size), dtype=torch.float16)
            if keep.any():
                hidden = encoder(input_ids=ids[keep].to(device),
                                 attention_mask=mask[keep].to(device)).last_hidden_state
                out[keep] = hidden.to("cpu", torch.float16)
            out, mask = out.view(b, n, length, -1), t["attention_mask"]
            for j in range(b):
                width = max(1, int(mask[j].sum(dim=1).max()))
                states.append(out[j, :, :width].clone())
                masks.append(mask[j, :, :width].clone())
    return EncodedExamples(states=states, masks=masks, seconds=time.perf_counter() - t0)


def _cached_loss(model: Any, cached: EncodedExamples, index_batch: Sequence[int], tokenizer: Any,
                 batch: Sequence[FiDExample], answer_max_length: int, device: str) -> Any:
    """:func:`fid_loss` from encoder outputs computed before (the encoder is frozen)."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    width = max(int(cached.states[i].shape[1]) for i in index_batch)
    n = max(int(cached.states[i].shape[0]) for i in index_batch)
    d = cached.states[index_batch[0]].shape[2]
    states = torch.zeros((len(index_batch), n, width, d), dtype=torch.float32)
    mask = torch.zeros((len(index_batch), n, width), dtype=torch.long)
    for b, i in enumerate(index_batch):
        s = cached.states[i]
        states[b, :s.shape[0], :s.shape[1]] = s.float()
        mask[b, :s.shape[0], :s.shape[1]] = cached.masks[i]
    labels = _answer_labels(tokenizer, [ex.answers[0] for ex in batch], answer_max_length)
    out = model(encoder_outputs=BaseModelOutput(last_hidden_state=states.view(len(batch), n * width, d).to(device)),
                attention_mask=mask.view(len(batch), n * width).to(device), labels=labels.to(device),
                use_cache=False)
    return out.loss


def init_fid_from_encoder(encoder: str | os.PathLike, output_dir: str | os.PathLike, *,
                          decoder: str | os.PathLike | None = None, seed: int = 0,
                          decoder_layers: int | None = None) -> str:
    """Warm-start a BERT2BERT ``EncoderDecoderModel`` for FiD training and save it.

    The encoder and the decoder both start from ``encoder`` (a BERT-style encoder folder such as
    :func:`funnel_core.testing.minilm_path`; ``decoder`` overrides the decoder's start); the
    decoder gets causal self-attention plus newly initialised cross-attention layers and LM-head
    transform (its output embedding is tied to its word embeddings), as in Rothe et al. (2020).
    The decoder starts from ``[CLS]`` and stops at ``[SEP]``; the saved tokenizer names them
    ``bos``/``eos`` so :func:`train_fid` and
    :class:`~funnel_core.rerank.fid.FiDAttentionScorer` handle it like a T5 checkpoint.

    ``decoder_layers`` keeps only the decoder's lowest layers (a shallower, faster reader: the
    CPU recipe trains 3 of MiniLM's 6); ``None`` keeps all.

    Returns the folder, loadable with ``AutoModelForSeq2SeqLM.from_pretrained``.
    """
    import torch
    from transformers import AutoTokenizer, EncoderDecoderModel

    torch.manual_seed(seed)
    out = Path(output_dir)
    enc, dec = str(encoder), str(decoder or encoder)
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, enc, what="encoder tokenizer")
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer of {enc!r} lacks [CLS]/[SEP]/[PAD]; "
                         "init_fid_from_encoder expects a BERT-style encoder.")
    model = load_pretrained(EncoderDecoderModel.from_encoder_decoder_pretrained, enc,
                            what="BERT2BERT warm start", decoder_pretrained_model_name_or_path=dec)
    if decoder_layers is not None:
        bert_decoder: Any = model.decoder
        layers = bert_decoder.bert.encoder.layer
        check_positive_int(decoder_layers, "decoder_layers")
        if decoder_layers > len(layers):
            raise ValueError(f"decoder_layers={decoder_layers} but the decoder has {len(layers)} layers.")
        bert_decoder.bert.encoder.layer = layers[:decoder_layers]
        model.config.decoder.num_hidden_layers = decoder_layers
        bert_decoder.config.num_hidden_layers = decoder_layers
    for cfg in (model.config, model.generation_config):
        cfg.decoder_start_token_id = tokenizer.cls_token_id
        cfg.bos_token_id = tokenizer.cls_token_id
        cfg.eos_token_id = tokenizer.sep_token_id
        cfg.pad_token_id = tokenizer.pad_token_id
    model.config.vocab_size = model.config.decoder.vocab_size
    tokenizer.bos_token, tokenizer.eos_token = tokenizer.cls_token, tokenizer.sep_token
    _save(model, tokenizer, out)
    return str(out)


def _save(model: Any, tokenizer: Any, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
