"""RankRAG reranking with SmolLM2-135M-Instruct on SciFact test (BM25 top-20 reranked).

Reports nDCG@10 of BM25 and of BM25 + RankRAG on the same queries, and the throughput (pairs/s)
of the batched one-forward-pass P(True) path against the generate-and-parse path, measured in
the same process on the same pairs, interleaved query by query.

    python benchmarks/bench_rankrag.py --data /work/shared/data [--quick] [--queries 25]
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from common import RESULTS, parser, save_json  # repo on sys.path, offline environment
from tqdm import tqdm  # noqa: E402

from funnel_core.bm25 import BM25Index  # noqa: E402
from funnel_core.evaluation import ir_metrics, load_beir, run_from_units  # noqa: E402
from funnel_core.hardware import describe  # noqa: E402
from funnel_core.llm import TransformersLLM  # noqa: E402
from funnel_core.rerank.rankrag import RankRAGScorer  # noqa: E402
from funnel_core.testing import SMOLLM2_GGUF, smollm2_path  # noqa: E402


def main() -> None:
    ap = parser(__doc__.splitlines()[0])  # --data, --quick (5 queries, 2 for the generate path), --out
    ap.add_argument("--queries", type=int, default=25, help="test queries reranked (seed-0 sample; 0 = all 300)")
    ap.add_argument("--generate-queries", type=int, default=3, help="queries also scored by generate-and-parse")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--max-passage-words", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on the shared 2-core machine)")
    args = ap.parse_args()
    if args.quick:
        args.queries, args.generate_queries = 5, 2
    import torch

    torch.set_num_threads(args.threads)

    ds = load_beir(Path(args.data) / "scifact", split="test")
    queries = ds.split_queries()
    index = BM25Index().index(ds.corpus)
    bm25_all = {qid: index.search(q, k=args.depth) for qid, q in queries.items()}
    bm25_full = ir_metrics(ds.qrels, run_from_units(bm25_all), ["ndcg@10", f"recall@{args.depth}"])

    qids = sorted(queries)
    if args.queries and args.queries < len(qids):
        qids = sorted(random.Random(0).sample(qids, args.queries))
    gen_qids = set(qids[: args.generate_queries])
    qrels_sub = {q: ds.qrels[q] for q in qids}

    llm = TransformersLLM(smollm2_path(), gguf_file=SMOLLM2_GGUF, batch_size=args.batch_size,
                          max_length=1024)
    t0 = time.perf_counter()
    llm.tokenizer  # load once, outside the timings
    load_s = time.perf_counter() - t0
    fast = RankRAGScorer(llm=llm, mode="logprobs", batch_size=args.batch_size,
                         max_passage_words=args.max_passage_words)
    slow = RankRAGScorer(llm=llm, mode="generate", batch_size=args.batch_size,
                         max_passage_words=args.max_passage_words, max_new_tokens=4)

    reranked, gen_reranked = {}, {}
    fast_s = fast_pairs = slow_s = slow_pairs = 0
    fast_s_on_gen = 0.0
    agree = total = 0
    for qid in tqdm(qids, desc="rankrag"):
        units = bm25_all[qid]
        t = time.perf_counter()
        reranked[qid] = fast(queries[qid], units)
        dt = time.perf_counter() - t
        fast_s += dt
        fast_pairs += len(units)
        if qid in gen_qids:
            fast_s_on_gen += dt
            t = time.perf_counter()
            gen_reranked[qid] = slow(queries[qid], units)
            slow_s += time.perf_counter() - t
            slow_pairs += len(units)
            p_fast = {u.id: u.score for u in reranked[qid]}
            for u in gen_reranked[qid]:
                if u.score != 0.5:
                    total += 1
                    agree += (u.score > 0.5) == (p_fast[u.id] > 0.5)

        done = list(reranked)
        qrels_sub = {q: ds.qrels[q] for q in done}
        sub_bm25 = ir_metrics(qrels_sub, run_from_units({q: bm25_all[q] for q in done}), ["ndcg@10"])
        sub_rr = ir_metrics(qrels_sub, run_from_units(reranked), ["ndcg@10"])
        gen_q = sorted(q for q in gen_qids if q in gen_reranked)
        if not gen_q:
            continue
        qrels_gen = {q: ds.qrels[q] for q in gen_q}
        gen_bm25 = ir_metrics(qrels_gen, run_from_units({q: bm25_all[q] for q in gen_q}), ["ndcg@10"])
        gen_fast = ir_metrics(qrels_gen, run_from_units({q: reranked[q] for q in gen_q}), ["ndcg@10"])
        gen_slow = ir_metrics(qrels_gen, run_from_units(gen_reranked), ["ndcg@10"])
        fast_pps = fast_pairs / fast_s
        fast_pps_gen = len(gen_q) * args.depth / fast_s_on_gen if fast_s_on_gen else None
        slow_pps = slow_pairs / slow_s if slow_s else None
        result = {
            "benchmark": "RankRAG (SmolLM2-135M-Instruct Q4_1 GGUF, dequantised fp32, CPU) on SciFact test",
            "command": " ".join(["python"] + sys.argv),
            "setup": {"depth": args.depth, "queries": len(done), "queries_planned": len(qids), "query_sample": "random.Random(0).sample of test qids" if args.queries else "all",
                      "generate_path_queries": len(gen_q), "batch_size": args.batch_size,
                      "max_passage_words": args.max_passage_words, "prompt": fast.prompt,
                      "generate_max_new_tokens": 4, "torch_threads": args.threads, "model_load_s": round(load_s, 1),
                      "machine": "2 shared CPU cores (other jobs running): timings are noisy"},
            "bm25_all_300": {k: round(v, 4) for k, v in bm25_full.items()},
            "subset": {"bm25_ndcg@10": round(sub_bm25["ndcg@10"], 4),
                       "rankrag_ndcg@10": round(sub_rr["ndcg@10"], 4)},
            "generate_subset": {"bm25_ndcg@10": round(gen_bm25["ndcg@10"], 4),
                                "rankrag_logprobs_ndcg@10": round(gen_fast["ndcg@10"], 4),
                                "rankrag_generate_ndcg@10": round(gen_slow["ndcg@10"], 4),
                                "unparsed_replies": slow.unparsed,
                                "judgement_agreement": round(agree / total, 4) if total else None,
                                "parsed_pairs": total},
            "throughput": {"logprobs_pairs_per_s_all": round(fast_pps, 3),
                           "logprobs_pairs_per_s_on_generate_queries": round(fast_pps_gen, 3) if fast_pps_gen else None,
                           "generate_pairs_per_s": round(slow_pps, 3) if slow_pps else None,
                           "speedup_logprobs_over_generate": round(fast_pps_gen / slow_pps, 2) if slow_pps else None},
            "hardware": describe(),  # CPU flags and the precisions the models ran in
        }
        save_json(args.out or RESULTS / "bench_rankrag.json", result, indent=2)

    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
