"""Multi-granularity chunking (Mix-of-Granularity, section 3.2).

Every document is cut into ``n_gra`` granularity levels. Level 1 is the finest: sentence-aware
windows of about ``chunk_size`` words. Each chunk of level ``j`` is two adjacent chunks of level
``j - 1`` of the same document (no overlap); an odd chunk at the end of a document is carried up
alone. So a level-``j`` chunk covers up to ``2 ** (j - 1)`` finest chunks, and the levels form a
forest: every unit above level 1 has ``metadata["child_ids"]``, every unit below the top level a
``parent_id``.

:class:`GranularityStructure` is what MoG retrieval needs from any multi-granularity corpus:
the units of each level, the finest units, which finest units a unit covers, and which unit of
level ``j`` contains a given finest unit. :class:`GranularityHierarchy` (this module) and
:class:`~funnel_core.granularity.graph.GranularityGraph` (MoGG) both implement it.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from typing import Any, Iterable, Sequence

import numpy as np

from funnel_core.errors import check_positive_int
from funnel_core.settings import Settings
from funnel_core.text import word_windows
from funnel_core.units import Unit, check_unique_ids

__all__ = ["GranularityStructure", "GranularityHierarchy", "MultiGranularityChunker",
           "as_documents", "level_name"]

#: Unit metadata keys written by the chunkers (hidden from LLMs by the adapters).
HIERARCHY_KEYS = ("granularity", "doc_id", "doc_index", "position", "child_ids")


def level_name(j: int) -> str:
    """The :attr:`Unit.level` string of granularity level ``j`` (``"granularity-1"``, ...)."""
    return f"granularity-{j}"


def as_documents(documents: Iterable[Unit | str]) -> list[Unit]:
    """Strings or units -> units with ids (``"doc0"``, ``"doc1"``, ... for strings)."""
    if isinstance(documents, (str, Unit)):
        raise TypeError("pass a list of documents (str or Unit), not a single one; wrap it in a list.")
    out = []
    for i, d in enumerate(documents):
        if isinstance(d, str):
            d = Unit(id=f"doc{i}", text=d, level="document")
        elif not isinstance(d, Unit):
            raise TypeError(f"documents must be str or Unit, got {type(d).__name__} at position {i}.")
        out.append(d)
    check_unique_ids(out)
    return out


def _doc_metadata(doc: Unit) -> dict[str, Any]:
    return {k: v for k, v in doc.metadata.items() if k not in ("scores", "funnel_trace")}


class GranularityStructure(ABC):
    """A corpus seen at ``n_gra`` granularity levels, over a common set of finest units.

    Attributes:
        n_gra: Number of granularity levels (1 = finest).
        levels: ``levels[j - 1]`` is the list of units of level ``j``.
        finest: The base units every level is made of (level 1 of a hierarchy, graph nodes).
    """

    n_gra: int
    levels: list[list[Unit]]
    finest: list[Unit]

    @abstractmethod
    def covers(self, level: int, index: int) -> np.ndarray:
        """Indices (into :attr:`finest`) of the finest units that unit ``index`` of ``level`` holds."""

    @abstractmethod
    def container_index(self, finest_index: int, level: int) -> int:
        """Index (into ``levels[level - 1]``) of the level-``level`` unit returned for a finest unit."""

    def container(self, finest_index: int, level: int) -> Unit:
        """The level-``level`` unit returned for finest unit ``finest_index``."""
        return self.levels[level - 1][self.container_index(finest_index, level)]

    def level(self, j: int) -> list[Unit]:
        """Units of level ``j`` (1-based)."""
        self._check_level(j)
        return self.levels[j - 1]

    def all_units(self) -> list[Unit]:
        """Every unit of every level, finest level first (deduplicated by id)."""
        seen: set[str] = set()
        out = []
        for level in [self.finest, *self.levels]:
            for u in level:
                if u.id not in seen:
                    seen.add(u.id)
                    out.append(u)
        return out

    def _check_level(self, j: int) -> None:
        if isinstance(j, bool) or not isinstance(j, int) or not 1 <= j <= self.n_gra:
            raise ValueError(f"granularity level must be an int in [1, {self.n_gra}], got {j!r}.")


class GranularityHierarchy(GranularityStructure):
    """The nested chunks of :class:`MultiGranularityChunker`: a forest with one tree per document.

    ``levels[0]`` is the finest level; ``levels[j][i].parent_id`` is the id of its parent in
    ``levels[j + 1]``. Build one with :meth:`MultiGranularityChunker.split` or rebuild one from
    units that carry the hierarchy metadata with :meth:`from_units`.
    """

    def __init__(self, levels: list[list[Unit]]) -> None:
        if not levels or not levels[0]:
            raise ValueError("a granularity hierarchy needs at least one level with one unit.")
        self.n_gra = len(levels)
        self.levels = levels
        self.finest = levels[0]
        self.by_id: dict[str, Unit] = {}
        for level in levels:
            for u in level:
                self.by_id[u.id] = u
        # ancestor[j][f]: index in level j+1 of the chunk containing finest chunk f.
        pos = [{u.id: i for i, u in enumerate(level)} for level in levels]
        self._ancestor = [np.arange(len(self.finest))]
        for j in range(1, self.n_gra):
            below = self._ancestor[-1]
            parent_of = np.empty(len(levels[j - 1]), dtype=np.int64)
            for i, u in enumerate(levels[j - 1]):
                if u.parent_id is None or u.parent_id not in pos[j]:
                    raise ValueError(f"unit {u.id!r} of level {j} has no parent in level {j + 1}; "
                                     "pass every level of the hierarchy.")
                parent_of[i] = pos[j][u.parent_id]
            self._ancestor.append(parent_of[below])
        self._spans: list[list[np.ndarray]] = []
        for j in range(self.n_gra):
            order = np.argsort(self._ancestor[j], kind="stable")
            bounds = np.searchsorted(self._ancestor[j][order], np.arange(len(levels[j]) + 1))
            self._spans.append([order[bounds[i]:bounds[i + 1]] for i in range(len(levels[j]))])

    def covers(self, level: int, index: int) -> np.ndarray:
        self._check_level(level)
        return self._spans[level - 1][index]

    def container_index(self, finest_index: int, level: int) -> int:
        self._check_level(level)
        return int(self._ancestor[level - 1][finest_index])

    def ancestor(self, unit_id: str, level: int) -> Unit:
        """The level-``level`` unit that contains the unit ``unit_id`` (itself at its own level)."""
        self._check_level(level)
        unit = self.by_id[unit_id]
        while unit.metadata["granularity"] < level:
            if unit.parent_id is None:
                raise ValueError(f"unit {unit.id!r} has no parent above level "
                                 f"{unit.metadata['granularity']}; rebuild the granularity levels.")
            unit = self.by_id[unit.parent_id]
        if unit.metadata["granularity"] != level:
            raise ValueError(f"unit {unit_id!r} is coarser than level {level}.")
        return unit

    @classmethod
    def from_units(cls, units: Sequence[Unit]) -> "GranularityHierarchy":
        """Rebuild a hierarchy from its units (any order), e.g. nodes of a LlamaIndex docstore.

        Units need ``metadata["granularity"]`` and, below the top level, a ``parent_id``; within a
        level they are put in document order by ``(doc_index, position)``.
        """
        by_level: dict[int, list[Unit]] = {}
        for u in units:
            g = u.metadata.get("granularity")
            if not isinstance(g, int):
                raise ValueError(f"unit {u.id!r} has no integer metadata['granularity']; build the "
                                 "units with MultiGranularityChunker / MultiGranularityNodeParser.")
            by_level.setdefault(g, []).append(u)
        if not by_level:
            raise ValueError("cannot rebuild a granularity hierarchy from no units.")
        n = max(by_level)
        missing = [j for j in range(1, n + 1) if j not in by_level]
        if missing:
            raise ValueError(f"granularity levels {missing} are missing; pass every level's units.")
        levels = [sorted(by_level[j], key=lambda u: (u.metadata.get("doc_index", 0),
                                                     u.metadata.get("position", 0)))
                  for j in range(1, n + 1)]
        return cls(levels)


class MultiGranularityChunker(Settings):
    """Cut documents into ``n_gra`` nested granularity levels (MoG section 3.2).

    Args:
        chunk_size: Size of the finest chunks in words (whitespace tokens).
        n_gra: Number of levels; level ``j`` chunks hold up to ``2 ** (j - 1)`` finest chunks.
        sentence_aware: Finest chunks end at sentence boundaries (a sentence longer than
            ``chunk_size`` is cut by words).

    A document shorter than one finest chunk becomes a single chunk that is repeated, with the
    same text, at every level (so every level still covers the whole corpus); a document with no
    words is skipped with a warning.
    """

    def __init__(self, *, chunk_size: int = 64, n_gra: int = 5, sentence_aware: bool = True) -> None:
        self.chunk_size = check_positive_int(chunk_size, "chunk_size")
        self.n_gra = check_positive_int(n_gra, "n_gra (number of granularity levels)")
        self.sentence_aware = bool(sentence_aware)

    def finest_chunks(self, text: str) -> list[str]:
        """The level-1 chunks of one text."""
        return word_windows(text, words=self.chunk_size, sentence_aware=self.sentence_aware)

    def split_document(self, doc: Unit, doc_index: int = 0) -> list[list[Unit]]:
        """The levels of one document: ``out[j - 1]`` are its level-``j`` units, in order."""
        texts = self.finest_chunks(doc.text)
        if not texts:
            return [[] for _ in range(self.n_gra)]
        base = _doc_metadata(doc)
        levels: list[list[Unit]] = []
        groups: list[list[int]] = [[i] for i in range(len(texts))]  # finest indices per chunk
        for j in range(1, self.n_gra + 1):
            if j > 1:
                groups = [sum(groups[i:i + 2], []) for i in range(0, len(groups), 2)]
            level = []
            for p, g in enumerate(groups):
                meta = dict(base)
                meta.update(granularity=j, doc_id=doc.id, doc_index=doc_index, position=p)
                level.append(Unit(id=f"{doc.id}/L{j}/{p}", text=" ".join(texts[i] for i in g),
                                  metadata=meta, level=level_name(j)))
            levels.append(level)
        for j in range(self.n_gra - 1):
            for p, u in enumerate(levels[j]):
                parent = levels[j + 1][p // 2]
                u.parent_id = parent.id
                parent.metadata.setdefault("child_ids", []).append(u.id)
        return levels

    def split(self, documents: Iterable[Unit | str]) -> GranularityHierarchy:
        """Chunk every document; return the :class:`GranularityHierarchy` of the corpus."""
        docs = as_documents(documents)
        if not docs:
            raise ValueError("cannot chunk an empty corpus; pass at least one document.")
        levels: list[list[Unit]] = [[] for _ in range(self.n_gra)]
        skipped = []
        for di, doc in enumerate(docs):
            doc_levels = self.split_document(doc, di)
            if not doc_levels[0]:
                skipped.append(doc.id)
                continue
            for j in range(self.n_gra):
                levels[j].extend(doc_levels[j])
        if skipped:
            warnings.warn(f"skipped {len(skipped)} document(s) with no words: {skipped[:5]}",
                          stacklevel=2)
        if not levels[0]:
            raise ValueError("every document is empty (no words); nothing to chunk.")
        return GranularityHierarchy(levels)
