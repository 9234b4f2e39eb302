"""The trained models the benchmarks read, and the `funnel train` command that makes each.

Every model comes from a recipe under ``benchmarks/train/`` (``funnel train benchmarks/train/<name>.toml``;
the model folder holds ``funnel_model.json``, its card). A script that needs a missing model stops
with :func:`require_model`, which names that command. Also here: the SQuAD files of the large
corpus, the seeded sample of train questions ``bench_squad_large.py`` tunes on, and the float32
SmolLM2 folder the RankRAG benchmark compares against.
"""

from __future__ import annotations

import random
from pathlib import Path

from common import ROOT, default_data_dir

MODELS = ROOT / "models"
#: model folder -> its recipe in benchmarks/train/
RECIPES = {"minilm-squad-ce": "squad_ce", "minilm-squad-fid": "squad_fid", "minilm-scifact-ce": "scifact_ce",
           "rankrag-smollm2-135m": "squad_rankrag"}
SQUAD_CE = MODELS / "minilm-squad-ce"
SCIFACT_CE = MODELS / "minilm-scifact-ce"
RANKRAG = MODELS / "rankrag-smollm2-135m"
#: the large SQuAD corpus: every article of SQuAD v1.1 train + dev-a (squad_large_data.build_corpus)
SQUAD_FILES = [default_data_dir() / "squad" / "squad-v1.1-train.json",
               default_data_dir() / "squad" / "squad-v1.1-dev-a.json"]
#: the tuning sample of bench_squad_large.py: SQuAD train questions (seed 0, 400 of them)
TUNE_SEED, TUNE_N = 0, 400
SMOLLM2_FP32 = MODELS / "smollm2-135m-instruct-fp32"


def train_command(model: str | Path) -> str:
    """``funnel train benchmarks/train/<recipe>.toml`` for a model folder (or its name)."""
    return f"funnel train benchmarks/train/{RECIPES[Path(model).name]}.toml"


def is_trained(folder: str | Path) -> bool:
    """Whether ``folder`` holds a finished model (its ``config.json``; ``funnel train`` installs a
    folder only when the model is complete)."""
    return (Path(folder) / "config.json").is_file()


def require_model(folder: str | Path, what: str = "model") -> Path:
    """``folder`` when it holds a model; otherwise stop, naming the command that makes it."""
    folder = Path(folder)
    if is_trained(folder):
        return folder
    how = (f"make it with `{train_command(folder)}`" if folder.name in RECIPES
           else "pass the folder of a trained model")
    raise SystemExit(f"{folder} is missing: the {what}; {how}.")


def tuning_question_ids(train_questions) -> set[str]:
    """Ids of the seeded sample of train questions the large-corpus benchmarks tune on."""
    rng = random.Random(TUNE_SEED)
    return {q.id for q in rng.sample(train_questions, min(TUNE_N, len(train_questions)))}


def smollm2_fp32() -> Path:
    """SmolLM2-135M-Instruct as a float32 ``save_pretrained`` folder under ``models/``, dequantised
    from the packaged GGUF on first use (minutes on a busy CPU)."""
    if (SMOLLM2_FP32 / "config.json").exists():
        return SMOLLM2_FP32
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from funnel_core.testing import SMOLLM2_GGUF, smollm2_path

    tok = AutoTokenizer.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    model.hf_quantizer = None                       # the weights are dequantised float32 now
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(SMOLLM2_FP32)
    tok.save_pretrained(SMOLLM2_FP32)
    return SMOLLM2_FP32
