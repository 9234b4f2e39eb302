"""Text utilities: token counting, sentence splitting, sentence-aware word windows, and the
"later chunking" stage of FunnelRAG (section 3.1.3) that cuts coarse units into finer ones.
"""

from __future__ import annotations

import re
from typing import Sequence

from funnel_core.config import LaterChunkingConfig, configured
from funnel_core.errors import check_positive_int
from funnel_core.funnel import Stage
from funnel_core.units import Unit

__all__ = [
    "count_tokens",
    "split_sentences",
    "word_windows",
    "LaterChunking",
    "OpenClusters",
]

_WORD_RE = re.compile(r"\S+")
# A sentence ends at . ! ? (optionally followed by quotes/brackets) and whitespace, unless the
# period follows a common abbreviation or a single capital letter (initials).
_SENT_END_RE = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "e.g", "i.e", "fig", "al", "no",
           "jr", "sr", "inc", "co", "ltd", "u.s", "approx", "eq", "ref", "vol"}


def count_tokens(text: str) -> int:
    """Whitespace token count; a fast, model-free proxy for the paper's token budgets."""
    return len(_WORD_RE.findall(text))


def split_sentences(text: str) -> list[str]:
    """Split text into sentences with a rule-based splitter (no model, no download).

    Paragraph breaks always end a sentence; abbreviations such as "e.g." and initials such as
    "J. Smith" do not.
    """
    sentences: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if not para:
            continue
        start = 0
        for m in _SENT_END_RE.finditer(para):
            candidate = para[start:m.start()].rstrip()
            last = candidate.rsplit(" ", 1)[-1].rstrip(".!?\"')]").lower()
            if last in _ABBREV or (len(last) == 1 and last.isalpha()):
                continue
            if candidate:
                sentences.append(candidate)
            start = m.end()
        tail = para[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences


def word_windows(text: str, words: int = 100, overlap: int = 0,
                 sentence_aware: bool = True) -> list[str]:
    """Cut ``text`` into windows of about ``words`` words.

    With ``sentence_aware`` (default) windows end at sentence boundaries: sentences are packed
    greedily until adding the next one would pass ``words``; a single sentence longer than
    ``words`` is cut by words. ``overlap`` repeats that many trailing words of a window at the
    start of the next one.
    """
    check_positive_int(words, "words")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < words:
        raise ValueError(f"overlap must be an int in [0, words={words}), got {overlap!r}.")
    if sentence_aware:
        pieces: list[list[str]] = []
        for sent in split_sentences(text):
            toks = sent.split()
            for i in range(0, len(toks), words):
                pieces.append(toks[i:i + words])
    else:
        toks = text.split()
        pieces = [toks[i:i + words] for i in range(0, len(toks), words)]

    windows: list[list[str]] = []
    current: list[str] = []
    for piece in pieces:
        if current and len(current) + len(piece) > words:
            windows.append(current)
            current = current[len(current) - overlap:] if overlap else []
        current = current + piece
    if current and (not windows or len(current) > overlap):
        windows.append(current)
    return [" ".join(w) for w in windows]


@configured(LaterChunkingConfig)
class LaterChunking(Stage):
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

    def __init__(self, words: int = 100, overlap: int = 0, level: str = "passage",
                 sentence_aware: bool = True, name: str | None = None) -> None:
        check_positive_int(words, "words")
        word_windows("probe", words, overlap)  # validates overlap early
        self.words = words
        self.overlap = overlap
        self.level: str = level
        self.sentence_aware = sentence_aware
        self.name = name or f"later_chunking({words}w)"

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
