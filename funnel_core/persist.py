"""Persistence helpers shared by every index: atomic folder writes, JSONL units, manifests."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from funnel_core.errors import PersistError
from funnel_core.units import Unit

__all__ = ["atomic_dir", "write_units", "read_units", "write_manifest", "read_manifest"]


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces ``path`` in one rename.

    If the body raises (or the process dies), ``path`` keeps its previous content: a crash
    during a save never corrupts an existing index.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            backup = path.with_name(f".{path.name}.old-{os.getpid()}")
            shutil.rmtree(backup, ignore_errors=True)
            os.rename(path, backup)
            os.rename(tmp, path)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.rename(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_units(path: Path, units: Sequence[Unit]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for u in units:
            f.write(json.dumps(u.to_dict(), ensure_ascii=False) + "\n")


def read_units(path: Path) -> list[Unit]:
    with open(path, encoding="utf-8") as f:
        return [Unit.from_dict(json.loads(line)) for line in f if line.strip()]


def write_manifest(folder: Path, fmt: str, version: int, **fields: Any) -> None:
    manifest = {"format": fmt, "version": version, **fields}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def read_manifest(folder: str | os.PathLike, fmt: str, what: str) -> dict[str, Any]:
    """Read ``folder/manifest.json`` and check its format; raise :class:`PersistError` otherwise."""
    folder = Path(folder)
    f = folder / "manifest.json"
    if not f.is_file():
        raise PersistError(
            f"no {what} at {str(folder)!r} (missing manifest.json); build one and save/persist "
            "it there first, or check the folder name."
        )
    try:
        manifest = json.loads(f.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise PersistError(f"the {what} at {str(folder)!r} has a corrupt manifest.json ({exc}); "
                           "rebuild it and save it again.") from exc
    if manifest.get("format") != fmt:
        raise PersistError(f"{str(folder)!r} holds {manifest.get('format')!r}, not a {what} "
                           f"({fmt!r}); point to the folder you saved the {what} in.")
    return manifest
