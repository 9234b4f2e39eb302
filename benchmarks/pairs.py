"""Pair files of ``bench_squad_large.py``, their cross-encoder scores (on a CPU or a GPU), and its score cache.

    python benchmarks/pairs.py PAIRS.npz MODEL_FOLDER SCORES.npy [--batch-size 256] [--device cuda]

``PAIRS.npz`` (``bench_squad_large.py --export-pairs``) holds ``qi`` and ``pi`` (int32 indices of
each pair) and ``texts`` (gzip-compressed JSON ``{"questions": [...], "passages": [...]}``), so
every distinct text travels once. The scores are ``CrossEncoderScorer.score_pairs`` of funnel_core
(the benchmark's pipelines score with the same class; ``runtime`` and ``dtype`` "auto"): a float32 array
of one raw logit per pair, in the file's order, with ``SCORES.json`` beside it (device, precision,
pairs per second). ``bench_squad_large.py --import-scores PAIRS.npz SCORES.npy`` adds them to the cache.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
CACHE = REPO / ".cache" / "squad_large"


def read_pairs(path: str | Path) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    z = np.load(path)
    texts = json.loads(gzip.decompress(z["texts"].tobytes()).decode("utf-8"))
    return texts["questions"], texts["passages"], z["qi"].astype(np.int64), z["pi"].astype(np.int64)


def write_pairs(path: str | Path, questions: list[str], passages: list[str], qi, pi) -> None:
    blob = gzip.compress(json.dumps({"questions": questions, "passages": passages}).encode("utf-8"))
    np.savez_compressed(path, qi=np.asarray(qi, dtype=np.int32), pi=np.asarray(pi, dtype=np.int32),
                        texts=np.frombuffer(blob, dtype=np.uint8))


def score(questions, passages, qi, pi, model_dir: str, batch_size: int = 256, max_length: int = 192,
          device: str | None = None, log_every: int = 100_000) -> tuple[np.ndarray, dict]:
    """One raw score per pair ``(questions[qi[i]], passages[pi[i]])``, in chunks of ``log_every``."""
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    scorer = CrossEncoderScorer(str(model_dir), library="transformers", batch_size=batch_size,
                                device=device, max_length=max_length)
    out = np.zeros(len(qi), dtype=np.float32)
    t0 = time.perf_counter()
    for start in range(0, len(qi), log_every):
        a, b = qi[start:start + log_every], pi[start:start + log_every]
        out[start:start + len(a)] = scorer.score_pairs([questions[i] for i in a], [passages[j] for j in b])
        print(f"  {start + len(a)}/{len(qi)} pairs, {time.perf_counter() - t0:.0f} s", flush=True)
    secs = time.perf_counter() - t0
    return out, {"pairs": int(len(qi)), "seconds": secs, "pairs_per_second": len(qi) / max(secs, 1e-9),
                 "device": device or "auto", "runtime": scorer.active_runtime, "dtype": scorer.active_dtype,
                 "batch_size": batch_size, "max_length": max_length, "model": str(model_dir),
                 "scorer": "funnel_core CrossEncoderScorer.score_pairs (library transformers)"}


# -- the score cache ------------------------------------------------------------------------------
def model_key(model_dir: Path) -> str:
    """The score cache's key of a checkpoint: the SHA-1 of its weights (16 hex digits)."""
    h = hashlib.sha1()
    with open(model_dir / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def read_scores(path: Path, qids: set[str] | None = None) -> dict[tuple[str, int], float]:
    """``{(question id, passage index): score}`` of a score-cache file (of the questions ``qids`` only)."""
    z = np.load(path, allow_pickle=False)
    names = json.loads(gzip.decompress(z["qids"].tobytes()))
    qi, pi, s = z["qi"], z["pi"], z["s"]
    if qids is not None:
        keep = np.isin(qi, [i for i, q in enumerate(names) if q in qids])
        qi, pi, s = qi[keep], pi[keep], s[keep]
    return {(names[a], int(p)): float(x) for a, p, x in zip(qi, pi, s)}


class ScoreCache:
    """Cross-encoder scores keyed by (model, question id, passage index), kept in one .npz per model."""

    def __init__(self, model_dir: Path, folder: Path = CACHE):
        self.model_dir, self.model_key = model_dir, model_key(model_dir)
        self.path = folder / f"scores-{self.model_key}.npz"
        self.scores = read_scores(self.path) if self.path.is_file() else {}

    def save(self) -> None:
        qids = sorted({q for q, _ in self.scores})
        pos = {q: i for i, q in enumerate(qids)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(self.path, qi=np.array([pos[q] for q, _ in self.scores], dtype=np.int32),
                            pi=np.array([p for _, p in self.scores], dtype=np.int32),
                            s=np.array(list(self.scores.values()), dtype=np.float32),
                            qids=np.frombuffer(gzip.compress(json.dumps(qids).encode()), dtype=np.uint8))

    def missing(self, needed: dict[str, set[int]]) -> dict[str, list[int]]:
        """The pairs of ``needed`` not in the cache, per question (questions with none left out)."""
        out = {q: sorted(p for p in ps if (q, p) not in self.scores) for q, ps in needed.items()}
        return {q: ps for q, ps in out.items() if ps}

    def import_scores(self, pairs: Path, scores: Path) -> None:
        """Add the scores pairs.py wrote for a pairs file of :meth:`export` (its ``.ids.json`` names the pairs)."""
        _, _, qi, pi = read_pairs(pairs)
        ids, scored = json.loads(Path(f"{pairs}.ids.json").read_text()), np.load(scores)
        for a, b, s in zip(qi, pi, scored):
            self.scores[(ids["question_ids"][a], int(ids["passage_index"][b]))] = float(s)
        self.save()
        print(f"imported {len(scored)} scores into {self.path}", flush=True)

    def export(self, path: Path, missing: dict[str, list[int]], questions: dict[str, str], passages) -> None:
        """Write the ``missing`` pairs (texts from ``questions`` by id, ``passages`` by index) for pairs.py."""
        qids, used, qi, pi = _arrays(missing)
        write_pairs(path, [questions[q] for q in qids], [passages[p] for p in used], qi, pi)
        Path(f"{path}.ids.json").write_text(json.dumps({"question_ids": qids, "passage_index": used}))
        print(f"wrote {len(qi)} pairs to {path}; score them with pairs.py, then --import-scores", flush=True)

    def score(self, missing: dict[str, list[int]], questions: dict[str, str], passages, batch_size: int) -> None:
        """Score the ``missing`` pairs here on the CPU and save them."""
        if not missing:
            return
        qids, used, qi, pi = _arrays(missing)
        s, info = score([questions[q] for q in qids], [passages[p] for p in used], qi, pi, str(self.model_dir),
                        batch_size=batch_size, device="cpu", log_every=2000)
        self.scores.update({(qids[a], used[b]): float(x) for a, b, x in zip(qi, pi, s)})
        self.save()
        print(f"scored {len(qi)} pairs on CPU: {info}", flush=True)


def _arrays(missing: dict[str, list[int]]) -> tuple[list[str], list[int], np.ndarray, np.ndarray]:
    """Question ids, passage indices, and each pair's position in those two lists (questions in order)."""
    qids, used = list(missing), sorted({p for ps in missing.values() for p in ps})
    ppos = {p: j for j, p in enumerate(used)}
    return (qids, used, np.array([j for j, q in enumerate(qids) for _ in missing[q]], dtype=np.int64),
            np.array([ppos[p] for q in qids for p in missing[q]], dtype=np.int64))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("pairs", "model", "out"):
        ap.add_argument(name)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--device", default=None)
    ap.add_argument("--limit", type=int, default=None, help="score only the first N pairs (a check)")
    args = ap.parse_args()
    q, p, qi, pi = read_pairs(args.pairs)
    qi, pi = qi[:args.limit or None], pi[:args.limit or None]
    print(f"{len(qi)} pairs, {len(q)} questions, {len(p)} passages", flush=True)
    scores, info = score(q, p, qi, pi, args.model, args.batch_size, args.max_length, args.device)
    np.save(args.out, scores)
    Path(args.out).with_suffix(".json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
