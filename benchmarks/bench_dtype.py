"""Do bf16 scores rank like fp32 scores, and how fast is each, on real models?

    nice -n 10 python benchmarks/bench_dtype.py [--questions 8] [--candidates 8]

Seeded SQuAD *train* questions, each with its gold paragraph and other paragraphs of its article,
scored by ``SentenceEmbedder``, ``AttentionLMScorer`` and ``RankRAGScorer`` once in each precision on
the CPU, both loaded side by side and timed alternately on the same question. Per question: Spearman
correlation, top-1 agreement, the largest score difference relative to the fp32 range, distinct
scores; seconds with the load average and CPU facts (docs/performance.md).
Writes benchmarks/results/dtype_agreement.json.
"""

from __future__ import annotations

import random
import time
import warnings

import numpy as np
from common import RESULTS, parser, write_json

from funnel_core import hardware
from funnel_core.evaluation.datasets import load_squad


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def samples(path, n_questions: int, n_candidates: int, seed: int):
    articles = [a for a in load_squad(path) if len(a.paragraphs) >= n_candidates]
    rng = random.Random(seed)
    out = []
    for art in rng.sample(articles, n_questions):
        q = rng.choice(art.questions)
        others = [i for i in range(len(art.paragraphs)) if i != q.paragraph_index]
        cand = [q.paragraph_index] + rng.sample(others, n_candidates - 1)
        rng.shuffle(cand)
        out.append({"id": q.id, "question": q.question,
                    "texts": [art.paragraphs[i] for i in cand],
                    "gold": cand.index(q.paragraph_index)})
    return out


def stages(max_words: int):
    from funnel_core.embeddings import SentenceEmbedder
    from funnel_core.rerank.attention_lm import AttentionLMScorer
    from funnel_core.rerank.rankrag import RANKRAG_PROMPTS, RankRAGScorer
    from funnel_core.testing import SMOLLM2_GGUF, smollm2_path

    def embed(dtype):
        e = SentenceEmbedder(device="cpu", cache=False, dtype=dtype)

        def score(q, texts):
            emb = e.encode([q, *texts])
            return [float(x) for x in emb[1:] @ emb[0]]
        return e, score

    def attention(dtype):
        s = AttentionLMScorer(model=smollm2_path(), gguf_file=SMOLLM2_GGUF, device="cpu",
                              max_passage_tokens=max_words, dtype=dtype)
        return s, s.score

    def rankrag(dtype):
        s = RankRAGScorer(llm=smollm2_path(), gguf_file=SMOLLM2_GGUF, device="cpu",
                          prompt=RANKRAG_PROMPTS["smollm2"], mode="logprobs",
                          max_passage_words=max_words, dtype=dtype)
        return s, s.score

    return {"sentence_embedder(all-MiniLM-L6-v2)": embed,
            "attention_lm(SmolLM2-135M-Instruct)": attention,
            "rankrag_logprobs(SmolLM2-135M-Instruct)": rankrag}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--max-words", type=int, default=120, help="passage cut for the LLM stages")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=None, help="run the stages whose name contains this")
    args = p.parse_args()
    if args.quick:
        args.questions, args.candidates = 2, 4
    data = samples(args.data / "squad" / "squad-v1.1-train.json", args.questions,
                   args.candidates, args.seed)
    results = {}
    for name, make in stages(args.max_words).items():
        if args.only and args.only not in name:
            continue
        scores: dict[str, list] = {"float32": [], "bfloat16": []}
        seconds: dict[str, list] = {"float32": [], "bfloat16": []}
        active: dict[str, object] = {}
        loaded = {}
        for dtype in ("float32", "bfloat16"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                stage, score = make(dtype)
                score(data[0]["question"], data[0]["texts"][:2])            # load + warm up
            loaded[dtype] = (stage, score)
            active[dtype] = stage.active_dtype
            active[dtype + "_warnings"] = sorted({str(w.message)[:120] for w in caught
                                                  if issubclass(w.category, RuntimeWarning)})
        for i, s in enumerate(data):          # interleaved, alternating which precision goes first
            for dtype in (("float32", "bfloat16") if i % 2 == 0 else ("bfloat16", "float32")):
                score = loaded[dtype][1]
                t0 = time.perf_counter()
                scores[dtype].append(score(s["question"], s["texts"]))
                seconds[dtype].append(time.perf_counter() - t0)
        for dtype in loaded:
            print(f"{name} {dtype}: {np.median(seconds[dtype]):.3f} s/question (median)", flush=True)
        del loaded
        per_q = []
        for s, a, b in zip(data, scores["float32"], scores["bfloat16"]):
            span = float(np.ptp(a)) or 1.0
            per_q.append({"id": s["id"], "spearman": spearman(a, b),
                          "top1_agrees": int(np.argmax(a)) == int(np.argmax(b)),
                          "gold_top1_fp32": int(np.argmax(a)) == s["gold"],
                          "gold_top1_bf16": int(np.argmax(b)) == s["gold"],
                          "max_abs_diff_over_range": float(np.max(np.abs(np.subtract(a, b)))) / span,
                          "distinct_fp32": len(set(a)), "distinct_bf16": len(set(b)),
                          "fp32": a, "bf16": b})
        results[name] = {
            "active_dtype": active,
            "spearman_min": min(q["spearman"] for q in per_q),
            "spearman_mean": float(np.mean([q["spearman"] for q in per_q])),
            "top1_agreement": float(np.mean([q["top1_agrees"] for q in per_q])),
            "gold_top1_fp32": float(np.mean([q["gold_top1_fp32"] for q in per_q])),
            "gold_top1_bf16": float(np.mean([q["gold_top1_bf16"] for q in per_q])),
            "max_abs_diff_over_range": max(q["max_abs_diff_over_range"] for q in per_q),
            "seconds_per_question_mean": {k: float(np.mean(v)) for k, v in seconds.items()},
            "seconds_per_question_median": {k: float(np.median(v)) for k, v in seconds.items()},
            "per_question": per_q,
        }
        print(f"{name}: spearman min {results[name]['spearman_min']:.4f}, top-1 agreement "
              f"{results[name]['top1_agreement']:.2f}", flush=True)
    write_json("dtype_agreement", {
        "args": {k: (str(v) if k == "data" else v) for k, v in vars(args).items() if k != "out"},
        "split": "squad-v1.1-train (seeded sample; candidates: gold paragraph + others of its article)",
        "n_questions": len(data), "n_candidates": args.candidates,
        "hardware": hardware.describe(), "stages": results,
    }, args.out or RESULTS / "dtype_agreement.json")


if __name__ == "__main__":
    main()
