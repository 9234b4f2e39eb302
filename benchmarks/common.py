"""Helpers shared by the benchmark scripts: data path, timing, peak memory, JSON output."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


_LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None


def default_data_dir() -> Path:
    return Path(os.environ.get("FUNNEL_DATA", ROOT.parent / "shared" / "data"))


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data", type=Path, default=default_data_dir(), help="folder with scifact/ and squad/")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    p.add_argument("--out", type=Path, default=None, help="JSON output path")
    return p


def command_line(python: str = "python") -> str:
    """The command this process runs, as typed from the repository root."""
    return " ".join([python, os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


@contextmanager
def timer() -> Iterator[dict]:
    box: dict[str, float] = {}
    t0 = time.perf_counter()
    yield box
    box["seconds"] = time.perf_counter() - t0


def timed(out: dict, key: str, fn: Callable[[], T]) -> T:
    """``fn()``, its wall-clock seconds (:func:`timer`) stored as ``out[key]``."""
    with timer() as t:
        result = fn()
    out[key] = t["seconds"]
    return result


def interleaved_seconds(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each call of ``runs`` over ``repeats`` rounds, after one warm-up call each (lazy
    model loading); every round calls each in turn, so a change of the machine's load hits all alike."""
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def qps(fn: Callable[[Any], Any], queries: list[str], batch: int | None = None) -> float:
    """Queries per second of ``fn`` called on each query (or, with ``batch``, on batches of that many)."""
    with timer() as t:
        if batch:
            for i in range(0, len(queries), batch):
                fn(queries[i:i + batch])
        else:
            for q in queries:
                fn(q)
    return len(queries) / t["seconds"]


@contextmanager
def peak_memory() -> Iterator[dict]:
    """Peak Python-heap + numpy allocation (tracemalloc) inside the block, in MiB."""
    box: dict[str, float] = {}
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        yield box
    finally:
        box["peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()


# -- latency report: p50/p95 per query with warm models, load average, CPU flags ----
def load_average(digits: int | None = None) -> list[float] | None:
    """The 1/5/15-minute load average, rounded to ``digits`` if given (``None`` where the OS has none)."""
    if not hasattr(os, "getloadavg"):
        return None
    return [x if digits is None else round(x, digits) for x in os.getloadavg()]


def latency_cpu() -> dict[str, Any]:
    """CPU model, core count and the SIMD flags that decide fast paths (from funnel_core.hardware)."""
    from funnel_core.hardware import describe

    d = describe()
    return {"model": d["cpu_model"], "cores": d["cpus"], "flags": d["cpu_flags"]}


def latency_summary(seconds: "list[float] | Any") -> dict[str, Any]:
    """p50/p95/mean/min/max seconds of a list of per-query timings (warm: drop warm-up calls
    before passing them)."""
    from funnel_core.evaluation.stats import percentile

    a = [float(x) for x in seconds]
    if not a:
        return {"n": 0}
    return {"n": len(a), "p50_s": percentile(a, 50), "p95_s": percentile(a, 95),
            "mean_s": sum(a) / len(a), "min_s": min(a), "max_s": max(a)}


class LatencyReport:
    """Time calls one by one and report p50/p95 seconds per query with the load average around
    the run and the CPU flags, so figures from a busy machine are recognisable::

        rep = LatencyReport("bm25 search k=10")
        for q in queries:
            with rep.time():
                index.search(q, k=10)
        result["latency"] = rep.summary()

    Warm the models up before the first timed call; ``add(seconds, n)`` records a batch of
    ``n`` queries timed together (its per-query mean enters the percentiles ``n`` times).
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.seconds: list[float] = []
        self.load_before = load_average()

    @contextmanager
    def time(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds.append(time.perf_counter() - t0)

    def add(self, seconds: float, n: int = 1) -> None:
        self.seconds.extend([seconds / n] * n)

    def summary(self) -> dict[str, Any]:
        return {"what": self.what, **latency_summary(self.seconds), "load_average_before": self.load_before,
                "load_average_after": load_average(), "cpu": latency_cpu()}


def machine() -> dict[str, Any]:
    import numpy

    from funnel_core.hardware import describe

    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "numpy": numpy.__version__,
            "load_average_at_start": _LOAD_AT_START,
            "load_average_at_end": load_average(),
            "hardware": describe()}  # CPU flags and the precisions this process's models ran in


def save_json(path: Path, payload: Any, indent: int = 1, **dumps: Any) -> None:
    """Write ``payload`` as JSON atomically (a temporary file, then a rename), so a run stopped
    mid-write, or a reader, never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=indent, **dumps), encoding="utf-8")
    os.replace(tmp, path)


def write_json(name: str, payload: dict, out: Path | None = None) -> Path:
    path = out or RESULTS / f"{name}.json"
    save_json(path, {"benchmark": name, "machine": machine(), **payload}, indent=2, default=float)
    print(f"wrote {path}")
    return path


def merge_rows(old: list[dict], new: list[dict], key: Callable[[dict], Any]) -> list[dict]:
    """The rows of ``old`` that no row of ``new`` replaces (same ``key``), then ``new``: a run of some sizes or
    settings keeps the JSON's other rows."""
    keys = {key(r) for r in new}
    return [r for r in old if key(r) not in keys] + list(new)


def cached_embeddings(embedder, texts: list[str], name: str):
    """Encode ``texts`` once per (model, texts) and keep the array under ``.cache/``."""
    import hashlib

    import numpy as np

    h = hashlib.sha1(embedder.model_name_or_path.encode())
    for t in texts:
        h.update(t.encode("utf-8", "replace"))
        h.update(b"\0")
    path = ROOT / ".cache" / f"emb-{name}-{h.hexdigest()[:16]}.npy"
    if path.is_file():
        return np.load(path)
    emb = embedder.encode(texts, show_progress=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, emb)
    return emb

# -- synthetic corpora (the timing benchmarks) --------------------------------------------------------
def scifact_texts(data: Path, n: int = 3000, title: bool = True) -> list[str]:
    """The first ``n`` SciFact abstracts of ``data``/scifact/corpus.jsonl: title and text, or the text alone."""
    with open(data / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        docs = [json.loads(line) for line, _ in zip(f, range(n))]
    return [f"{d.get('title', '')} {d['text']}".strip() if title else d["text"] for d in docs]


def vocabulary(texts: list[str], docs: int = 3000) -> list[str]:
    """The alphabetic lower-cased words of the first ``docs`` texts, sorted."""
    return sorted({w for t in texts[:docs] for w in t.lower().split() if w.isalpha()})


def synthetic_corpus(n: int, vocab: list[str], seed: int = 0, words: int = 100, topics: int = 2000) -> list[str]:
    """Documents drawn from topic-specific word sets plus Zipf background words (clusterable)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    v = np.array(vocab)
    zipf = 1.0 / np.arange(1, len(v) + 1)
    zipf /= zipf.sum()
    topic_words = [rng.choice(len(v), size=150, replace=False, p=zipf) for _ in range(topics)]
    docs = []
    for i in range(n):
        tw = topic_words[rng.integers(topics)]
        n_topic = int(words * 0.6)
        ids = np.concatenate([rng.choice(tw, size=n_topic), rng.choice(len(v), size=words - n_topic, p=zipf)])
        docs.append(" ".join(v[ids]))
    return docs


def synthetic_search(texts: list[str], n: int, n_queries: int, seed: int = 1) -> tuple[list[str], list[str]]:
    """``n`` synthetic documents over the vocabulary of ``texts`` (``synthetic_corpus``) and ``n_queries``
    queries of 8 words each, drawn from random documents (seeded)."""
    docs = synthetic_corpus(n, vocabulary(texts), seed=seed)
    rng = random.Random(0)
    return docs, [" ".join(rng.sample(docs[rng.randrange(n)].split(), 8)) for _ in range(n_queries)]
