"""Attention-based post-ranking (FunnelRAG stage 3), docs/postrank.md.

1. **Speed (CPU):** passages per second of :class:`FiDAttentionScorer` for a t5-small-sized and a
   t5-base-sized T5 (random weights, vocab 32128, a byte-level BPE tokenizer trained here so every input
   is cut to exactly ``--tokens``) against a MiniLM-sized cross-encoder (all-MiniLM-L6-v2, random
   ``num_labels=1`` head) on the same ``--passages`` pairs cut to the same length; timed in one process,
   interleaved, ``--repeats`` times; medians reported.
2. **Quality:** :class:`AttentionLMScorer` (SmolLM2-135M-Instruct GGUF) reranking BM25's top-20 of
   ~100-word SQuAD dev-a passages: answer recall@1, calibrated and raw attention, vs BM25's order, on a
   seeded sample of questions.

    nice -n 10 python benchmarks/bench_fid.py --data /work/shared/data [--quick]
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, interleaved_seconds, machine, parser, save_json

from funnel_core import testing
from funnel_core.bm25 import BM25Index
from funnel_core.evaluation import has_answer, load_squad
from funnel_core.evaluation.stats import mcnemar_exact, paired_bootstrap
from funnel_core.text import word_windows
from funnel_core.units import Unit

T5_CONFIGS = {
    "t5-small-sized": dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_decoder_layers=6, num_heads=8),
    "t5-base-sized": dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_decoder_layers=12, num_heads=12),
}


def squad_passages(path: Path) -> tuple[list[Unit], list]:
    """SQuAD paragraphs re-chunked into ~100-word passages, and every question."""
    arts = load_squad(path)
    units = [Unit(id=f"{a.title}/{pi}/{wi}", text=text, metadata={"title": a.title.replace("_", " ")})
             for a in arts for pi, para in enumerate(a.paragraphs) for wi, text in enumerate(word_windows(para, 100))]
    return units, [q for a in arts for q in a.questions]


# -- 1. speed ------------------------------------------------------------------------------
def build_t5(folder: Path, cfg: dict) -> str:
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    tok = testing.build_bpe_tokenizer(vocab_size=2000)
    tok.pad_token, tok.eos_token, tok.unk_token = "<pad>", "</s>", "<unk>"
    config = T5Config(vocab_size=32128, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      decoder_start_token_id=tok.pad_token_id, **cfg)
    T5ForConditionalGeneration(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def bench_speed(units: list[Unit], questions: list, n_passages: int, tokens: int,
                repeats: int) -> dict:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from funnel_core.rerank.fid import FiDAttentionScorer

    rng = random.Random(0)
    long_units = [u for u in units if len(u.text.split()) >= 90]
    passages = [u.text for u in rng.sample(long_units, n_passages)]
    query = questions[0].question

    ce_tok = AutoTokenizer.from_pretrained(testing.minilm_path())
    ce = BertForSequenceClassification.from_pretrained(testing.minilm_path(), num_labels=1).eval()
    encode = lambda: ce_tok([query] * n_passages, passages, truncation=True, max_length=tokens,
                            padding=True, return_tensors="pt")

    def run_ce() -> list[float]:
        with torch.inference_mode():
            return ce(**encode()).logits[:, 0].tolist()

    tmp = Path(tempfile.mkdtemp(prefix="bench_fid_"))
    scorers = {name: FiDAttentionScorer(model=build_t5(tmp / name, cfg), max_length=tokens, batch_size=n_passages,
                                        device="cpu") for name, cfg in T5_CONFIGS.items()}
    fid_lengths = scorers["t5-small-sized"].build_inputs(query, passages).lengths
    runs = {"cross_encoder_minilm": run_ce,
            **{name: (lambda s=s: s.score(query, passages)) for name, s in scorers.items()}}
    times = interleaved_seconds(runs, repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    params = {name: sum(p.numel() for p in s.model.parameters()) for name, s in scorers.items()}
    params["cross_encoder_minilm"] = sum(p.numel() for p in ce.parameters())
    return {"passages": n_passages, "repeats": repeats, "threads": torch.get_num_threads(), "parameters": params,
            "fid_tokens_per_input": {"mean": statistics.mean(fid_lengths), "min": min(fid_lengths), "max": max(fid_lengths)},
            "cross_encoder_tokens_per_pair": float(encode()["attention_mask"].sum(1).float().mean()),
            "seconds_median": med, "seconds_all": times, "passages_per_second": {k: n_passages / v for k, v in med.items()},
            "cross_encoder_speedup_over": {k: med[k] / med["cross_encoder_minilm"] for k in scorers},
            "fid_tokenizer": "byte-level BPE (funnel_core.testing.build_bpe_tokenizer, 2000 types) "
                             "over real SQuAD passages, truncated to the token budget; model vocab 32128"}


# -- 2. quality ----------------------------------------------------------------------------
def bench_quality(units: list[Unit], questions: list, n_questions: int, depth: int, seed: int,
                  budget_s: float, progress_path: Path | None, resume: bool = False) -> dict:
    from tqdm.auto import tqdm

    from funnel_core.rerank.attention_lm import AttentionLMScorer

    index = BM25Index().index(units)
    sample = random.Random(seed).sample(questions, n_questions)
    scorer = AttentionLMScorer(model=testing.smollm2_path(), gguf_file=testing.SMOLLM2_GGUF,
                               device="cpu")
    t_load = time.perf_counter()
    scorer.model  # load once, outside the timed loop
    load_s = time.perf_counter() - t_load
    resumed = resume and progress_path is not None and progress_path.exists()
    rows = json.loads(progress_path.read_text()) if resumed else []  # same seed -> same sample, same order
    done = {r["id"] for r in rows}
    start = time.perf_counter()
    for q in tqdm(sample, desc="SmolLM2 attention rerank"):
        if q.id in done:
            continue
        if time.perf_counter() - start > budget_s:
            break
        hits = index.search(q.question, depth)
        texts = [h.text for h in hits]
        t0 = time.perf_counter()
        raw, cal = scorer.score_components(q.question, texts)
        secs = time.perf_counter() - t0
        calibrated = [r - c for r, c in zip(raw, cal)]
        best = lambda s: max(range(len(s)), key=s.__getitem__) if s else None
        row = {"id": q.id, "n": len(texts), "seconds": secs,
               "bm25@1": bool(hits) and has_answer(texts[0], q.answers),
               f"bm25@{depth}": has_answer(" ".join(texts), q.answers),
               "attention_calibrated@1": bool(hits) and has_answer(texts[best(calibrated)], q.answers),
               "attention_raw@1": bool(hits) and has_answer(texts[best(raw)], q.answers)}
        rows.append(row)
        if progress_path is not None:
            progress_path.write_text(json.dumps(rows))
    n = len(rows)
    keys = ["bm25@1", "attention_calibrated@1", "attention_raw@1", f"bm25@{depth}"]
    recall = {k: sum(r[k] for r in rows) / max(n, 1) for k in keys}
    cal, bm = ([float(r[k]) for r in rows] for k in ("attention_calibrated@1", "bm25@1"))
    mc = mcnemar_exact(cal, bm)   # wins: calibrated right and BM25 wrong; losses: the reverse
    return {
        "questions_planned": n_questions, "questions_done": n, "seed": seed, "depth": depth, "answer_recall": recall,
        "corpus_passages": len(units), "model": "SmolLM2-135M-Instruct Q4_1 GGUF (dequantised, fp32, CPU)",
        "calibrated_vs_bm25": {"wins": mc["a_only"], "losses": mc["b_only"], "mcnemar_p": mc["p_value"],
                               "diff": recall["attention_calibrated@1"] - recall["bm25@1"],
                               "bootstrap95": paired_bootstrap(cal, bm)["ci"] if n else None},
        "seconds_per_question_median": statistics.median(r["seconds"] for r in rows) if rows else None,
        "model_load_seconds": load_s, "per_question": rows}


def main() -> None:
    ap = parser(__doc__.split("\n\n")[0])  # --data, --quick (fewer repeats and questions), --out
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=3600.0, help="seconds for the quality loop; then it reports what it did")
    ap.add_argument("--resume", action="store_true", help="continue the quality loop from its progress file (same seed)")
    ap.add_argument("--passages", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=130)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-quality", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.questions, args.repeats = min(args.questions, 20), min(args.repeats, 2)

    units, questions = squad_passages(Path(args.data) / "squad" / "squad-v1.1-dev-a.json")
    out_path = args.out or RESULTS / "fid.json"
    command = "nice -n 10 python " + " ".join(["benchmarks/bench_fid.py", *sys.argv[1:]])

    def save(section: str, data: dict) -> None:
        # re-read before writing: the speed and quality parts may run as separate processes
        result = json.loads(out_path.read_text()) if out_path.exists() else {}
        result[section] = data
        result.setdefault("hardware", {})[section] = machine()  # CPU flags, precisions run in, load average
        result.setdefault("commands", {})[section] = command
        save_json(out_path, result, indent=2)

    if not args.skip_speed:
        speed = bench_speed(units, questions, args.passages, args.tokens, args.repeats)
        save("speed", speed)
        print(json.dumps({k: v for k, v in speed.items() if k != "seconds_all"}, indent=2))
    if not args.skip_quality:
        progress = out_path.with_suffix(".progress.json")
        quality = bench_quality(units, questions, args.questions, args.depth, args.seed,
                                args.budget, progress, resume=args.resume)
        save("quality", quality)
        progress.unlink(missing_ok=True)
        print(json.dumps({k: v for k, v in quality.items() if k != "per_question"}, indent=2))


if __name__ == "__main__":
    main()
