"""Helpers shared by the benchmark scripts: data path, timing, latency, JSON output, synthetic corpora."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_LOAD_AT_START = os.getloadavg() if hasattr(os, "getloadavg") else None


def load_average(digits: int | None = None) -> list[float] | None:
    """The 1/5/15-minute load average, rounded to ``digits`` if given (``None`` where the OS has none)."""
    if not hasattr(os, "getloadavg"):
        return None
    return [x if digits is None else round(x, digits) for x in os.getloadavg()]


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
    """``fn()``, its wall-clock seconds stored as ``out[key]``."""
    t0 = time.perf_counter()
    result = fn()
    out[key] = time.perf_counter() - t0
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
    calls = [queries[i:i + batch] for i in range(0, len(queries), batch)] if batch else queries
    t0 = time.perf_counter()
    for c in calls:
        fn(c)
    return len(queries) / (time.perf_counter() - t0)


class LatencyReport:
    """Time calls one by one (``with rep.time(): ...``; warm the models up first) and report p50/p95 seconds
    per query with the load average around the run and the CPU flags (a busy machine is recognisable)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seconds: list[float] = []
        self.load_before = load_average()

    @contextmanager
    def time(self) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.seconds.append(time.perf_counter() - t0)

    def summary(self) -> dict[str, Any]:
        from funnel_core.evaluation.stats import percentile
        from funnel_core.hardware import describe

        a, d = self.seconds, describe()
        stats = {"n": len(a), "p50_s": percentile(a, 50), "p95_s": percentile(a, 95), "mean_s": sum(a) / len(a),
                 "min_s": min(a), "max_s": max(a)} if a else {"n": 0}
        cpu = {"model": d["cpu_model"], "cores": d["cpus"], "flags": d["cpu_flags"]}
        return {"what": self.what, **stats, "load_average_before": self.load_before,
                "load_average_after": load_average(), "cpu": cpu}


def machine() -> dict[str, Any]:
    from funnel_core.hardware import describe

    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "numpy": np.__version__, "load_average_at_start": _LOAD_AT_START, "load_average_at_end": load_average(),
            "hardware": describe()}  # CPU flags and the precisions this process's models ran in


def save_json(path: Path, payload: Any, indent: int = 1, **dumps: Any) -> None:
    """Write ``payload`` as JSON atomically (a temporary file, then a rename): nobody sees half a file."""
    from funnel_core.evaluation._files import write_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(payload, indent=indent, **dumps).encode("utf-8"))


def write_json(name: str, payload: dict, out: Path | None = None) -> Path:
    path = out or RESULTS / f"{name}.json"
    save_json(path, {"benchmark": name, "machine": machine(), **payload}, indent=2, default=float)
    print(f"wrote {path}")
    return path


def merge_rows(old: list[dict], new: list[dict], key: Callable[[dict], Any]) -> list[dict]:
    """The rows of ``old`` that no row of ``new`` replaces (same ``key``), then ``new`` (a partial run)."""
    keys = {key(r) for r in new}
    return [r for r in old if key(r) not in keys] + list(new)


def cached_embeddings(embedder, texts: list[str], name: str):
    """Encode ``texts`` once per (model, texts) and keep the array under ``.cache/``."""
    h = hashlib.sha1(embedder.model_name_or_path.encode())
    for t in texts:
        h.update(t.encode("utf-8", "replace") + b"\0")
    path = ROOT / ".cache" / f"emb-{name}-{h.hexdigest()[:16]}.npy"
    if path.is_file():
        return np.load(path)
    emb = embedder.encode(texts, show_progress=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, emb)
    return emb


def vocabulary(texts: list[str], docs: int = 3000) -> list[str]:
    """The alphabetic lower-cased words of the first ``docs`` texts, sorted."""
    return sorted({w for t in texts[:docs] for w in t.lower().split() if w.isalpha()})


def scifact_vocabulary(data: Path) -> list[str]:
    """The :func:`vocabulary` of the first 3,000 SciFact abstracts (titles included) in ``data``/scifact."""
    with open(data / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        docs = [json.loads(line) for line, _ in zip(f, range(3000))]
    return vocabulary([f"{d.get('title', '')} {d['text']}".strip() for d in docs])


def synthetic_term_ids(n: int, vocab_size: int, seed: int = 0) -> Iterator[np.ndarray]:
    """Clusterable documents as rows of 100 term ids, 20,000 documents at a time (seeded): 2,000 topics of 150
    terms drawn Zipf-wise; a document is 60 words of its topic's terms plus 40 Zipf background words."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, vocab_size + 1)
    zipf /= zipf.sum()
    cdf = np.cumsum(zipf)
    topic_words = np.stack([rng.choice(vocab_size, size=150, replace=False, p=zipf) for _ in range(2000)])
    topic_of = rng.integers(2000, size=n)
    for s in range(0, n, 20_000):
        m = min(20_000, n - s)
        tw = topic_words[topic_of[s:s + m, None], rng.integers(150, size=(m, 60))]
        bg = np.minimum(np.searchsorted(cdf, rng.random((m, 40))), vocab_size - 1)
        yield np.concatenate([tw, bg], axis=1)


def synthetic_corpus(n: int, vocab: list[str], seed: int = 0) -> list[str]:
    """``n`` documents of :func:`synthetic_term_ids` over the words of ``vocab``."""
    v = np.array(vocab)
    return [" ".join(r) for ids in synthetic_term_ids(n, len(v), seed) for r in v[ids].tolist()]


def synthetic_search(texts: list[str], n: int, n_queries: int, seed: int = 1) -> tuple[list[str], list[str]]:
    """``n`` documents over the vocabulary of ``texts`` and ``n_queries`` 8-word queries drawn from them (seeded)."""
    docs = synthetic_corpus(n, vocabulary(texts), seed=seed)
    rng = random.Random(0)
    return docs, [" ".join(rng.sample(docs[rng.randrange(n)].split(), 8)) for _ in range(n_queries)]
