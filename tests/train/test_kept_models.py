"""The trained models kept in models/: intact, re-creatable by their recorded command, and still as
good as the published numbers say."""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path

import pytest

from funnel_core.train.card import read_card, verify_model

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
KEPT = ("minilm-squad-ce", "minilm-squad-fid", "minilm-squad-l2g", "rankrag-smollm2-135m", "query-classifier")
DEV_A = ROOT.parent / "shared" / "data" / "squad" / "squad-v1.1-dev-a.json"
POSTRANK = ROOT / "benchmarks" / "configs" / "squad_postrank.toml"
MAX_BYTES = 200 * 2**20


def _kept() -> list[Path]:
    return [MODELS / n for n in KEPT if (MODELS / n).is_dir()]


def test_kept_models_match_their_manifest_and_fit_the_size_budget():
    kept = _kept()
    assert kept, "models/ holds no kept model"
    total = 0
    for folder in kept:
        assert verify_model(folder) is True, f"{folder} has no MANIFEST.sha256"
        total += sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and "funnel_onnx" not in f.parts)
    assert total <= MAX_BYTES, f"kept models take {total / 2**20:.0f} MiB, over the 200 MB budget"


def test_the_models_manifest_lists_and_matches_every_kept_file():
    listed = {line.split("  ", 1)[1] for line in (MODELS / "MANIFEST.sha256").read_text().splitlines() if line}
    kept = {f.relative_to(MODELS).as_posix() for folder in _kept() for f in folder.rglob("*")
            if f.is_file() and "funnel_onnx" not in f.parts} | {"README.md"}
    assert listed == kept
    assert verify_model(MODELS) is True


def test_each_card_names_a_funnel_train_command_whose_config_exists_and_trains_that_model():
    from funnel_core.train.runner import load_train_config

    for folder in _kept():
        card = read_card(folder)
        argv = shlex.split(card["command"])
        assert argv[:2] == ["funnel", "train"], card["command"]
        config = ROOT / argv[2]
        assert config.is_file(), f"{folder.name}: {config} (its recorded command) is missing"
        cfg = load_train_config(config)
        assert Path(cfg["train"]["output"]) == folder.resolve()
        assert cfg["train"]["kind"] == card["kind"]
        assert card["dataset"]["split"] == "train" and "dev" not in Path(card["dataset"]["path"]).name


@pytest.mark.slow
@pytest.mark.skipif(not DEV_A.is_file(), reason="needs ../shared/data/squad/squad-v1.1-dev-a.json")
def test_the_committed_squad_cross_encoder_still_reaches_its_recorded_ar1():
    """On 200 seeded questions of the published post-ranking run, re-score BM25 top-10 with the committed
    cross-encoder and compare with the AR@1 recorded for those questions (their bootstrap interval)."""
    from funnel_core.evaluation import Report
    from funnel_core.evaluation.config import build_systems, load_config
    from funnel_core.evaluation.datasets import load_dataset
    from funnel_core.evaluation.harness import evaluate
    from funnel_core.evaluation.stats import bootstrap_ci

    report = Report.load(ROOT / "benchmarks" / "results" / "squad_postrank").to_dict()
    recorded = {r["id"]: r["metrics"]["AR@1"] for r in report["per_question"]["bm25_ce"]}
    ids = set(random.Random(0).sample(sorted(recorded), 200))
    cfg = load_config(POSTRANK)
    full = load_dataset(DEV_A)
    dataset = type(full)(queries={q: full.queries[q] for q in full.question_ids if q in ids},
                         answers={q: full.answers[q] for q in full.question_ids if q in ids},
                         corpus=full.corpus, name=full.name, format=full.format)
    assert len(dataset.question_ids) == 200
    systems = build_systems({"bm25_ce": cfg["systems"]["bm25_ce"]}, dataset.corpus)
    now = evaluate(systems, dataset, metrics=["AR@1"], n_timing=0, progress=False,
                   cache_dir=None).summary["bm25_ce"]["AR@1"]["mean"]
    before = [recorded[q] for q in sorted(ids)]
    lo, hi = bootstrap_ci(before)
    assert lo <= now <= hi, (f"AR@1 {now:.3f} on the 200 questions; recorded {sum(before) / 200:.3f} "
                             f"[{lo:.3f}, {hi:.3f}] ({json.dumps(report['config']['systems']['bm25_ce'])})")
