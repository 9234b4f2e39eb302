"""FunnelRAG's "later chunking" (section 3.1.3): cut coarse units (clusters, documents) into finer
ones after a stage has ranked them, and open clusters back into their documents."""

from __future__ import annotations

from typing import Sequence

from funnel_core.errors import check_positive_int
from funnel_core.funnel import Stage
from funnel_core.settings import Settings
from funnel_core.text import word_windows
from funnel_core.units import Unit

__all__ = ["LaterChunking", "OpenClusters"]


class LaterChunking(Settings, Stage):
    """FunnelRAG's "later chunking": split every input unit into ~``words``-word units.

    Each child gets ``parent_id`` = the parent's id, ``metadata["parent_score"]`` = the parent's
    score, ``metadata["position"]`` = its index within the parent, and a copy of the parent's
    metadata. Children are emitted parent by parent, in the parent's rank order, and inherit the
    parent's score so that a cut-off right after this stage is meaningful.

    Args:
        words: Target window size in words (the paper's passages are ~100 words).
        overlap: Words repeated between consecutive windows.
        level: Granularity name written on the children.
        sentence_aware: End windows at sentence boundaries.
    """

    def __init__(self, words: int = 100, *, overlap: int = 0, level: str = "passage",
                 sentence_aware: bool = True, name: str | None = None) -> None:
        check_positive_int(words, "words")
        word_windows("probe", words, overlap)  # validates overlap early
        self.words = words
        self.overlap = overlap
        self.level: str = level
        self.sentence_aware = sentence_aware
        self._name = name

    setting_attrs = {"name": "_name"}

    @property  # type: ignore[override]
    def name(self) -> str:
        """The stage name: ``name``, or ``later_chunking(<words>w)`` (following edits)."""
        return self._name or f"later_chunking({self.words}w)"

    @name.setter
    def name(self, value: str | None) -> None:
        self._name = value

    def split(self, unit: Unit) -> list[Unit]:
        """The children of one unit."""
        children = []
        for i, text in enumerate(word_windows(unit.text, self.words, self.overlap,
                                              self.sentence_aware)):
            meta = {k: v for k, v in unit.metadata.items() if k not in ("scores", "funnel_trace")}
            meta["scores"] = dict(unit.scores)
            meta["parent_score"] = unit.score
            meta["parent_level"] = unit.level
            meta["position"] = i
            children.append(Unit(id=f"{unit.id}#{i}", text=text, score=unit.score, metadata=meta,
                                 parent_id=unit.id, level=self.level))
        return children

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return [child for unit in units for child in self.split(unit)]


class OpenClusters(Stage):
    """Open cluster units into their member documents (FunnelRAG 3.1.1 -> 3.1.2).

    A cluster unit lists its members' ids in ``metadata["members"]``; ``lookup`` maps an id to the
    document :class:`Unit`. Each document keeps the cluster's id, score and rank in its metadata
    (``cluster_id``, ``cluster_score``, ``cluster_rank``) and inherits the cluster score.
    """

    def __init__(self, lookup: "dict[str, Unit] | Sequence[Unit]", level: str = "document",
                 name: str = "open_clusters") -> None:
        if not isinstance(lookup, dict):
            lookup = {u.id: u for u in lookup}
        self.lookup = lookup
        self.level = level
        self.name = name

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        out: list[Unit] = []
        for rank, cluster in enumerate(units):
            for member in cluster.metadata.get("members", []):
                doc = self.lookup[member].copy()
                doc.parent_id = cluster.id
                doc.score = cluster.score
                doc.metadata.setdefault("scores", {}).update(cluster.scores)
                doc.metadata.update(cluster_id=cluster.id, cluster_score=cluster.score,
                                    cluster_rank=rank)
                out.append(doc)
        return out
