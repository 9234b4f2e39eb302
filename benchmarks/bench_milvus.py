"""The funnel's indexes on Milvus Lite (embedded) against the in-memory bm25s / numpy backends: parity and speed.

    python benchmarks/bench_milvus.py --data ../shared/data            # full run
    python benchmarks/bench_milvus.py --data ../shared/data --quick    # smoke run
    python benchmarks/bench_milvus.py --parts dense                    # one part, others kept

Writes benchmarks/results/milvus.json (its tables: docs/scaling_out.md). Parts: ``scifact`` (flat and
clustered BM25 on SciFact test), ``synthetic`` (100k synthetic documents), ``dense`` (MiniLM, HNSW on Milvus
vs exact numpy), ``frameworks`` (the LlamaIndex and LangChain BM25 retrievers with ``backend=MilvusBackend(...)``,
persisting and re-opening included). Milvus Lite is pure Python: its speed says nothing about a Milvus server.
"""

from __future__ import annotations

import json
import os
import tempfile
from functools import partial
from importlib.metadata import version
from pathlib import Path

import numpy as np
from common import RESULTS, cached_embeddings, load_average, parser, qps, synthetic_search, timed, timer, write_json

from funnel_core.backends.milvus import MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex
from funnel_core.bm25 import BM25Index
from funnel_core.evaluation import ir_metrics, load_beir, run_from_units
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.units import Unit


def overlap(a: list[list], b: list[list], scores: bool = False) -> dict:
    """Top-10 agreement of two engines' results (Units or ids) per query; ``scores``: the largest score gap."""
    ids = lambda res: [[u if isinstance(u, str) else u.id for u in x[:10]] for x in res]
    pairs = list(zip(ids(a), ids(b)))
    ov = [len(set(x) & set(y)) / max(len(x), len(y)) if x or y else 1.0 for x, y in pairs]
    out = {"mean_top10_overlap": float(np.mean(ov)), "identical_top10_share": sum(x == y for x, y in pairs) / len(a),
           "min_top10_overlap": float(np.min(ov))}
    if scores:
        b_scores = [{u.id: u.score for u in y} for y in b]
        out["max_relative_score_difference"] = max([abs(u.score - s[u.id]) / max(abs(s[u.id]), 1e-9)
                                                    for x, s in zip(a, b_scores) for u in x if u.id in s], default=0.0)
    return out


def metrics(qids: list[str], qrels: dict, results: list[list[Unit]], names=("ndcg@10", "recall@100")) -> dict:
    return ir_metrics(qrels, run_from_units(dict(zip(qids, results))), list(names))


def part_scifact(ds, db: str, args, qids: list[str], qs: list[str], qrels: dict) -> dict:
    out: dict = {"n_documents": len(ds.corpus), "n_queries": len(qs)}
    flat = {"bm25s": timed(out, "bm25s_build_seconds", lambda: BM25Index().index(ds.corpus)),
            "milvus": timed(out, "milvus_build_seconds", lambda: MilvusBM25Index(db, "scifact_bm25").index(ds.corpus))}
    res = {name: index.search_many(qs, k=100) for name, index in flat.items()}
    out.update({name: metrics(qids, qrels, r) for name, r in res.items()})
    out["ndcg10_difference"] = out["milvus"]["ndcg@10"] - out["bm25s"]["ndcg@10"]
    out["flat"] = overlap(res["milvus"], res["bm25s"], scores=True)
    for name, idx in flat.items():  # bm25s answers all queries in one batch, Milvus Lite in batches of 50
        out[f"{name}_qps_batched"] = qps(partial(idx.search_many, k=10), qs, batch=50 if name == "milvus" else len(qs))
        out[f"{name}_qps_single"] = qps(partial(idx.search, k=10), qs)
    cmem = timed(out, "clustered_bm25s_build_seconds", lambda: ClusteredBM25Index(max_tokens=4096).index(ds.corpus))
    clustered = {"bm25s": cmem, "milvus": timed(out, "clustered_milvus_upload_seconds", partial(
        MilvusClusteredBM25Index.from_index, cmem, db, "scifact_clusters"))}
    out["n_clusters"] = len(cmem.clusters)
    res = {name: [index.search(q, k=10, return_clusters=True) for q in qs] for name, index in clustered.items()}
    out["clusters"] = overlap(res["milvus"], res["bm25s"], scores=True)
    res = {name: [index.search(q, k=2) for q in qs] for name, index in clustered.items()}
    out["clustered_docs_top2_clusters"] = {**{name: metrics(qids, qrels, r, ["ndcg@10"]) for name, r in res.items()},
                                           **overlap(res["milvus"], res["bm25s"])}
    for name, index in clustered.items():
        out[f"clustered_{name}_qps"] = qps(partial(index.search, k=10), qs)
    for n in (1, 10):  # dict filters of n values: pushed down to Milvus Lite (per-row Python), numpy masks in memory
        flt = {"title": [u.metadata.get("title") for u in ds.corpus[:n]]}
        for kind, indexes in (("clustered", clustered), ("flat", flat)):
            for name, idx in indexes.items():
                out[f"{kind}_{name}_filtered_qps_{n}_values"] = qps(partial(idx.search, k=10, filter=flt), qs[:30])
    return out


def part_synthetic(ds, db: str, args, *_) -> dict:
    n = 10_000 if args.quick else 100_000
    big, queries = synthetic_search([u.text for u in ds.corpus], n, 50 if args.quick else 100)
    units = [Unit(id=str(i), text=t) for i, t in enumerate(big)]
    out: dict = {"n_documents": n, "n_queries": len(queries), "words_per_document": 100}
    mem = timed(out, "bm25s_build_seconds", lambda: BM25Index().index(units))
    mil = timed(out, "milvus_build_seconds", lambda: MilvusBM25Index(db, "synthetic_bm25").index(units))
    out["bm25s_qps_single"] = qps(partial(mem.search, k=10), queries)
    out["milvus_qps_single"] = qps(partial(mil.search, k=10), queries)
    out["milvus_qps_batched"] = qps(partial(mil.search_many, k=10), queries, batch=25)
    out.update(overlap(mil.search_many(queries, k=10), mem.search_many(queries, k=10), scores=True))
    physical = mil.client.describe_collection(mil.collection)["collection_name"]
    files = Path(db).rglob("data_*.parquet")  # Milvus Lite's sealed data files: BM25 statistics are per segment
    out["milvus_lite_segments"] = sum(f"collections/{physical}/" in f.as_posix() for f in files)
    return out


def part_dense(ds, db: str, args, qids: list[str], qs: list[str], qrels: dict) -> dict:
    from funnel_core.embeddings import DenseIndex, SentenceEmbedder

    n_docs = 1000 if args.quick else args.dense_docs
    judged = {d for q in qids for d in ds.qrels[q]}  # a subset: the documents judged for these queries + others
    corpus = sorted(ds.corpus, key=lambda u: u.id not in judged)[:max(n_docs, len(judged))] if n_docs else ds.corpus
    out: dict = {"n_documents": len(corpus), "subset": bool(n_docs), "n_queries": len(qs), "model": "all-MiniLM-L6-v2"}
    embedder = SentenceEmbedder()
    emb = timed(out, "embed_or_cache_seconds", lambda: cached_embeddings(embedder, [u.text for u in corpus],
                                                                         "scifact_minilm"))
    q_emb = embedder.encode(qs)
    mem = DenseIndex(embedder).index(corpus, embeddings=emb)
    mil = timed(out, "milvus_hnsw_insert_seconds", lambda: MilvusDenseIndex(
        db, "scifact_dense", embedder, index_type="HNSW").index(corpus, embeddings=emb))
    res = {name: index.search_many(qs, k=100, query_embeddings=q_emb) for name, index in (("numpy_exact", mem),
                                                                                          ("milvus_hnsw", mil))}
    out.update({name: metrics(qids, qrels, r) for name, r in res.items()})
    out.update(overlap(res["milvus_hnsw"], res["numpy_exact"]))
    for name, idx in (("numpy", mem), ("milvus", mil)):  # one query per call
        out[f"{name}_qps_single"] = qps(lambda i: idx.search_many([qs[i]], k=10, query_embeddings=q_emb[[i]]),
                                        range(len(qs)))
    return out


def part_frameworks(ds, db: str, args, qids: list[str], qs: list[str], qrels: dict) -> dict:
    """Both adapters' BM25 retrievers, in memory and on Milvus Lite, through framework calls."""
    from langchain_core.documents import Document
    from llama_index.core.schema import TextNode

    from funnel_core.backends.milvus import MilvusBackend
    from langchain_funnel.retrievers import BM25Retriever as LCBM25
    from llama_index_funnel.retrievers import BM25Retriever as LIBM25

    out: dict = {"n_documents": len(ds.corpus), "n_queries": len(qs)}
    nodes = [TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)) for u in ds.corpus]
    docs = [Document(id=u.id, page_content=u.text, metadata=dict(u.metadata)) for u in ds.corpus]
    frameworks = {  # build, ask, the method that saves, the class method that re-opens (at the backend it used)
        "llamaindex": (lambda backend: LIBM25.from_defaults(nodes=nodes, similarity_top_k=10, backend=backend),
                       lambda r, q: [n.node.node_id for n in r.retrieve(q)], "persist", LIBM25.from_persist_dir),
        "langchain": (lambda backend: LCBM25.from_documents(docs, k=10, backend=backend),
                      lambda r, q: [d.id for d in r.invoke(q)], "save", LCBM25.load)}
    for name, (build, ask, persist, reopen) in frameworks.items():
        res: dict = {}
        for where, backend in (("memory", None), ("milvus", MilvusBackend(db, collection=f"fw_{name}"))):
            r = timed(res, f"{where}_build_seconds", lambda: build(backend))
            ids: list[list[str]] = []
            res[f"{where}_qps"] = qps(lambda q: ids.append(ask(r, q)), qs)
            run = {q: {d: float(len(x) - rank) for rank, d in enumerate(x)} for q, x in zip(qids, ids)}
            res[f"{where}_ndcg@10"] = ir_metrics(qrels, run, ["ndcg@10"])["ndcg@10"]
            res[f"{where}_ids"] = ids
            folder = str(Path(db).parent / f"{name}_{where}")  # in main's temporary folder
            timed(res, f"{where}_persist_seconds", lambda: getattr(r, persist)(folder))
            res[f"{where}_persisted_bytes"] = sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())
            first = timed(res, f"{where}_reopen_seconds", lambda: ask(reopen(folder, backend=backend), qs[0]))
            res[f"{where}_reopened_same_answer"] = first == ids[0]
        both = overlap(res.pop("memory_ids"), res.pop("milvus_ids"))
        res.update({k: both[k] for k in ("identical_top10_share", "mean_top10_overlap")})
        out[name] = res
    return out


PARTS = {"scifact": part_scifact, "synthetic": part_synthetic, "dense": part_dense, "frameworks": part_frameworks}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="*", choices=list(PARTS), default=list(PARTS),
                   help="run only these parts; results of the others are kept from the existing JSON")
    p.add_argument("--memtable-mib", type=int, default=None, help="MILVUS_LITE_MEMTABLE_MEMORY_LIMIT_BYTES in MiB "
                   "(Lite's write buffer; one segment per flush); results stored as '<part>_memtable<N>mib'")
    p.add_argument("--dense-docs", type=int, default=None, help="dense part on the judged documents plus others up "
                   "to this count (embedding all 5,183 abstracts takes ~45 min on a busy 2-core machine)")
    args = p.parse_args()
    out_path = args.out or RESULTS / "milvus.json"
    ds = load_beir(args.data / "scifact", "test")
    result = {k: v for k, v in json.loads(out_path.read_text()).items() if k not in ("benchmark", "machine")} \
        if out_path.is_file() and set(args.parts) != set(PARTS) else {}
    if args.memtable_mib:
        os.environ["MILVUS_LITE_MEMTABLE_MEMORY_LIMIT_BYTES"] = str(args.memtable_mib * 2**20)
    queries = ds.split_queries()
    qids = list(queries)[: 60 if args.quick else None]  # the SciFact test queries (the first 60 with --quick)
    part_args = {"quick": args.quick, "memtable_mib": args.memtable_mib, "dense_docs": args.dense_docs}
    with tempfile.TemporaryDirectory(prefix="bench_milvus_", ignore_cleanup_errors=True) as tmp:
        db = str(Path(tmp) / "bench.db")
        for part in args.parts:
            load_before = load_average()
            with timer() as t:
                res = PARTS[part](ds, db, args, qids, [queries[q] for q in qids], {q: ds.qrels[q] for q in qids})
            print(f"[{part}] {json.dumps(res, default=float)}")
            res.update({"part_seconds": t["seconds"], "load_average_before": load_before,
                        "load_average_after": load_average(), "args": part_args})
            result[f"{part}_memtable{args.memtable_mib}mib" if args.memtable_mib else part] = res
    result["args"] = {"quick": args.quick, "parts": args.parts}
    result["versions"] = {"pymilvus": version("pymilvus"), "milvus_lite": version("milvus-lite")}
    result["notes"] = ("One process on a shared 2-core machine that ~6 engineers use at once (see the load averages "
                       "per part): speeds are indicative only. Milvus Lite 3.2 is pure Python (BM25 scored by Python "
                       "loops over posting lists, per segment), so its queries/s and build seconds say nothing about a "
                       "Milvus server. Scores: Milvus's BM25 carries the (k1+1) factor, divided out; ties may be "
                       "ordered differently by the two engines.")
    write_json("milvus", result, out_path)  # its tables: python benchmarks/report.py (docs/scaling_out.md)


if __name__ == "__main__":
    main()
