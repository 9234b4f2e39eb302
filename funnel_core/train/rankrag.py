"""RankRAG instruction tuning of a small causal LM (Yu et al., 2024, section 4.2, stage II).

RankRAG tunes one LLM on a blend of context-ranking data (question + passage -> ``True`` /
``False``) and answer-generation data (question + context -> answer), so that the same model
both ranks and answers. :func:`rankrag_blend` builds that blend from (question, answers, gold
passage, hard negatives) records; :func:`train_rankrag` fine-tunes a causal LM on it with LoRA
(``peft``) or in full, with the loss on the answer tokens only, and saves a plain
``save_pretrained`` folder (LoRA adapters merged into the weights), or with ``merge=False`` the
adapters alone, a few MB; :class:`~funnel_core.llm.TransformersLLM` /
:class:`~funnel_core.rerank.rankrag.RankRAGScorer` load either like any local model.

The prompts are rendered exactly as the scorer renders them at inference: the ranking prompt is a
``RankRAGScorer`` prompt template (``{question}``, ``{passage}``), and ``format_prompt`` of the
:class:`~funnel_core.llm.TransformersLLM` that will score (chat template and system prompt) turns
every prompt into the text the model reads; the target (``True``/``False`` or the answer) follows
it, then the tokenizer's end-of-turn / EOS token.

torch, transformers and peft are imported inside the functions that need them.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.llm import ADAPTER_FILE

__all__ = ["RankRAGExample", "RankRAGTrainResult", "rankrag_blend", "train_rankrag",
           "DEFAULT_QA_PROMPT"]

#: Answer-generation prompt of the blend (RankRAG's QA instruction, short-answer form).
DEFAULT_QA_PROMPT = ("Passage: {passage}\n\nAnswer the following question from the passage with a "
                     "short span. Question: {question}")


@dataclass
class RankRAGExample:
    """One instruction-tuning example: the user prompt (un-templated) and the target reply."""

    prompt: str
    target: str
    kind: str = "rank"          # "rank" or "qa"


@dataclass
class RankRAGTrainResult:
    output_dir: str
    step_losses: list[float]
    steps: int
    seconds: float
    stopped_early: bool
    examples_seen: int
    config: dict[str, Any] = field(default_factory=dict)


def _cut(text: str, max_words: int) -> str:
    words = text.split()
    return " ".join(words[:max_words]) if len(words) > max_words else text


def rankrag_blend(records: Sequence[dict], *, rank_prompt: str, qa_prompt: str = DEFAULT_QA_PROMPT,
                  negatives_per_question: int = 1, qa_share: float = 0.25,
                  max_passage_words: int = 300, seed: int = 0) -> list[RankRAGExample]:
    """The RankRAG blend: context ranking (gold -> ``True``, hard negatives -> ``False``) plus QA.

    Args:
        records: Dicts with ``question``, ``answers`` (list), ``positive`` (a passage with the
            answer) and ``negatives`` (hard negatives, best first).
        rank_prompt: The ranking prompt template (``{question}``, ``{passage}``), the same one the
            scorer uses (e.g. ``RankRAGScorer(...).prompt``).
        qa_prompt: Answer-generation template (``{question}``, ``{passage}``).
        negatives_per_question: ``False`` examples per question (``True`` examples: one).
        qa_share: Share of the questions (with answers) that also give an answer-generation
            example: exactly ``round(qa_share * n)`` of them, drawn with ``seed``.
        max_passage_words: Passages are cut as ``RankRAGScorer`` cuts them.
        seed: Shuffling seed (the returned list is shuffled).
    """
    if not 0.0 <= qa_share <= 1.0:
        raise ValueError(f"qa_share must be in [0, 1], got {qa_share}.")
    check_positive_int(negatives_per_question, "negatives_per_question")
    rng = random.Random(seed)
    # exactly round(qa_share * n) of the questions with answers give a QA example (a per-question
    # coin flip gave 1 of 32 at qa_share=0.25 with seed 0)
    answered = [i for i, r in enumerate(records) if r.get("answers")]
    qa_rows = set(rng.sample(answered, round(qa_share * len(answered))))
    out: list[RankRAGExample] = []
    for row, r in enumerate(records):
        q, pos = r["question"], _cut(r["positive"], max_passage_words)
        out.append(RankRAGExample(rank_prompt.format(question=q, passage=pos), "True", "rank"))
        for neg in list(r["negatives"])[:negatives_per_question]:
            out.append(RankRAGExample(rank_prompt.format(question=q, passage=_cut(neg, max_passage_words)),
                                      "False", "rank"))
        if row in qa_rows:
            out.append(RankRAGExample(qa_prompt.format(question=q, passage=pos), r["answers"][0], "qa"))
    rng.shuffle(out)
    return out


def encode_example(tokenizer: Any, format_prompt: Callable[[str], str], ex: RankRAGExample,
                   max_length: int) -> tuple[list[int], list[int]]:
    """Token ids of ``format_prompt(prompt) + target + end`` and labels (-100 on the prompt).

    The prompt is cut from the left (as :class:`~funnel_core.llm.TransformersLLM` truncates) so
    the target always survives.
    """
    prompt_ids = tokenizer(format_prompt(ex.prompt), add_special_tokens=False)["input_ids"]
    target_ids = tokenizer(ex.target, add_special_tokens=False)["input_ids"]
    end = _end_token_id(tokenizer)
    if end is not None:
        target_ids = target_ids + [end]
    keep = max(1, max_length - len(target_ids))
    prompt_ids = prompt_ids[-keep:]
    return prompt_ids + target_ids, [-100] * len(prompt_ids) + target_ids


def _end_token_id(tokenizer: Any) -> int | None:
    """``<|im_end|>`` for ChatML templates (SmolLM2), else the EOS token."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if "<|im_end|>" in template:
        ids = tokenizer.convert_tokens_to_ids(["<|im_end|>"])
        if ids and ids[0] is not None and ids[0] != tokenizer.unk_token_id:
            return ids[0]
    return tokenizer.eos_token_id


def _forget_gguf_origin(model: Any) -> None:
    """Let a model loaded from a GGUF file be saved as a plain checkpoint.

    transformers dequantises GGUF weights on load but keeps a GGUF "quantizer" on the model and a
    ``quantization_config`` in its config; ``save_pretrained`` then refuses ("quantized with gguf
    and is not serializable") and a saved config would send the next ``from_pretrained`` looking
    for the GGUF file. The weights are ordinary float tensors by now, so both are dropped.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    qconf = getattr(model.config, "quantization_config", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if method is None and qconf is not None:
        method = qconf.get("quant_method") if isinstance(qconf, dict) else getattr(qconf, "quant_method", None)
    if str(getattr(method, "value", method)).lower() != "gguf":
        return
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def train_rankrag(llm: Any, examples: Sequence[RankRAGExample], output_dir: str | os.PathLike, *,
                  lora: bool = True, lora_r: int = 16, lora_alpha: int = 32,
                  lora_dropout: float = 0.05,
                  target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"),
                  epochs: int = 1, batch_size: int = 8, learning_rate: float = 2e-4,
                  weight_decay: float = 0.0, warmup_ratio: float = 0.05, max_length: int = 384,
                  max_seconds: float | None = None, seed: int = 0,
                  log: Callable[[dict], None] | None = None,
                  dtype: str = "auto", merge: bool = True,
                  base_name: str | None = None) -> RankRAGTrainResult:
    """Fine-tune ``llm``'s model on ``examples`` and save a merged ``save_pretrained`` folder
    (or, with ``merge=False``, the LoRA adapters alone).

    Args:
        llm: A :class:`~funnel_core.llm.TransformersLLM` (its model, tokenizer, device and
            ``format_prompt`` are used, so training sees the prompts the scorer will send).
        examples: From :func:`rankrag_blend`.
        output_dir: Where the merged model and tokenizer are saved.
        lora: LoRA adapters (merged before saving unless ``merge=False``) when True, else full
            fine-tuning.
        merge: With ``lora``, False saves only the adapters, in float16 (a peft folder: a few MB
            where the merged model is the whole model's size); :class:`~funnel_core.llm.TransformersLLM`
            loads such a folder onto its base (:func:`save_adapters`).
        base_name: The base the adapter folder names (default ``llm.model_name_or_path``);
            ``"smollm2"`` names the packaged SmolLM2 wherever it is installed.
        lora_r, lora_alpha, lora_dropout, target_modules: LoRA settings (peft).
        epochs, batch_size, learning_rate, weight_decay, warmup_ratio: AdamW with linear warm-up
            and decay over the planned steps.
        max_length: Tokens per example (the prompt is cut from the left).
        max_seconds: Stop after the step that passes this wall-clock budget (the model is saved).
        seed: Shuffling / LoRA initialisation seed.
        log: Called with ``{"step", "loss", "seconds"}`` after every step.
        dtype: Compute precision of the steps: ``"auto"`` (default; :mod:`funnel_core.hardware`):
            bfloat16 autocast only where the hardware runs bf16 natively, float32 otherwise;
            ``"float32"`` or ``"bfloat16"`` (an explicit bf16 request on hardware without it
            warns once). float16 is not used for training (it would need loss scaling): it
            trains in float32. The trained parameters are float32: LoRA adapters are (peft
            upcasts them) and full fine-tuning upcasts a half-precision model first; frozen
            base weights stay in the dtype ``llm`` loaded them in. ``config["dtype"]`` of the
            result records the precision used.
    """
    import torch
    from transformers import get_linear_schedule_with_warmup

    examples = list(examples)
    if not examples:
        raise ValueError("train_rankrag needs at least one RankRAGExample, got none.")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(epochs, "epochs")
    if lora and not merge and llm.gguf_file and base_name != "smollm2":  # before training, not after
        raise ValueError(f"merge=False over the GGUF file {llm.gguf_file!r}: an adapter folder can name "
                         "only the packaged SmolLM2 (base_name='smollm2') as a GGUF base; pass merge=True.")
    from funnel_core.hardware import autocast, resolve_dtype

    model, tokenizer, device = llm._model.get()
    active = resolve_dtype(dtype, device)
    if active == "float16":
        active = "float32"
    if not lora and next(model.parameters()).dtype != torch.float32:
        model.float()  # full fine-tuning keeps float32 master weights
        model._funnel_dtype = "float32"  # what llm.active_dtype reports from now on
    torch.manual_seed(seed)
    rng = random.Random(seed)
    if lora:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as exc:  # pragma: no cover - install problem
            raise ImportError("LoRA tuning needs peft: `pip install 'funnel-rag[train]'` "
                              "(or `pip install peft`), or pass lora=False.") from exc
        present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        targets = [t for t in target_modules if t in present]
        if not targets:
            raise ValueError(f"none of target_modules {list(target_modules)} is a module of "
                             f"{type(model).__name__}; name its linear layers.")
        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=lora_alpha,
                                                 lora_dropout=lora_dropout, target_modules=targets,
                                                 task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay)
    per_epoch = math.ceil(len(examples) / batch_size)
    total = per_epoch * epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(warmup_ratio * total), total)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    encoded = [encode_example(tokenizer, llm.format_prompt, ex, max_length) for ex in examples]
    losses: list[float] = []
    t0, steps, seen, stopped = time.perf_counter(), 0, 0, False
    for _ in range(epochs):
        order = list(range(len(encoded)))
        rng.shuffle(order)
        for b in range(0, len(order), batch_size):
            rows = [encoded[i] for i in order[b:b + batch_size]]
            width = max(len(ids) for ids, _ in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            labels = torch.full((len(rows), width), -100, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, (x, y) in enumerate(rows):          # right padding for training
                ids[i, :len(x)] = torch.tensor(x)
                labels[i, :len(y)] = torch.tensor(y)
                mask[i, :len(x)] = 1
            with autocast(active, device):
                out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                            labels=labels.to(device), use_cache=False)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
            seen += len(rows)
            losses.append(float(out.loss.detach()))
            if log:
                log({"step": steps, "loss": losses[-1], "seconds": round(time.perf_counter() - t0, 1)})
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                stopped = True
                break
        if stopped:
            break
    seconds = time.perf_counter() - t0
    model.eval()
    out_dir = Path(output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = base_name or llm.model_name_or_path
    base_dtype = str(next(model.parameters()).dtype).replace("torch.", "")  # the base weights (LoRA: as loaded)
    if lora and not merge:
        save_adapters(model, out_dir, base, base_dtype)
    else:
        if lora:
            model = model.merge_and_unload()
        _forget_gguf_origin(model)
        model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    config = dict(lora=lora, merged=lora and merge, lora_r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                  epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                  warmup_ratio=warmup_ratio, max_length=max_length, max_seconds=max_seconds,
                  seed=seed, planned_steps=total, dtype=active,
                  base_weights_dtype=base_dtype, **({} if merge or not lora else {"base_model": base}))
    return RankRAGTrainResult(output_dir=str(out_dir), step_losses=losses, steps=steps,
                              seconds=seconds, stopped_early=stopped, examples_seen=seen,
                              config=config)


def save_adapters(model: Any, folder: Path, base: str, base_dtype: str) -> None:
    """A peft model's LoRA adapters into ``folder`` as peft writes them (``adapter_config.json``
    naming ``base``, ``adapter_model.safetensors``), in float16 like every kept model, and
    ``base_dtype``, the dtype of the base weights they were trained over (``funnel_adapter.json``):
    the loader merges them into the base in that dtype, which reproduces the merged model of
    ``merge=True``."""
    import json

    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    state = get_peft_model_state_dict(model)
    for name, tensor in state.items():
        if not torch.isfinite(tensor).all() or tensor.abs().max() > torch.finfo(torch.float16).max:
            raise ValueError(f"adapter weight {name!r} cannot be kept as float16 (not finite or too large).")
    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in state.items()},
              str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = model.peft_config["default"]
    config.base_model_name_or_path, config.inference_mode = base, True
    config.save_pretrained(str(folder))
    (folder / ADAPTER_FILE).write_text(json.dumps({"base_dtype": base_dtype}), encoding="utf-8")
