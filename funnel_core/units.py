"""The one data flow: :class:`Unit` (a scored piece of text) and the :class:`Trace` of a funnel.

Every stage of every paper in this package has the same shape::

    stage(query: str, units: list[Unit]) -> list[Unit]

A stage never mutates the units it receives: it returns copies (see :meth:`Unit.rescored`),
keeps the previous score under ``metadata["scores"][previous_stage]`` and writes its own as a
Python ``float`` in :attr:`Unit.score`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

__all__ = ["Unit", "StageRecord", "Trace", "as_float", "FUNNEL_KEY", "INTERNAL_KEYS",
           "split_metadata", "framework_metadata", "text_digest", "units_from_texts"]

#: The one metadata key under which the adapters put funnel-rag's bookkeeping on a framework
#: object (a LlamaIndex node, a LangChain ``Document``); the user's own keys are never touched.
FUNNEL_KEY = "funnel"

#: Metadata keys written by ``funnel_core`` stages (scores, ranks, structure). At the framework
#: boundary they go under :data:`FUNNEL_KEY`, whatever the user's metadata holds.
INTERNAL_KEYS = frozenset({
    "scores", "score", "level", "parent_id", "funnel_trace", "bm25_rank", "cluster_id",
    "cluster_score", "cluster_rank", "document_score", "parent_score", "parent_level", "position",
    "members",
    "router_weights", "chosen_level", "finest_id", "forward_scores", "backward_scores", "samples",
    "fb_rag_order", "retrieval_rank", "repack_position", "graph_neighbors", "graph_weights",
    "granularity", "child_ids", "doc_index", "fid_answer", "compression",
})


def text_digest(text: "str | Iterable[str]", n: int = 12) -> str:
    """A short stable hex digest of a text (or texts): ids that differ between contexts."""
    import hashlib

    h = hashlib.sha1()
    for t in [text] if isinstance(text, str) else text:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:n]


def split_metadata(metadata: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A framework object's metadata -> (the user's keys, our bookkeeping under FUNNEL_KEY)."""
    ours = metadata.get(FUNNEL_KEY)
    user = {k: v for k, v in metadata.items() if k != FUNNEL_KEY}
    return user, dict(ours) if isinstance(ours, dict) else {}


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:  # e.g. numpy arrays
        return False


def framework_metadata(unit: "Unit", base: dict[str, Any] | None) -> tuple[dict[str, Any],
                                                                             dict[str, Any]]:
    """Split a unit's metadata for a framework object: ``(user, ours)``.

    ``base`` is the metadata of the framework object the unit came from (or of its parent, for
    a unit cut from it): the user's keys are exactly its keys (our namespace removed), never
    changed; ``ours`` holds every key a stage wrote (an :data:`INTERNAL_KEYS` key, a new key, or
    a changed value) plus ``level`` and ``parent_id``. Without a ``base``, the user's keys are
    the unit's keys outside :data:`INTERNAL_KEYS`.
    """
    if base is None:
        user = {k: v for k, v in unit.metadata.items() if k not in INTERNAL_KEYS and k != FUNNEL_KEY}
    else:
        user = split_metadata(base)[0]
    ours = {k: v for k, v in unit.metadata.items()
            if k != FUNNEL_KEY and (k in INTERNAL_KEYS or k not in user or not _same(user[k], v))}
    ours["level"] = unit.level
    if unit.parent_id is not None:
        ours["parent_id"] = unit.parent_id
    return dict(user), ours


def as_float(value: Any) -> float:
    """Convert numpy / torch scalars to a plain Python float (JSON-safe)."""
    if hasattr(value, "item"):
        value = value.item()
    return float(value)


@dataclass
class Unit:
    """A retrieval unit at any granularity (cluster, document, passage, or a MoG level).

    Attributes:
        id: Unique id of the unit within its corpus.
        text: The text the models read.
        score: The score the latest stage gave (``None`` before any stage scored it).
        metadata: Free-form metadata; ``metadata["scores"]`` holds the history of scores by stage.
        parent_id: Id of the coarser unit this one was cut from (set by later chunking).
        level: Granularity name: ``"cluster"``, ``"document"``, ``"passage"`` or a MoG level.
        source: The framework object (LlamaIndex node, LangChain ``Document``) the unit was made
            from, so an adapter can hand back a copy of the user's own object. Opaque to the
            core, never serialised (not in :meth:`to_dict`), not compared.
    """

    id: str
    text: str
    score: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    parent_id: str | None = None
    level: str = "passage"
    source: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            if self.id is None:  # str(None) == "None" would collide, and delete([None]) hit it
                raise TypeError("Unit.id is None; give every unit a unique id (a str, or an int "
                                "that is turned into one), e.g. Unit(id='doc-1', text=...).")
            self.id = str(self.id)
        if not isinstance(self.text, str):
            raise TypeError(
                f"Unit.text must be a str, got {type(self.text).__name__} for unit id={self.id!r}; "
                "convert non-text content to a string before building units."
            )
        if self.score is not None:
            self.score = as_float(self.score)

    def copy(self) -> "Unit":
        """A copy whose metadata can be changed without touching the original."""
        return Unit(
            id=self.id,
            text=self.text,
            score=self.score,
            metadata=copy.deepcopy(self.metadata),
            parent_id=self.parent_id,
            level=self.level,
            source=self.source,
        )

    def rescored(self, score: float, stage: str) -> "Unit":
        """A copy with ``score`` set by ``stage``; the old score is kept in ``metadata["scores"]``.

        ``metadata["scores"][stage]`` receives the new score too, so the full history of a unit
        through a funnel is readable from its metadata.
        """
        new = self.copy()
        new.score = as_float(score)
        new.metadata.setdefault("scores", {})[stage] = new.score
        return new

    @property
    def scores(self) -> dict[str, float]:
        """Scores by stage name, oldest first."""
        return self.metadata.get("scores", {})

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "score": self.score,
            "metadata": self.metadata,
            "parent_id": self.parent_id,
            "level": self.level,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Unit":
        return cls(
            id=data["id"],
            text=data["text"],
            score=data.get("score"),
            metadata=dict(data.get("metadata") or {}),
            parent_id=data.get("parent_id"),
            level=data.get("level", "passage"),
        )


def units_from_texts(texts: Iterable[str], ids: Sequence[Any] | None = None,
                     metadatas: Sequence[dict] | None = None, level: str = "passage") -> list[Unit]:
    """Plain strings -> units (ids default to ``"0"``, ``"1"``, ...; each metadata dict copied):
    what every index's and retriever's ``from_texts`` builds."""
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, got a single str; wrap it in a list.")
    texts = list(texts)
    ids = [str(i) for i in range(len(texts))] if ids is None else list(ids)
    metadatas = [{} for _ in texts] if metadatas is None else list(metadatas)
    if not len(ids) == len(metadatas) == len(texts):
        raise ValueError(f"texts ({len(texts)}), ids ({len(ids)}) and metadatas "
                         f"({len(metadatas)}) must have the same length.")
    return [Unit(id=i, text=t, metadata=dict(m), level=level) for i, t, m in zip(ids, texts, metadatas)]


def check_unique_ids(units: Iterable[Unit]) -> None:
    """Raise ``ValueError`` naming the first id that occurs twice."""
    seen: set[str] = set()
    for unit in units:
        if unit.id in seen:
            raise ValueError(
                f"duplicate unit id {unit.id!r}: every unit in a corpus needs a unique id "
                "(pass ids explicitly, or leave them out to have ids generated)."
            )
        seen.add(unit.id)


@dataclass
class StageRecord:
    """What one stage did to one query: its name, units in and out, seconds, and answer recall."""

    name: str
    units_in: int
    units_out: int
    seconds: float
    level: str | None = None
    answer_recall: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "units_in": self.units_in,
            "units_out": self.units_out,
            "seconds": self.seconds,
            "level": self.level,
            "answer_recall": self.answer_recall,
        }


@dataclass
class Trace:
    """The record of a funnel run: one :class:`StageRecord` per stage, in order."""

    query: str = ""
    stages: list[StageRecord] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return math.fsum(r.seconds for r in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "seconds": self.seconds, "stages": [r.to_dict() for r in self.stages]}

    def format(self) -> str:
        """A small fixed-width table, for printing."""
        lines = [f"{'stage':<28}{'in':>8}{'out':>8}{'ms':>10}{'AR':>8}"]
        for r in self.stages:
            ar = "" if r.answer_recall is None else f"{r.answer_recall:.2f}"
            lines.append(f"{r.name:<28}{r.units_in:>8}{r.units_out:>8}{r.seconds * 1000:>10.1f}{ar:>8}")
        lines.append(f"{'total':<28}{'':>8}{'':>8}{self.seconds * 1000:>10.1f}")
        return "\n".join(lines)

    def __str__(self) -> str:  # pragma: no cover - convenience
        return self.format()
