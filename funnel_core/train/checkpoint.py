"""Resumable training: the model, optimiser and schedule saved every few minutes, and read back.

A training loop that takes a :class:`Checkpointer` saves ``<folder>/checkpoint.pt`` (written to a
temporary file and renamed over the old one, so a run killed while saving keeps the previous
checkpoint) at most every ``every_seconds``, and on start loads it when it exists: the loop then
skips the optimiser steps already taken (its batch order is a function of the seed, so the same
steps are skipped) and continues with the saved weights, optimiser moments, learning-rate schedule
and loss curve. Dropout's random stream is not restored: a resumed run is not bit-identical to an
uninterrupted one, only equivalent.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Checkpointer"]

FILE = "checkpoint.pt"


class Checkpointer:
    """Save and resume a training loop's state in ``folder``.

    Args:
        folder: Where ``checkpoint.pt`` lives (``funnel train`` uses ``<output>.partial/``).
        every_seconds: Minimum seconds between two saves (``None``: only :meth:`save` with
            ``force=True``).
        fingerprint: What the run depends on (settings, data digest); a checkpoint written by a
            run with another fingerprint is refused instead of resumed.
    """

    def __init__(self, folder: str | os.PathLike, *, every_seconds: float | None = 600.0,
                 fingerprint: str = "") -> None:
        self.folder = Path(folder)
        self.every_seconds = every_seconds
        self.fingerprint = fingerprint
        self._last = time.monotonic()

    @property
    def path(self) -> Path:
        return self.folder / FILE

    def load(self, model: Any, optimizer: Any, scheduler: Any) -> dict[str, Any] | None:
        """Restore the saved state into ``model``/``optimizer``/``scheduler``; return the loop's
        own state (``step``, ``losses``, ...) or ``None`` when there is no checkpoint."""
        import torch

        if not self.path.is_file():
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=True)  # tensors, numbers, lists, dicts only
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(f"{self.path} was written by a run with other settings or data "
                             f"({state.get('fingerprint')!r}, this run {self.fingerprint!r}); delete the "
                             "folder to start afresh, or run the original configuration to resume it.")
        model.load_state_dict(state["model"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        loop: dict[str, Any] = state["loop"]
        return loop

    def save(self, model: Any, optimizer: Any, scheduler: Any, loop: dict[str, Any], *,
             force: bool = False) -> bool:
        """Save when ``every_seconds`` have passed since the last save (or ``force``)."""
        import torch

        if not force and (self.every_seconds is None
                          or time.monotonic() - self._last < self.every_seconds):
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        weights = {n: t for n, t in model.state_dict().items() if n in trainable}
        tmp = self.path.with_suffix(".tmp")
        torch.save({"fingerprint": self.fingerprint, "model": weights,
                    "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "loop": loop}, tmp)
        tmp.replace(self.path)
        self._last = time.monotonic()
        return True

    def clear(self) -> None:
        """Remove the checkpoint (after the finished model is saved)."""
        for p in (self.path, self.path.with_suffix(".tmp")):
            if p.exists():
                p.unlink()
