"""Pair files of ``bench_squad_large.py`` and their cross-encoder scores, on a CPU or a GPU.

    python benchmarks/pairs.py PAIRS.npz MODEL_FOLDER SCORES.npy [--batch-size 256] [--device cuda]

``PAIRS.npz`` (``bench_squad_large.py --export-pairs``) holds ``qi`` and ``pi`` (int32 indices of
each pair) and ``texts`` (gzip-compressed JSON ``{"questions": [...], "passages": [...]}``), so
every distinct text travels once. The scores are ``CrossEncoderScorer.score_pairs`` of funnel_core
(the benchmark's pipelines score with the same class; ``runtime`` and ``dtype`` "auto"): a float32 array
of one raw logit per pair, in the file's order, with ``SCORES.json`` beside it (device, precision,
pairs per second).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


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
    step = max(1, log_every or len(qi))
    for start in range(0, len(qi), step):
        a, b = qi[start:start + step], pi[start:start + step]
        out[start:start + len(a)] = scorer.score_pairs([questions[i] for i in a], [passages[j] for j in b])
        print(f"  {start + len(a)}/{len(qi)} pairs, {time.perf_counter() - t0:.0f} s", flush=True)
    secs = time.perf_counter() - t0
    info = {"pairs": int(len(qi)), "seconds": secs, "pairs_per_second": len(qi) / max(secs, 1e-9),
            "device": device or "auto", "runtime": scorer.active_runtime, "dtype": scorer.active_dtype,
            "batch_size": batch_size,
            "max_length": max_length, "model": str(model_dir),
            "scorer": "funnel_core CrossEncoderScorer.score_pairs (library transformers)"}
    return out, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs")
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--device", default=None)
    ap.add_argument("--limit", type=int, default=None, help="score only the first N pairs (a check)")
    args = ap.parse_args()
    q, p, qi, pi = read_pairs(args.pairs)
    if args.limit:
        qi, pi = qi[:args.limit], pi[:args.limit]
    print(f"{len(qi)} pairs, {len(q)} questions, {len(p)} passages", flush=True)
    scores, info = score(q, p, qi, pi, args.model, args.batch_size, args.max_length, args.device)
    np.save(args.out, scores)
    Path(args.out).with_suffix(".json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
