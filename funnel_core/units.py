"""The one data flow: :class:`Unit` (a scored piece of text) and the :class:`Trace` of a funnel.

Every stage of every paper in this package has the same shape::

    stage(query: str, units: list[Unit]) -> list[Unit]

A stage never mutates the units it receives: it returns copies (see :meth:`Unit.rescored`),
records its score in :attr:`Unit.funnel` (``funnel["score_<stage>"]``, so the history of a unit
stays readable) and writes it as a Python ``float`` in :attr:`Unit.score`.

:attr:`Unit.metadata` is the user's: no stage writes it. Everything a stage records about a unit
(scores by stage, ranks, cluster, position, structure) goes into :attr:`Unit.funnel`, which the
adapters write as flat ``funnel_...`` keys (:func:`funnel_metadata`).
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["Unit", "StageRecord", "Trace", "as_float", "FUNNEL_PREFIX", "SCORE_PREFIX",
           "funnel_metadata", "read_funnel_metadata", "scored_by", "foreign_output", "REORDERED_BY",
           "copy_funnel", "text_digest", "units_from_texts", "keep_source_funnel_keys", "settled",
           "adopted", "unit_of"]

#: Prefix of every metadata key the adapters write on a framework object (a LlamaIndex node, a
#: LangChain ``Document``): ``funnel_level``, ``funnel_parent_id``, ``funnel_score_<stage>``,
#: ``funnel_cluster_rank``, ... The prefix is reserved; every other key is the user's and is
#: never written, moved or deleted.
FUNNEL_PREFIX = "funnel_"

#: Prefix of a stage's score in :attr:`Unit.funnel` (``funnel["score_bm25"]``).
SCORE_PREFIX = "score_"

#: Suffix of a key whose value is a list or dict stored as JSON text on a framework object
#: (``funnel_graph_neighbors_json``), so flat-metadata stores keep it.
_JSON_SUFFIX = "_json"

_SCALARS = (str, bool, int, float)


def text_digest(text: "str | Iterable[str]", n: int = 12) -> str:
    """A short stable hex digest of a text (or texts): ids that differ between contexts."""
    import hashlib

    h = hashlib.sha1()
    for t in [text] if isinstance(text, str) else text:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:n]


def _scalar(value: Any) -> Any:
    """A numpy / torch scalar as a Python one; other values unchanged."""
    if value is not None and not isinstance(value, _SCALARS) and hasattr(value, "item"):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    return value


def funnel_metadata(unit: "Unit") -> dict[str, Any]:
    """A unit's bookkeeping as flat framework metadata: ``{"funnel_<key>": scalar}``.

    Always ``funnel_level`` (and ``funnel_parent_id`` for a unit cut from another); then every
    key of :attr:`Unit.funnel`: scalars (str, int, float, bool, None) as they are, lists and
    dicts as JSON text under ``funnel_<key>_json``. Nothing is nested, so flat-metadata vector
    stores (LlamaIndex ``node_to_metadata_dict(flat_metadata=True)``, LangChain
    ``filter_complex_metadata``) keep all of it. :func:`read_funnel_metadata` inverts it.
    """
    import json

    out: dict[str, Any] = {FUNNEL_PREFIX + "level": unit.level}
    if unit.parent_id is not None:
        out[FUNNEL_PREFIX + "parent_id"] = unit.parent_id
    for key, value in unit.funnel.items():
        value = _scalar(value)
        if value is None or isinstance(value, _SCALARS):
            out[FUNNEL_PREFIX + key] = value
        else:
            out[FUNNEL_PREFIX + key + _JSON_SUFFIX] = json.dumps(value, ensure_ascii=False,
                                                                 default=_json_default)
    return out


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} ({value!r:.60}) in Unit.funnel cannot be written as "
                    "framework metadata; stages write str, int, float, bool, None, lists or dicts.")


def read_funnel_metadata(metadata: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A framework object's metadata -> ``(user, funnel)``: the user's keys (every key without
    the ``funnel_`` prefix, untouched) and our bookkeeping, decoded (:func:`funnel_metadata`
    inverted; ``level`` and ``parent_id`` included)."""
    import json

    user: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    for key, value in metadata.items():
        if not (isinstance(key, str) and key.startswith(FUNNEL_PREFIX)):
            user[key] = value
            continue
        name = key[len(FUNNEL_PREFIX):]
        if name.endswith(_JSON_SUFFIX) and isinstance(value, str):
            try:
                ours[name[: -len(_JSON_SUFFIX)]] = json.loads(value)
                continue
            except ValueError:
                pass
        ours[name] = value
    return user, ours


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
        metadata: The user's metadata. Stages read it (titles, filters, links) and copy it onto
            units they cut from this one, but never write it.
        parent_id: Id of the coarser unit this one was cut from (set by later chunking).
        level: Granularity name: ``"cluster"``, ``"document"``, ``"passage"`` or a MoG level.
        funnel: The stages' bookkeeping, apart from the user's metadata: per-stage scores
            (``score_<stage>``, see :attr:`scores`), ranks, cluster, position, structure (MoG
            levels, graph neighbours). Values are scalars (str, int, float, bool, None), or
            lists/dicts of them for structure. Only stages write it.
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
    funnel: dict[str, Any] = field(default_factory=dict)

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
        """A copy whose metadata and bookkeeping can be changed without touching the original."""
        return Unit(
            id=self.id,
            text=self.text,
            score=self.score,
            metadata=copy.deepcopy(self.metadata),
            parent_id=self.parent_id,
            level=self.level,
            source=self.source,
            funnel=copy_funnel(self.funnel),
        )

    def rescored(self, score: float, stage: str) -> "Unit":
        """A copy with ``score`` set by ``stage``, also recorded as ``funnel["score_<stage>"]``
        (see :meth:`record_score`)."""
        new = self.copy()
        new.score = as_float(score)
        new.record_score(stage, new.score)
        return new

    def record_score(self, stage: str, score: float) -> str:
        """Record ``score`` under ``funnel["score_<stage>"]`` and return the key. A unit scored
        twice by stages of the same name (two cross-encoders in one funnel) keeps both:
        the second goes to ``score_<stage>_2``, the third to ``score_<stage>_3``."""
        key = SCORE_PREFIX + stage
        n = 1
        while key in self.funnel:
            n += 1
            key = f"{SCORE_PREFIX}{stage}_{n}"
        self.funnel[key] = as_float(score)
        return key

    @property
    def scores(self) -> dict[str, float]:
        """Scores by stage name (the ``score_`` keys of :attr:`funnel`), oldest first."""
        n = len(SCORE_PREFIX)
        return {k[n:]: v for k, v in self.funnel.items() if k.startswith(SCORE_PREFIX)}

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id,
            "text": self.text,
            "score": self.score,
            "metadata": self.metadata,
            "parent_id": self.parent_id,
            "level": self.level,
        }
        if self.funnel:
            d["funnel"] = self.funnel
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Unit":
        return cls(
            id=data["id"],
            text=data["text"],
            score=data.get("score"),
            metadata=dict(data.get("metadata") or {}),
            parent_id=data.get("parent_id"),
            level=data.get("level", "passage"),
            funnel=dict(data.get("funnel") or {}),
        )


def scored_by(unit: Unit, stage: str) -> Unit:
    """``unit`` as returned by a foreign stage (a framework retriever or reranker) named
    ``stage``: its score is recorded under ``stage`` unless the history already ends with it
    (one of our own stages inside recorded it under its own name), so a score is kept once."""
    if unit.score is None:
        return unit
    history = list(unit.scores.values())
    if history and history[-1] == unit.score:
        return unit
    return unit.rescored(unit.score, stage)


def settled(unit: Unit) -> Unit:
    """``unit`` as an adapter reads it back from the framework object it would become, without
    building that object.

    An index built from nodes or Documents that a splitter of ours made (MoG levels, graph
    nodes) stores their flat ``funnel_...`` keys in :attr:`Unit.metadata`; read back from a node
    or a ``Document`` they are bookkeeping: ``funnel_parent_id`` becomes :attr:`Unit.parent_id`
    where the unit has none of its own, the rest goes to :attr:`Unit.funnel` (the unit's own
    level and entries win). A funnel adapter applies this to
    what its retrievers return, so the next stage sees what it saw when every stage boundary was
    a framework object. A unit with no such key is returned as it is (not copied).
    """
    if not any(isinstance(k, str) and k.startswith(FUNNEL_PREFIX) for k in unit.metadata):
        return unit
    user, ours = read_funnel_metadata({**unit.metadata, **funnel_metadata(unit)})
    new = unit.copy()
    new.metadata = user
    new.level = str(ours.pop("level", "passage"))
    parent_id = ours.pop("parent_id", None)
    new.parent_id = None if parent_id is None else str(parent_id)
    new.funnel = ours
    return new


def keep_source_funnel_keys(owner: str, pairs: Iterable[tuple[Mapping[str, Any], dict]]) -> None:
    """The reserved-prefix rule of a splitter (``owner``) that makes pieces of documents.

    For each ``(source metadata, piece metadata)`` pair the piece gets the source's ``funnel_``
    keys the splitter does not write (in place; LlamaIndex's node parsers merge the same way),
    and the keys the splitter writes win (``None`` on a piece it leaves without one, so a
    source's structure never leaks onto the pieces). One warning per call names the source keys the pieces
    replaced with other values: the ``funnel_`` prefix is this package's namespace, so a user's
    ``funnel_level`` is not kept where a splitter writes its own.
    """
    pairs = list(pairs)
    # a key the splitter writes on some pieces (funnel_parent_id below the top level) is its
    # structure on every piece: where a piece has none, it gets None, not the source's value
    written = {k for _, piece in pairs for k in piece if k.startswith(FUNNEL_PREFIX)}
    replaced: set[str] = set()
    for source, piece in pairs:
        for key, value in source.items():
            if isinstance(key, str) and key.startswith(FUNNEL_PREFIX):
                if key not in piece:
                    piece[key] = None if key in written else value
                if piece[key] != value:
                    replaced.add(key)
    if replaced:
        warnings.warn(
            f"{owner}: the source documents carry {sorted(replaced)}, which {owner} writes itself "
            "on the pieces it makes (the funnel_ prefix is this package's metadata namespace), "
            "so the pieces carry its values, not yours. Rename your keys (without the funnel_ "
            "prefix) to keep them.", UserWarning, stacklevel=3)


#: Bookkeeping key (``funnel_reordered_by`` on a framework object) naming the foreign stage that
#: reordered units without scoring them (see :func:`foreign_output`).
REORDERED_BY = "reordered_by"


def foreign_output(before: Sequence[Unit], after: Sequence[Unit], stage: str) -> list[Unit]:
    """The units a foreign stage (a framework reranker, filter or reorderer) named ``stage``
    returned for ``before``, with scores that belong to their order.

    A stage that wrote its own scores gets them recorded (:func:`scored_by`). A stage that wrote
    none hands back the scores its input had; while it keeps their order (a filter, a cut) they
    still describe it and are kept. When it reorders them (a reranker that writes no score,
    such as LangChain's ``CrossEncoderReranker``, or ``LongContextReorder``) they no longer
    do: the score is dropped (``None``: no ``relevance_score`` on a LangChain ``Document``,
    ``NodeWithScore.score`` ``None`` in LlamaIndex), the earlier scores stay in the history
    (``funnel["score_<stage>"]``), and ``funnel["reordered_by"]`` names the stage.
    """
    prior = {u.id: u.score for u in before}
    after = list(after)
    unscored = all(u.id in prior and u.score == prior[u.id] for u in after)
    scores = [u.score for u in after]
    known = [x for x in scores if x is not None]
    reordered = any(a < b for a, b in zip(known, known[1:]))
    if not (unscored and reordered):
        return [scored_by(u, stage) for u in after]
    out = []
    for u in after:
        new = u.copy()
        new.score = None
        new.funnel[REORDERED_BY] = stage
        out.append(new)
    return out


def unit_of(id: str, text: str, metadata: Mapping[str, Any], *, score: float | None = None,
            source: Any = None, parent_id: Any = None) -> Unit:
    """The unit of a framework object (a node, a ``Document``) with ``metadata``: the user's keys
    (every key without the ``funnel_`` prefix) are its metadata, and our earlier bookkeeping
    (``funnel_...`` keys) is read back into :attr:`Unit.funnel` (``level`` and ``parent_id`` into
    the fields; a ``parent_id`` given, e.g. a node's ``PARENT``, wins), so the stages see what
    earlier stages recorded. ``source`` is the object, which the adapters hand back a copy of."""
    user, ours = read_funnel_metadata(metadata)
    level = str(ours.pop("level", "passage"))
    stored = ours.pop("parent_id", None)
    parent = stored if parent_id is None else parent_id
    return Unit(id=id, text=text, score=score, metadata=user, level=level, source=source,
                parent_id=None if parent is None else str(parent), funnel=ours)


def adopted(units: Sequence[Unit], stage: str, before: Sequence[Unit] | None = None) -> list[Unit]:
    """The units a framework object returned inside a funnel, as the stage ``stage``'s output: a
    first stage's (``before`` is ``None``) scored by it (:func:`scored_by`), a later stage's read
    against its input ``before`` (:func:`foreign_output`)."""
    if before is None:
        return [scored_by(u, stage) for u in units]
    return foreign_output(before, units, stage)


def copy_funnel(funnel: dict[str, Any]) -> dict[str, Any]:
    """A copy of a :attr:`Unit.funnel` dict (lists and dicts copied, scalars shared)."""
    return {k: (copy.deepcopy(v) if isinstance(v, (list, dict)) else v) for k, v in funnel.items()}


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
