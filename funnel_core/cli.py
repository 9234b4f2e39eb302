"""The ``funnel`` command line (also ``python -m funnel_core``).

    funnel demo                               offline demo over the stdlib's docstrings
    funnel index PATH --out DIR               cluster + index a folder of .txt/.md/.jsonl files
    funnel query DIR "question" [-k 5]        query an index; prints results and the stage trace
    funnel build CORPUS OUT [--engine ray]    offline pipeline (BM25, kNN, clusters, embeddings)
    funnel eval CONFIG.toml [--quiet-check]   evaluate systems on a dataset: JSON, Markdown, PNG

Benchmarks are scripts in the repository (``python benchmarks/bench_NAME.py``), not part of the
installed command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from funnel_core.units import Unit

__all__ = ["main", "load_folder"]

TEXT_SUFFIXES = {".txt", ".md", ".rst"}


def load_folder(path: str | os.PathLike, words: int = 300, show_progress: bool = True) -> list[Unit]:
    """Read a folder of ``.txt``/``.md``/``.rst`` files (cut into ~``words``-word documents)
    and ``.jsonl`` files (one document per line: ``text``, optional ``id``/``_id``, ``title``)."""
    from tqdm.auto import tqdm

    from funnel_core.text import word_windows

    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{str(root)!r} does not exist; pass a folder of text, Markdown or JSONL files.")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    files = [p for p in files if p.suffix in TEXT_SUFFIXES | {".jsonl"}]
    if not files:
        raise ValueError(f"no .txt, .md, .rst or .jsonl files under {str(root)!r}.")
    units: list[Unit] = []
    for f in tqdm(files, desc="reading", disable=not show_progress):
        rel = str(f.relative_to(root)) if root.is_dir() else f.name
        if f.suffix == ".jsonl":
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines()):
                if line.strip():
                    d = json.loads(line)
                    uid = str(d.get("id") or d.get("_id") or f"{rel}:{n}")
                    units.append(Unit(id=uid, text=d["text"], level="document",
                                      metadata={"title": d.get("title") or rel, "source": rel}))
        else:
            for i, chunk in enumerate(word_windows(f.read_text(encoding="utf-8", errors="replace"), words)):
                units.append(Unit(id=f"{rel}#{i}", text=chunk, level="document",
                                  metadata={"title": rel, "source": rel, "position": i}))
    return units


def _cmd_index(args: argparse.Namespace) -> int:
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Index

    units = load_folder(args.path, words=args.words)
    index = ClusteredBM25Index(max_tokens=args.max_tokens).index(units)
    index.save(args.out)
    print(f"indexed {len(units)} documents into {len(index.clusters)} clusters -> {args.out}")
    return 0


def _cmd_build(args: argparse.Namespace) -> int:
    from funnel_core.offline.build import build_index, report_json

    units = load_folder(args.corpus, words=args.words)
    ray_options = {}
    if args.ray_address:
        ray_options["address"] = args.ray_address
    elif args.num_cpus:
        ray_options["num_cpus"] = args.num_cpus
    try:
        report = build_index(units, args.out, engine=args.engine, max_tokens=args.max_tokens,
                             knn_k=args.knn_k, knn_threshold=args.knn_threshold,
                             block_size=args.block_size, embed=not args.no_embed,
                             embed_model=args.embed_model, embed_batch_size=args.embed_batch_size,
                             num_workers=args.workers, num_gpus=args.num_gpus, progress=True,
                             ray_options=ray_options)
    finally:
        if args.engine == "ray":
            from funnel_core.offline.ray import shutdown

            shutdown(only_if_started_here=True)
    print(report_json(report))
    return 0


def _is_build(path: Path) -> bool:
    from funnel_core.offline.build import BUILD_FORMAT
    from funnel_core.persist import snapshot_info

    try:
        return snapshot_info(path).get("format") == BUILD_FORMAT
    except Exception:
        return False


def _cmd_query(args: argparse.Namespace) -> int:
    from funnel_core.funnelrag.chunking import LaterChunking
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve

    path = Path(args.index)
    if _is_build(path):  # a folder written by `funnel build`
        from funnel_core.offline import load_build

        index = load_build(path)["clustered"]
    else:
        index = ClusteredBM25Index.load(path)
    funnel = ClusteredBM25Retrieve(index, k=args.clusters) >> LaterChunking(words=args.passage_words)
    if args.rerank:
        from funnel_core.rerank.embedding import EmbeddingScorer

        funnel = funnel >> EmbeddingScorer() % args.k
    else:
        from funnel_core.rerank.bm25 import BM25Scorer

        funnel = funnel >> BM25Scorer() % args.k
    funnel.warm_up()  # models load here, not inside the timed trace
    res = funnel.search(args.question)
    for i, u in enumerate(res.units, 1):
        print(f"{i}. [{u.metadata.get('title')}] score={u.score:.3f}\n   {' '.join(u.text.split())[:300]}")
    print("\n" + res.trace.format())
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from funnel_core.evaluation.config import run_config

    report, paths = run_config(args.config, n_timing=args.n_timing, quiet_check=args.quiet_check or None,
                               max_load=args.max_load, quiet_load=args.quiet_load, limit=args.limit,
                               output=args.out, cache_dir=args.cache_dir,
                               progress=not args.no_progress)
    print(report.to_markdown())
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from funnel_core.train.runner import run_train

    trained = run_train(args.config, output=args.out, max_minutes=args.max_minutes, limit=args.limit,
                        progress=not args.no_progress)
    card = trained.card
    print(f"trained {card['kind']} -> {trained.path}")
    print(json.dumps({k: card[k] for k in ("steps", "train_seconds", "stopped_early", "held_out_metrics",
                                           "cross_validation") if k in card}, indent=1))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from funnel_core.demo import run_demo

    run_demo(args.question or None)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    parser = argparse.ArgumentParser(prog="funnel", description="funnel-rag: coarse-to-fine retrieval.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="offline demo over the Python standard library's docstrings")
    p.add_argument("question", nargs="*", help="questions (default: a few built-in ones)")
    p.set_defaults(fn=_cmd_demo)

    p = sub.add_parser("index", help="cluster and index a folder of .txt/.md/.jsonl files")
    p.add_argument("path")
    p.add_argument("--out", required=True, help="folder to write the index to")
    p.add_argument("--words", type=int, default=300, help="words per document for text files")
    p.add_argument("--max-tokens", type=int, default=4096, help="maximum cluster size S")
    p.set_defaults(fn=_cmd_index)

    p = sub.add_parser("build", help="offline pipeline over a corpus: BM25, kNN graph, clusters, "
                       "embeddings (local or Ray engine) into a persisted index")
    p.add_argument("corpus", help="a .jsonl/.txt/.md file or a folder of them")
    p.add_argument("out", help="folder to write (replaced atomically)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local (this process, default) or ray (pip install 'funnel-rag[ray]')")
    p.add_argument("--words", type=int, default=300, help="words per document for text files")
    p.add_argument("--max-tokens", type=int, default=4096, help="maximum cluster size S")
    p.add_argument("--knn-k", type=int, default=20, help="neighbours per document in the kNN graph")
    p.add_argument("--knn-threshold", type=float, default=0.1, help="minimum normalised BM25 similarity")
    p.add_argument("--block-size", type=int, default=4096, help="documents per kNN block (one Ray task)")
    p.add_argument("--no-embed", action="store_true", help="skip the document embeddings")
    p.add_argument("--embed-model", default=None,
                   help="sentence-transformers model name or folder (default: packaged MiniLM)")
    p.add_argument("--embed-batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=None,
                   help="ray: kNN tasks in flight (default: all CPUs) and embedding actors (default 1)")
    p.add_argument("--num-gpus", type=float, default=0,
                   help="GPUs per embedding actor (0: CPU actors)")
    p.add_argument("--ray-address", default=None, help="ray: join this cluster (e.g. auto)")
    p.add_argument("--num-cpus", type=int, default=None, help="ray: CPUs of a local Ray")
    p.set_defaults(fn=_cmd_build)

    p = sub.add_parser("query", help="query an index written by `funnel index` or `funnel build`")
    p.add_argument("index")
    p.add_argument("question")
    p.add_argument("-k", type=int, default=5, help="passages to print")
    p.add_argument("--clusters", type=int, default=10, help="clusters to open")
    p.add_argument("--passage-words", type=int, default=100)
    p.add_argument("--rerank", action="store_true",
                   help="rerank passages with the packaged MiniLM (default: BM25 over the passages)")
    p.set_defaults(fn=_cmd_query)

    p = sub.add_parser("eval", help="evaluate retrieval systems on a dataset (quality with intervals, "
                       "cost per query) from a TOML configuration; writes report.json, report.md, pareto.png",
                       description="See docs/evaluation.md for the configuration format.")
    p.add_argument("config", help="TOML file: [dataset], [evaluate], [systems.NAME] tables")
    p.add_argument("--out", default=None, help="output folder (default: [evaluate] output, else eval-out; a "
                   "TOML's output must lie inside the TOML's folder, this one may be anywhere)")
    p.add_argument("--cache-dir", default=None, help="per-question score cache (default: [evaluate] cache_dir, "
                   "else OUT/cache; a TOML's cache_dir must lie inside the TOML's folder)")
    p.add_argument("--n-timing", type=int, default=None, help="questions to time (0: none)")
    p.add_argument("--limit", type=int, default=None, help="evaluate a seeded sample of this many questions")
    p.add_argument("--quiet-check", action="store_true",
                   help="before timing, wait (bounded by quiet_timeout) for the load average to fall")
    p.add_argument("--max-load", type=float, default=None,
                   help="withhold seconds when the 1-minute load average exceeds this (default: cores)")
    p.add_argument("--quiet-load", type=float, default=None,
                   help="--quiet-check waits for the load average to fall to this (default: --max-load)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_eval)

    p = sub.add_parser("train", help="train a model (cross-encoder, fid-reader, l2g, mog-router, rankrag, "
                       "query-classifier) from a TOML configuration; writes the model folder with its card and "
                       "SHA-256 manifest",
                       description="See docs/training.md for the configuration format.")
    p.add_argument("config", help="TOML file: [dataset], [train], [mining], [model] tables")
    p.add_argument("--out", default=None, help="model folder (default: [train] output)")
    p.add_argument("--max-minutes", type=float, default=None, help="time cap of the optimisation")
    p.add_argument("--limit", type=int, default=None, help="train on a seeded sample of this many questions")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(fn=_cmd_train)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (OSError, ValueError, TypeError, ImportError) as exc:
        print(f"funnel {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
