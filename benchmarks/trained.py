"""The trained models the benchmarks read: each comes from a recipe under ``benchmarks/train/``
(``funnel train benchmarks/train/<name>.toml``), and its folder holds its card ``funnel_model.json``.
A script that needs a missing model stops with :func:`require_model`, which names that command.
"""

from __future__ import annotations

from pathlib import Path

from common import ROOT

from funnel_core.evaluation.config import toml_module
from funnel_core.train.card import read_card

MODELS = ROOT / "models"
SQUAD_CE = MODELS / "minilm-squad-ce"
SCIFACT_CE = MODELS / "minilm-scifact-ce"


def recipe(folder: Path) -> Path | None:
    """The recipe under ``benchmarks/train/`` whose ``[train] output`` is a folder named like ``folder``."""
    recipes = sorted((ROOT / "benchmarks" / "train").glob("*.toml"))
    return next((r for r in recipes if Path(toml_module().loads(r.read_text(encoding="utf-8"))["train"]["output"])
                 .name == Path(folder).name), None)


def require_model(folder: str | Path, what: str = "model") -> Path:
    """``folder`` when it holds a finished model (its ``config.json``: ``funnel train`` installs a folder
    only when the model is complete); otherwise stop, naming the command that makes it."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    r = recipe(folder)
    how = f"make it with `funnel train {r.relative_to(ROOT)}`" if r else "pass the folder of a trained model"
    raise SystemExit(f"{folder} is missing: the {what}; {how}.")


def training_facts(model: Path) -> dict:
    """What a model's card (``funnel_model.json``) says of its training ({} without a card)."""
    try:
        c = read_card(model)
    except FileNotFoundError:
        return {}
    return {k: c.get(k) for k in ("command", "created", "steps", "train_seconds", "groups", "dtype",
                                  "stopped_early", "held_out_metrics")}
