"""The funnel's indexes on Milvus (Milvus Lite, embedded) against the
in-memory bm25s / numpy backends: parity and speed.

    python benchmarks/bench_milvus.py --data ../shared/data            # full run
    python benchmarks/bench_milvus.py --data ../shared/data --quick    # smoke run
    python benchmarks/bench_milvus.py --parts dense                    # one part, others kept

Writes benchmarks/results/milvus.json. Parts: ``scifact`` (flat and clustered BM25 on SciFact test),
``synthetic`` (100k synthetic documents), ``dense`` (MiniLM, HNSW on Milvus vs exact numpy) and
``frameworks`` (the LlamaIndex and LangChain BM25 retrievers with ``backend=MilvusBackend(...)``,
persisting and re-opening included); what each measures is in the tables of docs/scaling_out.md.
Milvus Lite is pure Python: its speed says nothing about a Milvus server.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from common import RESULTS, cached_embeddings, load_average, parser, qps, synthetic_search, timed, timer, write_json

from funnel_core.backends.milvus import MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex
from funnel_core.bm25 import BM25Index
from funnel_core.evaluation import ir_metrics, load_beir, run_from_units
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.units import Unit

PARTS = ("scifact", "synthetic", "dense", "frameworks")


def overlap(a: list[list[Unit]], b: list[list[Unit]], k: int = 10) -> dict:
    ov, same = [], 0
    for x, y in zip(a, b):
        xs, ys = [u.id for u in x[:k]], [u.id for u in y[:k]]
        if not xs and not ys:
            ov.append(1.0)
        else:
            ov.append(len(set(xs) & set(ys)) / max(len(xs), len(ys)))
        same += xs == ys
    return {"mean_top10_overlap": float(np.mean(ov)), "identical_top10_share": same / len(a),
            "min_top10_overlap": float(np.min(ov))}


def max_score_diff(a: list[list[Unit]], b: list[list[Unit]]) -> float:
    d = 0.0
    for x, y in zip(a, b):
        ys = {u.id: u.score for u in y}
        for u in x:
            if u.id in ys:
                d = max(d, abs(u.score - ys[u.id]) / max(abs(ys[u.id]), 1e-9))
    return d


def scifact_queries(ds, quick: bool) -> tuple[list[str], list[str], dict]:
    """The test query ids, their texts and qrels (the first 60 with ``quick``)."""
    queries = ds.split_queries()
    qids = list(queries)[: 60 if quick else None]
    return qids, [queries[q] for q in qids], {q: ds.qrels[q] for q in qids}


def part_scifact(ds, db: str, quick: bool) -> dict:
    qids, qs, qrels = scifact_queries(ds, quick)
    out: dict = {"n_documents": len(ds.corpus), "n_queries": len(qs)}

    mem = timed(out, "bm25s_build_seconds", lambda: BM25Index().index(ds.corpus))
    mil = timed(out, "milvus_build_seconds", lambda: MilvusBM25Index(db, "scifact_bm25").index(ds.corpus))
    r_mem = mem.search_many(qs, k=100)
    r_mil = mil.search_many(qs, k=100)
    out["bm25s"] = ir_metrics(qrels, run_from_units(dict(zip(qids, r_mem))), ["ndcg@10", "recall@100"])
    out["milvus"] = ir_metrics(qrels, run_from_units(dict(zip(qids, r_mil))), ["ndcg@10", "recall@100"])
    out["ndcg10_difference"] = out["milvus"]["ndcg@10"] - out["bm25s"]["ndcg@10"]
    out["flat"] = overlap(r_mil, r_mem)
    out["flat"]["max_relative_score_difference"] = max_score_diff(r_mil, r_mem)
    out["bm25s_qps_batched"] = qps(lambda b: mem.search_many(b, k=10), qs, batch=len(qs))
    out["bm25s_qps_single"] = qps(lambda q: mem.search(q, k=10), qs)
    out["milvus_qps_batched"] = qps(lambda b: mil.search_many(b, k=10), qs, batch=50)
    out["milvus_qps_single"] = qps(lambda q: mil.search(q, k=10), qs)
    print(f"[scifact flat] {json.dumps(out, default=float)}")

    cmem = timed(out, "clustered_bm25s_build_seconds", lambda: ClusteredBM25Index(max_tokens=4096).index(ds.corpus))
    cmil = timed(out, "clustered_milvus_upload_seconds",
                 lambda: MilvusClusteredBM25Index.from_index(cmem, db, "scifact_clusters"))
    out["n_clusters"] = len(cmem.clusters)
    c_mem = [cmem.search(q, k=10, return_clusters=True) for q in qs]
    c_mil = [cmil.search(q, k=10, return_clusters=True) for q in qs]
    out["clusters"] = overlap(c_mil, c_mem)
    out["clusters"]["max_relative_score_difference"] = max_score_diff(c_mil, c_mem)
    d_mem = [cmem.search(q, k=2) for q in qs]
    d_mil = [cmil.search(q, k=2) for q in qs]
    out["clustered_docs_top2_clusters"] = {
        "bm25s": ir_metrics(qrels, run_from_units(dict(zip(qids, d_mem))), ["ndcg@10"]),
        "milvus": ir_metrics(qrels, run_from_units(dict(zip(qids, d_mil))), ["ndcg@10"]),
        **overlap(d_mil, d_mem)}
    out["clustered_bm25s_qps"] = qps(lambda q: cmem.search(q, k=10), qs)
    out["clustered_milvus_qps"] = qps(lambda q: cmil.search(q, k=10), qs)
    # filters pushed down to Milvus Lite (its filter evaluation is per-row Python); the
    # in-memory index evaluates the same dict filter with numpy masks
    for n_values in (1, 10):
        flt = {"title": [u.metadata.get("title") for u in ds.corpus[:n_values]]}
        out[f"clustered_bm25s_filtered_qps_{n_values}_values"] = qps(
            lambda q: cmem.search(q, k=10, filter=flt), qs[:30])
        out[f"clustered_milvus_filtered_qps_{n_values}_values"] = qps(
            lambda q: cmil.search(q, k=10, filter=flt), qs[:30])
        out[f"flat_bm25s_filtered_qps_{n_values}_values"] = qps(lambda q: mem.search(q, k=10, filter=flt), qs[:30])
        out[f"flat_milvus_filtered_qps_{n_values}_values"] = qps(lambda q: mil.search(q, k=10, filter=flt), qs[:30])
    print(f"[scifact clustered] {json.dumps({k: v for k, v in out.items() if 'cluster' in k}, default=float)}")
    return out


def lite_segments(db: str, index) -> int | None:
    """Sealed data files of the collection in the Milvus Lite folder (BM25 statistics are
    per segment in Milvus Lite 3.2); ``None`` when not a local Lite database."""
    try:
        physical = index.client.describe_collection(index.collection)["collection_name"]
    except Exception:
        return None
    root = Path(db)
    if not root.is_dir():
        return None
    files = [f for f in root.rglob("data_*.parquet") if f"collections/{physical}/" in f.as_posix()]
    return len(files)


def part_synthetic(ds, db: str, quick: bool) -> dict:
    n = 10_000 if quick else 100_000
    big, queries = synthetic_search([u.text for u in ds.corpus], n, 50 if quick else 100)
    units = [Unit(id=str(i), text=t) for i, t in enumerate(big)]
    del big
    out: dict = {"n_documents": n, "n_queries": len(queries), "words_per_document": 100}
    mem = timed(out, "bm25s_build_seconds", lambda: BM25Index().index(units))
    mil = timed(out, "milvus_build_seconds", lambda: MilvusBM25Index(db, "synthetic_bm25").index(units))
    out["bm25s_qps_single"] = qps(lambda q: mem.search(q, k=10), queries)
    out["milvus_qps_single"] = qps(lambda q: mil.search(q, k=10), queries)
    out["milvus_qps_batched"] = qps(lambda b: mil.search_many(b, k=10), queries, batch=25)
    r_mil, r_mem = mil.search_many(queries, k=10), mem.search_many(queries, k=10)
    out.update(overlap(r_mil, r_mem))
    out["max_relative_score_difference"] = max_score_diff(r_mil, r_mem)
    out["milvus_lite_segments"] = lite_segments(db, mil)
    print(f"[synthetic] {json.dumps(out, default=float)}")
    return out


DENSE_DOCS: int | None = None


def part_dense(ds, db: str, quick: bool) -> dict:
    from funnel_core.embeddings import DenseIndex, SentenceEmbedder

    qids, qs, qrels = scifact_queries(ds, quick)
    n_docs = 1000 if quick else DENSE_DOCS
    if n_docs:  # a subset: every document judged for these queries + the first n_docs others
        judged = {d for q in qids for d in ds.qrels[q]}
        corpus = [u for u in ds.corpus if u.id in judged]
        corpus += [u for u in ds.corpus if u.id not in judged][: max(0, n_docs - len(corpus))]
    else:
        corpus = ds.corpus
    embedder = SentenceEmbedder()
    with timer() as t:
        emb = cached_embeddings(embedder, [u.text for u in corpus], "scifact_minilm")
    q_emb = embedder.encode(qs)
    out: dict = {"n_documents": len(corpus), "subset": bool(n_docs), "n_queries": len(qs),
                 "model": "all-MiniLM-L6-v2",
                 "embed_or_cache_seconds": t["seconds"]}
    mem = DenseIndex(embedder).index(corpus, embeddings=emb)
    mil = timed(out, "milvus_hnsw_insert_seconds", lambda: MilvusDenseIndex(
        db, "scifact_dense", embedder, index_type="HNSW").index(corpus, embeddings=emb))
    r_mem = mem.search_many(qs, k=100, query_embeddings=q_emb)
    r_mil = mil.search_many(qs, k=100, query_embeddings=q_emb)
    out["numpy_exact"] = ir_metrics(qrels, run_from_units(dict(zip(qids, r_mem))), ["ndcg@10", "recall@100"])
    out["milvus_hnsw"] = ir_metrics(qrels, run_from_units(dict(zip(qids, r_mil))), ["ndcg@10", "recall@100"])
    out.update(overlap(r_mil, r_mem))
    out["numpy_qps_single"] = qps(lambda i: mem.search_many([qs[i]], k=10, query_embeddings=q_emb[i:i + 1]),
                                  list(range(len(qs))))
    out["milvus_qps_single"] = qps(lambda i: mil.search_many([qs[i]], k=10, query_embeddings=q_emb[i:i + 1]),
                                   list(range(len(qs))))
    print(f"[dense] {json.dumps(out, default=float)}")
    return out


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def part_frameworks(ds, db: str, quick: bool) -> dict:
    """Both adapters' BM25 retrievers, in memory and on Milvus Lite, through framework calls."""
    from langchain_core.documents import Document
    from llama_index.core.schema import TextNode

    from funnel_core.backends.milvus import MilvusBackend
    from langchain_funnel.retrievers import BM25Retriever as LCBM25
    from llama_index_funnel.retrievers import BM25Retriever as LIBM25

    qids, qs, qrels = scifact_queries(ds, quick)
    out: dict = {"n_documents": len(ds.corpus), "n_queries": len(qs)}
    tmp = Path(tempfile.mkdtemp(prefix="bench_fw_"))
    nodes = [TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)) for u in ds.corpus]
    docs = [Document(id=u.id, page_content=u.text, metadata=dict(u.metadata)) for u in ds.corpus]

    def run(ids_per_query: list[list[str]]) -> dict:
        return {q: {d: float(len(ids) - r) for r, d in enumerate(ids)} for q, ids in zip(qids, ids_per_query)}

    frameworks = {
        "llamaindex": (lambda backend: LIBM25.from_defaults(nodes=nodes, similarity_top_k=10, backend=backend),
                       lambda r, q: [n.node.node_id for n in r.retrieve(q)],
                       lambda r, path: r.persist(str(path)), lambda path: LIBM25.from_persist_dir(str(path))),
        "langchain": (lambda backend: LCBM25.from_documents(docs, k=10, backend=backend),
                      lambda r, q: [d.id for d in r.invoke(q)],
                      lambda r, path: r.save(path), lambda path: LCBM25.load(path)),
    }
    for name, (build, ask, persist, reopen) in frameworks.items():
        res: dict = {}
        for where, backend in (("memory", None), ("milvus", MilvusBackend(db, collection=f"fw_{name}"))):
            r = timed(res, f"{where}_build_seconds", lambda: build(backend))
            t0 = time.perf_counter()
            ids = [ask(r, q) for q in qs]
            res[f"{where}_qps"] = len(qs) / (time.perf_counter() - t0)
            res[f"{where}_ndcg@10"] = ir_metrics(qrels, run(ids), ["ndcg@10"])["ndcg@10"]
            res[f"{where}_ids"] = ids
            folder = tmp / f"{name}_{where}"
            timed(res, f"{where}_persist_seconds", lambda: persist(r, folder))
            res[f"{where}_persisted_bytes"] = _folder_bytes(folder)
            with timer() as t:
                again = reopen(folder)
                first = ask(again, qs[0])
            res[f"{where}_reopen_seconds"] = t["seconds"]
            res[f"{where}_reopened_same_answer"] = first == ids[0]
        mem, mil = res.pop("memory_ids"), res.pop("milvus_ids")
        res["identical_top10_share"] = sum(a == b for a, b in zip(mem, mil)) / len(qs)
        res["mean_top10_overlap"] = float(np.mean([len(set(a) & set(b)) / max(len(a), len(b), 1)
                                                   for a, b in zip(mem, mil)]))
        out[name] = res
        print(f"[frameworks {name}] {json.dumps(res, default=float)}")
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS),
                   help="run only these parts; results of the others are kept from the existing JSON")
    p.add_argument("--memtable-mib", type=int, default=None,
                   help="set MILVUS_LITE_MEMTABLE_MEMORY_LIMIT_BYTES (Lite's write buffer; one "
                        "segment per flush) and store results as '<part>_memtable<N>mib'")
    p.add_argument("--dense-docs", type=int, default=None,
                   help="dense part on a subset: the judged documents plus others up to this count "
                        "(embedding all 5,183 abstracts takes ~45 min on a busy 2-core machine)")
    p.add_argument("--db", type=Path, default=None,
                   help="Milvus Lite database path (default: a temporary folder, removed at the end)")
    args = p.parse_args()
    out_path = args.out or RESULTS / "milvus.json"
    ds = load_beir(args.data / "scifact", "test")
    result = {k: v for k, v in json.loads(out_path.read_text()).items() if k not in ("benchmark", "machine")} \
        if out_path.is_file() and set(args.parts) != set(PARTS) else {}
    tmp = Path(tempfile.mkdtemp(prefix="bench_milvus_"))
    db = str(args.db or tmp / "bench.db")
    global DENSE_DOCS
    DENSE_DOCS = args.dense_docs
    if args.memtable_mib:
        os.environ["MILVUS_LITE_MEMTABLE_MEMORY_LIMIT_BYTES"] = str(args.memtable_mib * 2**20)
    import milvus_lite
    import pymilvus

    try:
        for part in args.parts:
            load_before = load_average()
            with timer() as t:
                res = {"scifact": part_scifact, "synthetic": part_synthetic, "dense": part_dense,
                       "frameworks": part_frameworks}[part](
                    ds, db, args.quick)
            res["part_seconds"] = t["seconds"]
            res["load_average_before"] = load_before
            res["load_average_after"] = load_average()
            res["args"] = {"quick": args.quick, "memtable_mib": args.memtable_mib,
                           "dense_docs": args.dense_docs}
            result[f"{part}_memtable{args.memtable_mib}mib" if args.memtable_mib else part] = res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["args"] = {"quick": args.quick, "parts": args.parts}
    result["versions"] = {"pymilvus": pymilvus.__version__, "milvus_lite": milvus_lite.__version__}
    result["notes"] = (
        "One process on a shared 2-core machine that ~6 engineers use at once (see the load "
        "averages per part): speeds are indicative only. Milvus Lite 3.2 is pure Python (BM25 "
        "scored by Python loops over posting lists, per segment), so its queries/s and build "
        "seconds say nothing about a Milvus server. Scores: Milvus's BM25 carries the (k1+1) "
        "factor, divided out; ties may be ordered differently by the two engines.")
    write_json("milvus", result, out_path)  # its tables: python benchmarks/report.py (docs/scaling_out.md)


if __name__ == "__main__":
    main()
