"""Data for the FiD reader / FiD post-ranker / L2G experiment (issue 22, issue 16 item 5).

    nice -n 10 python benchmarks/fid_l2g_data.py --out .m22_gpu/data.json.gz

Builds the large SQuAD corpus (``squad_large_data.build_corpus``: train + dev-a articles, ~23k
100-word passages, ~1K-token documents), one BM25 index over the passages and one over the
documents, and writes ONE compact gzipped JSON (passage texts once, everything else as indices) so
the training / scoring can run where bm25s and this package's other dependencies are missing
(``benchmarks/fid_l2g_gpu.py`` on a GPU machine). Seeded samples, disjoint:

* ``fid_train``  : SQuAD train questions (never the 400 tuning questions of ``squad_ce_model``):
  the gold passage (overlaps the question's paragraph and contains a gold answer) plus BM25 hard
  negatives (top passages without an answer), ``n_passages`` in all, gold at a random position;
* ``l2g_train``  : other train questions with their BM25 top-``n_passages`` passages as retrieved
  (the FiD teacher scores them; no gold forced in) and the parent document of each;
* ``dev``        : dev-a questions with (a) their BM25 top-``n_passages`` passages (the candidates
  both post-rankers rerank) and (b) their BM25 top-``doc_depth`` documents with each document's
  passages (the pre-ranker's candidates; a document's MaxP score is the max over its passages).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import time
from pathlib import Path

from common import ROOT

DATA = ROOT.parent / "shared" / "data" / "squad"
FILES = [DATA / "squad-v1.1-train.json", DATA / "squad-v1.1-dev-a.json"]


def build(n_fid_train: int, n_l2g_train: int, n_dev: int, n_passages: int, doc_depth: int,
          seed: int = 0) -> dict:
    from squad_ce_model import tuning_question_ids
    from squad_large_data import build_corpus

    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation.metrics import has_answer
    from funnel_core.testing import offline_env

    offline_env()
    t0 = time.perf_counter()
    corpus = build_corpus(FILES)
    passages = corpus.passages
    pidx = {u.id: i for i, u in enumerate(passages)}
    didx = {u.id: i for i, u in enumerate(corpus.documents)}
    doc_of_passage = [0] * len(passages)
    for d, ps in enumerate(corpus.passages_of_doc):
        for p in ps:
            doc_of_passage[p] = d
    pindex = BM25Index().index(passages)
    dindex = BM25Index().index(corpus.documents)
    print(f"corpus: {len(corpus.documents)} documents, {len(passages)} passages "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)

    rng = random.Random(seed)
    train_q = corpus.questions["train"]
    held = tuning_question_ids(train_q)
    pool = [q for q in train_q if q.id not in held]
    rng.shuffle(pool)
    fid_pool, l2g_q = pool[:n_fid_train * 2], pool[n_fid_train * 2:n_fid_train * 2 + n_l2g_train]
    dev_q = rng.sample(corpus.questions["dev-a"], min(n_dev, len(corpus.questions["dev-a"])))

    def top_passages(qs, k):
        return [[pidx[u.id] for u in r] for r in pindex.search_many([q.question for q in qs], k=k)]

    fid_train = []
    hits = top_passages(fid_pool, 3 * n_passages)
    for q, ranked in zip(fid_pool, hits):
        if len(fid_train) >= n_fid_train:
            break
        gold = corpus.gold_passages(q)
        neg = [i for i in ranked if not has_answer(passages[i].text, q.answers)][:n_passages - 1]
        if not gold or len(neg) < n_passages - 1:
            continue
        ps = neg[:]
        ps.insert(rng.randrange(len(ps) + 1), gold[0])
        fid_train.append({"q": q.question, "a": q.answers, "p": ps, "gold": gold[0]})

    l2g_train = []
    for q, ranked in zip(l2g_q, top_passages(l2g_q, n_passages)):
        l2g_train.append({"q": q.question, "a": q.answers, "p": ranked, "id": q.id})

    dev = []
    dev_docs = dindex.search_many([q.question for q in dev_q], k=doc_depth)
    for q, ranked, docs in zip(dev_q, top_passages(dev_q, n_passages), dev_docs):
        dev.append({"q": q.question, "a": q.answers, "p": ranked, "id": q.id,
                    "docs": [didx[u.id] for u in docs]})
    print(f"fid_train {len(fid_train)}, l2g_train {len(l2g_train)}, dev {len(dev)} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return {"passages": [u.text for u in passages],
            "titles": [u.metadata.get("title") for u in passages],
            "doc_of_passage": doc_of_passage,
            "passages_of_doc": corpus.passages_of_doc,
            "fid_train": fid_train, "l2g_train": l2g_train, "dev": dev,
            "meta": {"n_passages": n_passages, "doc_depth": doc_depth, "seed": seed,
                     "files": [str(f.name) for f in FILES],
                     "documents": len(corpus.documents), "passage_count": len(passages),
                     "excluded": "the 400 tuning questions (seed 0) of squad_ce_model / bench_squad_large"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".m22_gpu" / "data.json.gz")
    ap.add_argument("--fid-train", type=int, default=30000)
    ap.add_argument("--l2g-train", type=int, default=3000)
    ap.add_argument("--dev", type=int, default=1000)
    ap.add_argument("--n-passages", type=int, default=10)
    ap.add_argument("--doc-depth", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    data = build(args.fid_train, args.l2g_train, args.dev, args.n_passages, args.doc_depth, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.out, "wt", encoding="utf-8") as f:
        json.dump(data, f)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
