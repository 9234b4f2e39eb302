"""The trained models the benchmarks read, and the `funnel train` command that makes each.

Every model comes from a recipe under ``benchmarks/train/`` (``funnel train benchmarks/train/<name>.toml``;
the model folder holds ``funnel_model.json``, its card). A script that needs a missing model stops
with :func:`require_model`, which names that command.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import ROOT

MODELS = ROOT / "models"
#: model folder -> its recipe in benchmarks/train/
RECIPES = {"minilm-squad-ce": "squad_ce", "minilm-squad-fid": "squad_fid", "minilm-scifact-ce": "scifact_ce",
           "rankrag-smollm2-135m": "squad_rankrag"}
SQUAD_CE = MODELS / "minilm-squad-ce"
SCIFACT_CE = MODELS / "minilm-scifact-ce"


def require_model(folder: str | Path, what: str = "model") -> Path:
    """``folder`` when it holds a finished model (its ``config.json``: ``funnel train`` installs a folder
    only when the model is complete); otherwise stop, naming the command that makes it."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    how = (f"make it with `funnel train benchmarks/train/{RECIPES[folder.name]}.toml`" if folder.name in RECIPES
           else "pass the folder of a trained model")
    raise SystemExit(f"{folder} is missing: the {what}; {how}.")


def training_summary(model: Path) -> dict:
    """The training facts of a model folder's ``summary.json`` (the former squad_ce_model.py wrote one)."""
    f = model / "summary.json"
    s = json.loads(f.read_text()) if f.is_file() else {}
    return {k: s.get(k) for k in ("steps", "train_seconds", "train_questions_sampled", "groups", "dtype",
                                  "loss_first50", "loss_last50", "negative_depth", "stopped_early")} if s else {}
