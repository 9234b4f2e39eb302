"""The offline demo: a FunnelRAG-style funnel over the Python standard library's docstrings.

Every machine with Python has this corpus, so the demo needs no download:

    clustered BM25 (top 5 clusters -> their first 40 documents)
      >> embedding rerank of documents (packaged all-MiniLM-L6-v2) % 8
      >> later chunking into ~60-word passages
      >> embedding rerank of passages % 3

Every document and every passage the funnel can produce is embedded once, ahead of the
questions, into a :class:`~funnel_core.embeddings.DenseIndex` kept in the user's cache folder
(keyed by the corpus and the model); the rerankers read their vectors from it, so a question
embeds only itself.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import pkgutil
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from funnel_core.cache import cache_root
from funnel_core.errors import PersistError
from funnel_core.units import Unit

if TYPE_CHECKING:
    from funnel_core.embeddings import DenseIndex, SentenceEmbedder
    from funnel_core.funnelrag.chunking import LaterChunking

__all__ = ["stdlib_corpus", "build_demo_funnel", "demo_vectors", "run_demo", "DEMO_QUESTIONS"]

DEMO_QUESTIONS = [
    "How do I parse command line arguments with subcommands?",
    "compute a SHA-256 hash of a file",
    "run a shell command and capture its output",
    "read rows from a CSV file as dictionaries",
]

_SKIP_PREFIXES = ("_", "test", "idlelib", "tkinter", "turtle", "lib2to3", "ensurepip", "venv",
                  "distutils", "pydoc_data", "this", "antigravity", "xxsubtype", "msilib",
                  "winreg", "winsound", "msvcrt", "nt", "_msi", "asyncio.__main__")


def _module_names() -> list[str]:
    names = set(getattr(sys, "stdlib_module_names", ()))
    if not names:  # Python < 3.10
        names = {m.name for m in pkgutil.iter_modules() if m.module_finder and "site-packages" not in str(m.module_finder)}
    return sorted(n for n in names if not n.startswith(_SKIP_PREFIXES))


def _doc_units(module_name: str) -> Iterable[Unit]:
    from funnel_core.funnelrag.clustering import LINKS_KEY

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(module_name)
    except BaseException:  # some modules need a display, a platform or refuse import
        return
    mod_doc = inspect.getdoc(module)
    if mod_doc:
        yield Unit(id=module_name, text=f"{module_name}: {mod_doc}", level="document",
                   metadata={"title": module_name, "module": module_name, LINKS_KEY: []})
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module_name:
            continue
        if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            continue
        doc = inspect.getdoc(obj)
        if not doc or len(doc.split()) < 5:
            continue
        qual = f"{module_name}.{name}"
        yield Unit(id=qual, text=f"{qual}: {doc}", level="document",
                   metadata={"title": qual, "module": module_name, LINKS_KEY: [module_name]})
        if inspect.isclass(obj):
            for mname, meth in sorted(vars(obj).items()):
                mdoc = inspect.getdoc(meth) if not mname.startswith("_") else None
                if mdoc and len(mdoc.split()) >= 5 and (inspect.isfunction(meth) or inspect.ismethoddescriptor(meth)):
                    mq = f"{qual}.{mname}"
                    yield Unit(id=mq, text=f"{mq}: {mdoc}", level="document",
                               metadata={"title": mq, "module": module_name, LINKS_KEY: [qual]})


def stdlib_corpus() -> list[Unit]:
    """Docstrings of the standard library's modules, classes, functions and methods.

    ``metadata["funnel_links"]`` (:data:`~funnel_core.funnelrag.clustering.LINKS_KEY`) points from a method to its class and from a class or function to its
    module, so the clustering uses explicit links, like Wikipedia hyperlinks in the paper.
    """
    seen: set[str] = set()
    units = []
    for name in _module_names():
        for u in _doc_units(name):
            if u.id not in seen:
                seen.add(u.id)
                units.append(u)
    return units


def demo_vectors(units: list[Unit], chunker: "LaterChunking", embedder: "SentenceEmbedder",
                 cache_dir: str | os.PathLike | None = None) -> "DenseIndex":
    """A dense index over every document in ``units`` and every passage ``chunker`` cuts from
    them (each distinct text once), loaded from ``cache_dir`` (default: a folder under
    :func:`cache_root` named by a hash of the texts and the model) or built and saved there."""
    from funnel_core.embeddings import DenseIndex

    texts: dict[str, Unit] = {}
    for doc in units:
        for u in (doc, *chunker.split(doc)):
            texts.setdefault(u.text, u)
    digest = hashlib.sha256(repr(embedder._model_key()).encode())
    for text, u in texts.items():
        digest.update(f"{u.id}\0{text}\0".encode())
    folder = Path(cache_dir) if cache_dir is not None else cache_root() / f"demo-{digest.hexdigest()[:16]}"
    if (folder / "CURRENT").exists():
        try:
            return DenseIndex.load(folder, embedder)
        except (PersistError, OSError, ValueError) as exc:  # a damaged cache is rebuilt, never trusted
            warnings.warn(f"rebuilding the demo's embedding cache in {str(folder)!r} ({exc})", stacklevel=2)
    index = DenseIndex(embedder, index="exact").index(list(texts.values()))
    index.save(folder)
    return index


def build_demo_funnel(units: list[Unit], k_clusters: int = 5, cache_dir: str | os.PathLike | None = None):
    """The demo's funnel over ``units`` (see the module docstring); ``cache_dir``: see
    :func:`demo_vectors`."""
    from funnel_core.embeddings import SentenceEmbedder
    from funnel_core.funnelrag.chunking import LaterChunking
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
    from funnel_core.rerank.embedding import EmbeddingScorer

    index = ClusteredBM25Index(max_tokens=4096).index(units)
    embedder = SentenceEmbedder()
    chunker = LaterChunking(words=60)
    vectors = demo_vectors(units, chunker, embedder, cache_dir)
    funnel = (ClusteredBM25Retrieve(index, k=k_clusters) % 40
              >> EmbeddingScorer(embedder, index=vectors, name="minilm_docs") % 8
              >> chunker
              >> EmbeddingScorer(embedder, index=vectors, name="minilm_passages") % 3)
    return index, funnel


def run_demo(questions: list[str] | None = None, out=print) -> None:
    """Build the stdlib funnel and answer ``questions``, printing results and stage traces."""
    t0 = time.perf_counter()
    units = stdlib_corpus()
    out(f"corpus: {len(units)} docstrings from the Python {sys.version.split()[0]} standard library "
        f"({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    index, funnel = build_demo_funnel(units)
    funnel.warm_up()
    sizes = [c.metadata["n_tokens"] for c in index.clusters]
    out(f"clustered into {len(index.clusters)} clusters (Algorithm 1, S=4096 tokens, explicit links; "
        f"mean {sum(sizes) / len(sizes):.0f} tokens) and embedded every document and passage (once; "
        f"kept under {cache_root()}) in {time.perf_counter() - t0:.1f} s\n")
    for q in questions or DEMO_QUESTIONS:
        res = funnel.search(q)
        out(f"Q: {q}")
        for i, u in enumerate(res.units, 1):
            snippet = " ".join(u.text.split())[:160]
            out(f"  {i}. [{u.metadata.get('title')}] score={u.score:.3f}  {snippet}...")
        out("  trace:")
        out("\n".join("    " + line for line in res.trace.format().splitlines()))
        out("")
