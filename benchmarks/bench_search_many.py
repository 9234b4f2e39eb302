"""Batched BM25 search against one query at a time: ``BM25Index.search_many(queries, k)`` over
``[index.search(q, k) for q in queries]`` (both keep every result, so both build the same hits),
at k=10 and k=100, on corpora of 40,000 and 100,000 documents, with 4- and 8-word queries.

    python benchmarks/bench_search_many.py --data ../shared/data            # full run
    python benchmarks/bench_search_many.py --data ../shared/data --quick    # smoke run (tiny)

Corpus: SQuAD v1.1 train paragraphs, each copy perturbed (a seeded 85% subset of its words, in
order), or seeded Zipf text over a 50,000-word vocabulary where the SQuAD file is absent;
queries: SQuAD questions cut to their first 4 or 8 words (Zipf words otherwise). The two ways run
interleaved (each round times one then the other, the order alternating), after a warm-up that
also compiles the numba kernels; the JSON has every round's seconds, the median per-query
milliseconds and the ratio batched / one-by-one (below 1: the batch pays), with the load
average before and after each setting. Writes benchmarks/results/search_many.json.
"""

from __future__ import annotations

import json
import random
import statistics
import time

import numpy as np
from common import load_average, parser, write_json

from funnel_core.bm25 import BM25Index
from funnel_core.units import Unit


def squad(data) -> tuple[list[str], list[str]] | None:
    path = data / "squad" / "squad-v1.1-train.json"
    if not path.exists():
        return None
    paragraphs, questions = [], []
    for article in json.loads(path.read_text(encoding="utf-8"))["data"]:
        for p in article["paragraphs"]:
            paragraphs.append(p["context"])
            questions.extend(qa["question"] for qa in p["qas"])
    return paragraphs, questions


def zipf_words(rng: np.random.Generator, n: int, vocab: int = 50_000) -> list[str]:
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    return [f"t{i}" for i in rng.choice(vocab, size=n, p=p / p.sum())]


def corpus(n_docs: int, source, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    if source is None:
        return [" ".join(zipf_words(rng, int(rng.integers(40, 160)))) for _ in range(n_docs)]
    paragraphs = source[0]
    out = []
    for i in range(n_docs):
        words = paragraphs[i % len(paragraphs)].split()
        if i >= len(paragraphs):  # a later copy: a seeded subset of the words, in order
            keep = rng.random(len(words)) < 0.85
            words = [w for w, kept in zip(words, keep) if kept]
        out.append(" ".join(words))
    return out


def queries(n: int, words: int, source, seed: int) -> list[str]:
    rng = random.Random(seed)
    if source is None:
        nrng = np.random.default_rng(seed)
        return [" ".join(zipf_words(nrng, words)) for _ in range(n)]
    long_enough = [q.split() for q in source[1] if len(q.split()) >= words]
    return [" ".join(q[:words]) for q in rng.sample(long_enough, n)]


def compare(index: BM25Index, qs: list[str], k: int, rounds: int) -> dict:
    def one_by_one():
        return [index.search(q, k=k) for q in qs]

    def batched():
        return index.search_many(qs, k=k)

    assert [[u.id for u in r] for r in one_by_one()] == [[u.id for u in r] for r in batched()]
    seconds: dict[str, list[float]] = {"one_by_one": [], "batched": []}
    before = load_average(2)
    for r in range(rounds):
        order = [("one_by_one", one_by_one), ("batched", batched)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            out = fn()
            seconds[name].append(time.perf_counter() - t0)
            del out
    med = {name: statistics.median(s) for name, s in seconds.items()}
    return {"k": k, "n_queries": len(qs), "rounds": rounds,
            "median_ms_per_query": {n: 1000 * s / len(qs) for n, s in med.items()},
            "ratio_batched_over_one_by_one": med["batched"] / med["one_by_one"],
            "round_ratios": [b / o for b, o in zip(seconds["batched"], seconds["one_by_one"])],
            "round_seconds": seconds, "load_average_before": before, "load_average_after": load_average(2)}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[40_000, 100_000])
    p.add_argument("--ks", type=int, nargs="+", default=[10, 100])
    p.add_argument("--words", type=int, nargs="+", default=[4, 8])
    p.add_argument("--n-queries", type=int, default=500)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--engines", nargs="+", default=["auto"], choices=["auto", "numpy", "numba"])
    args = p.parse_args()
    if args.quick:
        args.sizes, args.n_queries, args.rounds = [2_000], 40, 3
    source = squad(args.data)
    results = []
    for n_docs in args.sizes:
        texts = corpus(n_docs, source, seed=n_docs)
        units = [Unit(id=f"d{i}", text=t) for i, t in enumerate(texts)]
        for engine in args.engines:
            index = BM25Index(engine=engine).index(units)
            for words in args.words:
                qs = queries(args.n_queries, words, source, seed=words)
                index.search_many(qs[:4], k=max(args.ks))  # warm-up (numba compiles here)
                for k in args.ks:
                    row = {"n_documents": n_docs, "engine": engine, "query_words": words,
                           **compare(index, qs, k, args.rounds)}
                    print(f"{n_docs} docs {engine} {words} words k={k}: "
                          f"ratio {row['ratio_batched_over_one_by_one']:.3f} "
                          f"(load {row['load_average_before']})", flush=True)
                    results.append(row)
    write_json("search_many", {
        "corpus": "SQuAD v1.1 train paragraphs, perturbed copies" if source else "seeded Zipf text",
        "queries": "SQuAD questions cut to the first N words" if source else "seeded Zipf words",
        "quick": args.quick, "results": results,
        "notes": "ratio < 1: search_many is faster per query than search() called in a loop; "
                 "both keep every result; rounds interleaved, order alternating."},
        out=args.out)


if __name__ == "__main__":
    main()
