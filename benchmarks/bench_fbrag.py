"""FB-RAG forward lookup with SmolLM2-135M-Instruct on SQuAD as a long-context task.

Context = a whole Wikipedia article (all its paragraphs), cut into 300-word chunks. Stage I
keeps the 20 BM25 chunks; Stage II SmolLM2 samples K = 5 "Rationale: ... Answer: ..." outputs
(top-p 0.9, top-k 50) and every chunk is scored; 3 chunks are kept. Compared at the same budget
(3 chunks), with the same samples: Ours-F (eta 0/1), Ours-FB (0.5/0.5) and backward-only BM25
with the question. Reports answer recall of the kept chunks and seconds per query per stage.

    python benchmarks/bench_fbrag.py --data /work/shared/data [--quick] [--questions 30]
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

from common import RESULTS, parser, save_json  # repo on sys.path, offline environment
from tqdm import tqdm  # noqa: E402

from funnel_core.evaluation import has_answer, load_squad  # noqa: E402
from funnel_core.fbrag import ForwardLookup, chunk_context  # noqa: E402
from funnel_core.hardware import describe  # noqa: E402
from funnel_core.llm import TransformersLLM  # noqa: E402
from funnel_core.testing import SMOLLM2_GGUF, smollm2_path  # noqa: E402


def main() -> None:
    ap = parser(__doc__.splitlines()[0])  # --data, --quick (3 questions), --out
    ap.add_argument("--questions", type=int, default=30, help="seed-0 sample of questions")
    ap.add_argument("--chunk-words", type=int, default=300)
    ap.add_argument("--recall-k", type=int, default=20)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--reader-words", type=int, default=900,
                    help="words of the Stage I chunks SmolLM2 reads (best first); 0 = all 20 chunks")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.quick:
        args.questions = 3
    import torch

    torch.set_num_threads(args.threads)

    articles = load_squad(Path(args.data) / "squad" / "squad-v1.1-dev-a.json")
    contexts = {a.title: "\n\n".join(a.paragraphs) for a in articles}
    questions = [q for a in articles for q in a.questions]
    picked = random.Random(0).sample(questions, args.questions)
    chunks = {t: chunk_context(c, args.chunk_words, id_prefix=t) for t, c in contexts.items()}

    llm = TransformersLLM(smollm2_path(), gguf_file=SMOLLM2_GGUF, max_length=4096, seed=0)
    t0 = time.perf_counter()
    llm.tokenizer
    load_s = time.perf_counter() - t0
    common = dict(llm=llm, samples=args.samples, top_p=0.9, top_k=50, temperature=1.0,
                  max_new_tokens=args.max_new_tokens, recall_k=args.recall_k, k=args.keep,
                  reader_words=args.reader_words or None, chunk_words=args.chunk_words)
    variants = {"ours_f": ForwardLookup.preset("F", **common),
                "ours_fb": ForwardLookup.preset("FB", **common),
                "backward_only_bm25": ForwardLookup.preset("B", **common)}
    hits = {v: [] for v in variants}
    stage1_hits, reader_hits, sample_answer_hits, words_kept = [], [], [], {v: [] for v in variants}
    secs = {"stage1": [], "stage2_sampling": [], "stage2_scoring_and_selection": []}
    examples = []
    for qi, q in enumerate(tqdm(picked, desc="fb-rag")):
        units = chunks[q.article]
        res = variants["ours_f"].search(q.question, units)
        for key in secs:
            secs[key].append(res.seconds[key])
        for name, fb in variants.items():
            kept = res.units if name == "ours_f" else fb.search(q.question, units, samples=res.samples).units
            hits[name].append(has_answer(" ".join(u.text for u in kept), q.answers))
            words_kept[name].append(sum(len(u.text.split()) for u in kept))
        stage1_hits.append(has_answer(" ".join(u.text for u in res.stage1), q.answers))
        reader = variants["ours_f"].reader_context(res.stage1)
        reader_hits.append(has_answer(reader, q.answers))
        sample_answer_hits.append(any(has_answer(s.answer, q.answers) for s in res.samples))
        if qi < 3:
            examples.append({"question": q.question, "answers": q.answers,
                             "samples": [s.to_dict() for s in res.samples]})

        def mean(xs):
            return round(statistics.fmean(xs), 4) if xs else None

        result = {
            "benchmark": "FB-RAG forward lookup on SQuAD v1.1 dev-a, whole article as the long context",
            "command": " ".join(["python"] + sys.argv),
            "setup": {"questions": qi + 1, "questions_planned": len(picked), "question_sample": "random.Random(0).sample over all 4,961 questions",
                      "chunk_words": args.chunk_words, "stage1_recall_k": args.recall_k,
                      "kept_chunks": args.keep, "samples_K": args.samples, "top_p": 0.9, "top_k": 50,
                      "temperature": 1.0, "max_new_tokens": args.max_new_tokens,
                      "reader_words": args.reader_words or "all stage-I chunks",
                      "llm": "SmolLM2-135M-Instruct Q4_1 GGUF (dequantised fp32), CPU",
                      "torch_threads": args.threads, "model_load_s": round(load_s, 1),
                      "chunks_per_article_mean": round(statistics.fmean(len(c) for c in chunks.values()), 1),
                      "normalize": True,
                      "machine": "2 shared CPU cores (other jobs running): timings are noisy"},
            "answer_recall_at_kept": {v: mean([float(h) for h in hits[v]]) for v in variants},
            "mean_words_kept": {v: mean(words_kept[v]) for v in variants},
            "answer_recall_stage1_20_chunks": mean([float(h) for h in stage1_hits]),
            "answer_in_reader_context": mean([float(h) for h in reader_hits]),
            "any_sampled_answer_correct": mean([float(h) for h in sample_answer_hits]),
            "seconds_per_query": {k: mean(v) for k, v in secs.items()},
            "examples": examples,
            "hardware": describe(),  # CPU flags and the precisions the models ran in
        }
        save_json(args.out or RESULTS / "bench_fbrag.json", result, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=2))


if __name__ == "__main__":
    main()
