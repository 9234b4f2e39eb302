"""The SHA-256 manifest of a model folder (``MANIFEST.sha256``, in the format ``sha256sum -c``
reads): written by ``funnel train`` (:mod:`funnel_core.train.card`), checked by
:func:`funnel_core.models.load_pretrained` for every local folder that has one, so a model whose
weights or tokenizer changed after training (a damaged download, a partial copy, another model's
file copied in) is refused instead of scoring silently with other weights. A folder without a
manifest (any ``save_pretrained`` folder, a hub download) loads as before.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from funnel_core.errors import ModelIntegrityError

__all__ = ["MANIFEST", "sha256_file", "model_files", "write_manifest", "verify_model"]

MANIFEST = "MANIFEST.sha256"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_files(folder: Path) -> list[Path]:
    """The files the manifest covers: every regular file of the folder tree except the manifest
    itself and caches that runtimes add later (``funnel_onnx/``, ``.cache``)."""
    skip_dirs = {"funnel_onnx", ".cache", "__pycache__"}
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
        for name in sorted(files):
            p = Path(root) / name
            if p.name == MANIFEST and p.parent == folder:
                continue
            if p.is_file() and not p.is_symlink():
                out.append(p)
    return out


def write_manifest(folder: str | os.PathLike) -> Path:
    """Write ``MANIFEST.sha256`` over every file of ``folder`` (last, after the card)."""
    folder = Path(folder)
    lines = [f"{sha256_file(p)}  {p.relative_to(folder).as_posix()}\n" for p in model_files(folder)]
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(folder / MANIFEST)
    return folder / MANIFEST


def verify_model(folder: str | os.PathLike) -> bool:
    """Check ``folder`` against its ``MANIFEST.sha256``.

    Returns ``False`` when the folder has no manifest (nothing to check), ``True`` when every
    listed file exists with the listed digest; raises :class:`ModelIntegrityError` naming the
    first file that is missing or differs, and the fix.
    """
    folder = Path(folder)
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return False
    for n, line in enumerate(manifest.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or name.startswith("/") or ".." in Path(name).parts:
            raise ModelIntegrityError(f"{manifest}:{n} is not a `<sha256>  <file>` line inside the folder: "
                                      f"{line!r}; re-create the model (funnel train) or restore the folder.")
        path = folder / name
        if not path.is_file():
            raise ModelIntegrityError(f"model folder {str(folder)!r}: {name!r} is listed in {MANIFEST} but "
                                      "missing; restore the folder (git checkout / copy it whole) or "
                                      "re-create it with the command in its funnel_model.json.")
        if sha256_file(path) != digest:
            raise ModelIntegrityError(f"model folder {str(folder)!r}: {name!r} does not match its SHA-256 in "
                                      f"{MANIFEST} (changed, damaged or replaced after training); restore "
                                      "the folder or re-create it with the command in its funnel_model.json.")
    return True
