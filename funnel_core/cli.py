"""The ``funnel`` command line (also ``python -m funnel_core``).

    funnel demo                               offline demo over the stdlib's docstrings
    funnel index PATH --out DIR               cluster + index a folder of .txt/.md/.jsonl files
    funnel query DIR "question" [-k 5]        query an index; prints results and the stage trace
    funnel bench NAME [--data ../shared/data] run a benchmark script from benchmarks/
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
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
    from funnel_core.clustered import ClusteredBM25Index

    units = load_folder(args.path, words=args.words)
    index = ClusteredBM25Index(max_tokens=args.max_tokens).index(units)
    index.save(args.out)
    print(f"indexed {len(units)} documents into {len(index.clusters)} clusters -> {args.out}")
    return 0


def _cmd_query(args: argparse.Namespace) -> int:
    from funnel_core.clustered import ClusteredBM25Index, ClusteredBM25Retrieve
    from funnel_core.text import LaterChunking

    index = ClusteredBM25Index.load(args.index)
    funnel = ClusteredBM25Retrieve(index, k=args.clusters) >> LaterChunking(words=args.passage_words)
    if args.rerank:
        from funnel_core.embeddings import EmbeddingReranker

        funnel = funnel >> EmbeddingReranker() % args.k
    else:
        from funnel_core.bm25 import BM25Rerank

        funnel = funnel >> BM25Rerank() % args.k
    res = funnel.search(args.question)
    for i, u in enumerate(res.units, 1):
        print(f"{i}. [{u.metadata.get('title')}] score={u.score:.3f}\n   {' '.join(u.text.split())[:300]}")
    print("\n" + res.trace.format())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parents[1] / "benchmarks" / f"bench_{args.name}.py"
    if not script.is_file():
        available = sorted(p.stem[6:] for p in script.parent.glob("bench_*.py"))
        print(f"no benchmark {args.name!r}; available: {', '.join(available)}", file=sys.stderr)
        return 2
    saved_argv = sys.argv
    sys.argv = [str(script), *(["--data", args.data] if args.data else []), *args.rest]
    # as `python script.py` does: the script's folder first on sys.path (benchmarks import common)
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.path.remove(str(script.parent))
        sys.argv = saved_argv
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

    p = sub.add_parser("query", help="query an index written by `funnel index`")
    p.add_argument("index")
    p.add_argument("question")
    p.add_argument("-k", type=int, default=5, help="passages to print")
    p.add_argument("--clusters", type=int, default=10, help="clusters to open")
    p.add_argument("--passage-words", type=int, default=100)
    p.add_argument("--rerank", action="store_true",
                   help="rerank passages with the packaged MiniLM (default: BM25 over the passages)")
    p.set_defaults(fn=_cmd_query)

    p = sub.add_parser("bench", help="run benchmarks/bench_NAME.py")
    p.add_argument("name")
    p.add_argument("--data", default=None, help="data folder (default: ../shared/data)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=_cmd_bench)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except (OSError, ValueError, TypeError) as exc:
        print(f"funnel {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
