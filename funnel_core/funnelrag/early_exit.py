"""Early exit from the funnel when the pre-ranker is confident (ours, not the paper's).

FunnelRAG always runs its most expensive stage, the post-ranker, on the passages the pre-ranker
kept. When the pre-ranker's best document leads the next one by a wide margin, the post-ranker
rarely changes which document comes first; :class:`ConfidentExit` skips it for such a query and
passes the passages on in the pre-ranker's order. The margin is a setting to tune on training
questions (``funnel eval``: ``tune = { exit_margin = [...] }``): ``0`` always skips (a funnel
without a post-ranker), ``inf`` never skips (the plain funnel).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from funnel_core.funnel import Stage
from funnel_core.units import Unit

__all__ = ["ConfidentExit", "lead_margin"]


def lead_margin(units: Sequence[Unit]) -> float:
    """How far the best document leads the next one: the best score minus the best score of
    another document. A unit counts for its parent (``parent_id``; later chunking gives every
    passage its document's score), so the passages of one document count once. ``inf`` when the
    units come from fewer than two documents (nothing competes); ``-inf`` when there are none."""
    best: dict[str, float] = {}
    for u in units:
        if u.score is None:
            raise ValueError(f"unit {u.id!r} has no score: ConfidentExit reads the previous stage's scores, "
                             "so put it after a ranking stage (the pre-ranker, then later chunking).")
        key = u.parent_id if u.parent_id is not None else u.id
        best[key] = max(best.get(key, -math.inf), float(u.score))
    if not best:
        return -math.inf
    top = sorted(best.values(), reverse=True)
    return math.inf if len(top) < 2 else top[0] - top[1]


class ConfidentExit(Stage):
    """Run ``stage`` only when the incoming best document leads the next by less than ``margin``.

    Put it where the post-ranker goes (after the pre-ranker and later chunking): a query whose
    best pre-ranked document leads by ``>= margin`` (:func:`lead_margin`) keeps the incoming
    order and scores, and ``stage`` is never called for it (no model work, nothing counted).
    ``stage % k`` and ``ConfidentExit(...) % k`` both cap what comes out, on either path.

    Args:
        stage: The stage to skip when confident (the post-ranker).
        margin: Score lead in the previous stage's units (the pre-ranker's scale: logits for a
            cross-encoder); ``0`` always skips, ``math.inf`` never does.
        name: Trace name (default: the inner stage's).
    """

    def __init__(self, stage: Stage, margin: float, *, name: str | None = None) -> None:
        if not isinstance(stage, Stage):
            raise TypeError(f"ConfidentExit wraps a funnel_core Stage (the post-ranker), got {type(stage).__name__}.")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or math.isnan(margin) or margin < 0:
            raise ValueError(f"margin must be a number >= 0 (0: always skip the stage; inf: never), got {margin!r}.")
        self.stage = stage
        self.margin = float(margin)
        self.name = name or stage.name
        self.level = stage.level

    def confident(self, units: Sequence[Unit]) -> bool:
        """Does the best document lead by at least ``margin``?"""
        return bool(units) and lead_margin(units) >= self.margin

    def _exit(self, units: list[Unit]) -> list[Unit]:
        cap = self.stage.limit(getattr(self.stage, "top_n", None))
        return units[:cap] if cap is not None else units

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._exit(units) if self.confident(units) else self.stage(query, units)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._exit(units) if self.confident(units) else await self.stage.acall(query, units)

    def warm_up(self) -> "ConfidentExit":
        self.stage.warm_up()
        return self

    def no_query(self, items: Sequence[Any]) -> list[Any]:
        out = self.stage.no_query(items)
        return out[: self.cutoff] if self.cutoff is not None else out

    def __repr__(self) -> str:
        cut = f" % {self.cutoff}" if self.cutoff is not None else ""
        return f"ConfidentExit({self.stage!r}, margin={self.margin:g}){cut}"
