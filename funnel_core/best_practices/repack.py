"""Repacking from "Searching for Best Practices in Retrieval-Augmented Generation" (section 3.6):
the order of the final context. ``"forward"`` (best first), ``"reverse"`` (best last, next to the
question: the paper's recommendation and our default) and ``"sides"`` (the best units at both
ends, the weakest in the middle: "lost in the middle")."""

from __future__ import annotations

from typing import Sequence

from funnel_core.errors import check_query
from funnel_core.funnel import Stage
from funnel_core.settings import Settings
from funnel_core.units import Unit

__all__ = ["REPACK_ORDERS", "Repack", "repack"]

REPACK_ORDERS = ("forward", "reverse", "sides")


def repack(units: Sequence[Unit], order: str = "reverse") -> list[Unit]:
    """Reorder units that arrive best first (section 3.6 of the paper).

    * ``"forward"``: best first (unchanged);
    * ``"reverse"``: best last, nearest to the question in the prompt (the paper's choice);
    * ``"sides"``: ranks 1, 3, 5, ... from the front and 2, 4, 6, ... from the back, so the best
      units sit at both ends and the weakest in the middle.

    Every unit gets ``funnel["repack_position"]`` (its new 0-based position) and
    ``funnel["retrieval_rank"]`` (its rank on arrival). Scores are unchanged.
    """
    if order not in REPACK_ORDERS:
        raise ValueError(f"unknown repack order {order!r}; choose one of {REPACK_ORDERS}.")
    ranked = [u.copy() for u in units]
    for rank, u in enumerate(ranked):
        u.funnel["retrieval_rank"] = rank
    if order == "forward":
        out = ranked
    elif order == "reverse":
        out = ranked[::-1]
    else:
        out = ranked[0::2] + ranked[1::2][::-1]
    for pos, u in enumerate(out):
        u.funnel["repack_position"] = pos
    return out


class Repack(Settings, Stage):
    """Repacking stage: ``"forward"``, ``"reverse"`` (default, best last) or ``"sides"``.

    Args:
        order: ``"forward"``, ``"reverse"`` (best last, next to the question) or ``"sides"``.
        name: Stage name in traces (``None``: ``"repack"``).

    Put it last in a funnel, after any cut-off: it changes the order, not the set. A cut-off
    ``Repack(...) % k`` keeps the ``k`` best units (cut before reordering).
    """

    def __init__(self, order: str = "reverse", *, name: str | None = None) -> None:
        if order not in REPACK_ORDERS:
            raise ValueError(f"unknown repack order {order!r}; choose one of {REPACK_ORDERS}.")
        self.order, self.name = order, name or "repack"

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return repack(units[: self.cutoff] if self.cutoff else units, self.order)

    def __call__(self, query: str, units: Sequence[Unit] | None = None) -> list[Unit]:
        query = check_query(query)
        if not query:
            return self.no_query(units or [])  # as every stage: the order kept, the cut-off applied
        return self.run(query, list(units or []))  # the cut-off is applied before reordering

    async def acall(self, query: str, units: Sequence[Unit] | None = None) -> list[Unit]:
        return self(query, units)
