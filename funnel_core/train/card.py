"""What a trained model folder holds besides its weights: the model card and the SHA-256 manifest.

Every folder ``funnel train`` writes is a plain ``save_pretrained`` folder (safetensors weights,
tokenizer, config) plus two files of ours:

* ``funnel_model.json``, the model card: what the model is (``kind``), what it started from
  (``base_model``), the data it saw (dataset path, format, split and fingerprint), the whole
  configuration, the command that re-creates it, the steps, the loss curve, the seconds, the
  device and dtype it trained with, the package version and the held-out metrics it reached;
* ``MANIFEST.sha256``, one ``<sha256>  <file>`` line per file of the folder, in the format
  ``sha256sum -c`` reads.

:func:`verify_model` checks a folder against its manifest; :func:`funnel_core.models.load_pretrained`
calls it for every local folder that has one, so a model whose weights or tokenizer changed after
training (a damaged download, a partial copy, another model's file copied in) is refused instead
of scoring silently with other weights. A folder without a manifest (any ``save_pretrained``
folder, a hub download) loads as before.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from funnel_core.errors import ModelIntegrityError
from funnel_core.manifest import MANIFEST, verify_model, write_manifest
from funnel_core.version import __version__

__all__ = ["CARD", "MANIFEST", "write_manifest", "verify_model", "write_card", "read_card",
           "save_half", "ModelIntegrityError"]

CARD = "funnel_model.json"
CARD_FORMAT = 1


def write_card(folder: str | os.PathLike, card: dict[str, Any]) -> Path:
    """Write the model card (``funnel_model.json``), adding the format, package version and date."""
    folder = Path(folder)
    full = {"format": CARD_FORMAT, "package_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **card}
    tmp = folder / (CARD + ".tmp")
    tmp.write_text(json.dumps(full, indent=1, default=_jsonable) + "\n", encoding="utf-8")
    tmp.replace(folder / CARD)
    return folder / CARD


def read_card(folder: str | os.PathLike) -> dict[str, Any]:
    """The model card of a folder ``funnel train`` wrote."""
    path = Path(folder) / CARD
    if not path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no {CARD}; it was not written by `funnel train`.")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _jsonable(v: Any) -> Any:
    if isinstance(v, os.PathLike):
        return str(v)
    if hasattr(v, "item"):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


def save_half(model: Any, tokenizer: Any, folder: str | os.PathLike) -> None:
    """Save ``model`` with float16 weights (safetensors) and ``tokenizer`` into ``folder``.

    The loaders of this package upcast to the dtype the hardware runs well (float32 on CPUs), so
    float16 only halves what is stored and shipped. Weights whose values float16 cannot hold
    (beyond +-65504) are refused rather than saved as infinities.
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, p in model.state_dict().items():
        if p.is_floating_point() and p.numel() and float(p.detach().abs().max()) > 65504:
            raise ValueError(f"weight {name!r} exceeds the float16 range; it cannot be kept as float16.")
    half = model.to(torch.float16)
    try:
        half.save_pretrained(folder, safe_serialization=True)
    finally:
        model.to(torch.float32)
    tokenizer.save_pretrained(folder)
