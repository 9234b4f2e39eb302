"""The large SQuAD corpus: every article of one or more SQuAD-format files together.

* documents : ~1K-token runs of consecutive paragraphs of an article (the former ``squad_units`` of the
  removed ``bench_funnel.py``);
* passages  : ``LaterChunking(words=100)`` of those documents (sentence-aware ~100-word windows);
  these are exactly the windows a ``CrossEncoderScorer(window_words=100)`` cuts a document into,
  so a document's MaxP score equals the maximum of its passages' scores;
* adjacency : neighbouring documents of an article + BM25 kNN between documents (Algorithm 1's
  graph for :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`).

Questions keep the name of the file they came from (``split``), so a run can tune on the train
file's questions and report on another file's questions over the same corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from funnel_core.evaluation.datasets import load_squad
from funnel_core.evaluation.metrics import normalize_answer
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.text import count_tokens
from funnel_core.units import Unit

PASSAGE_WORDS = 100


@dataclass
class LargeCorpus:
    documents: list[Unit]
    passages: list[Unit]
    questions: dict[str, list]                      # split name -> SquadQuestion list
    doc_of_paragraph: dict[tuple[str, int], int]    # (article title, paragraph index) -> document index
    passage_paragraphs: list[tuple[int, ...]] = field(default_factory=list)  # paragraph indices (within article) each passage overlaps
    passages_of_doc: list[list[int]] = field(default_factory=list)
    links: sp.csr_matrix | None = None              # neighbouring documents of an article

    def adjacency(self, knn_k: int = 20) -> sp.csr_matrix:
        """Article links + BM25 kNN between documents (the graph Algorithm 1 clusters)."""
        from funnel_core.bm25 import BM25Index
        from funnel_core.funnelrag.clustering import bm25_knn_adjacency

        adj = self.links + bm25_knn_adjacency(BM25Index().index(self.documents), k=knn_k)
        return adj.tocsr()


class AnswerTexts:
    """``has_answer`` over a fixed list of texts (passages or documents), each text and each answer
    list normalised once: the same test as :func:`funnel_core.evaluation.metrics.has_answer` (a
    SQuAD-normalised answer occurs in the normalised text on word boundaries), fast enough for
    millions of (question, text) checks."""

    def __init__(self, texts: Sequence[str]):
        self.texts = texts
        self._norm: dict[int, str] = {}
        self._answers: dict[tuple[str, ...], list[str]] = {}

    def __call__(self, answers: Sequence[str], i: int) -> bool:
        if i not in self._norm:
            self._norm[i] = f" {normalize_answer(self.texts[i])} "
        key = tuple(answers)
        if key not in self._answers:
            self._answers[key] = [f" {a} " for a in (normalize_answer(x) for x in answers) if a]
        return any(a in self._norm[i] for a in self._answers[key])

    def hit_rank(self, answers: Sequence[str], ranked: Sequence[int]) -> int:
        """1-based rank of the first text of ``ranked`` containing a gold answer; 0 when none does."""
        return next((r for r, i in enumerate(ranked, 1) if self(answers, i)), 0)


def split_name(path: Path) -> str:
    name = Path(path).name
    for key in ("train", "dev-a", "dev-b", "dev", "test"):
        if key in name:
            return key
    return Path(path).stem


def build_corpus(paths: Sequence[Path], doc_tokens: int = 1000) -> LargeCorpus:
    docs: list[Unit] = []
    doc_paras: list[list[int]] = []   # paragraph indices of each document
    rows, cols = [], []
    questions: dict[str, list] = {}
    doc_of_paragraph: dict[tuple[str, int], int] = {}
    for path in paths:
        articles = load_squad(path)
        questions[split_name(path)] = [q for a in articles for q in a.questions]
        for a in articles:
            current: list[int] = []
            first = len(docs)

            def flush() -> None:
                if current:
                    for pi in current:
                        doc_of_paragraph[(a.title, pi)] = len(docs)
                    docs.append(Unit(id=f"{a.title}/{len(docs) - first}",
                                     text="\n".join(a.paragraphs[pi] for pi in current),
                                     level="document", metadata={"title": a.title}))
                    doc_paras.append([(pi, len(a.paragraphs[pi].split())) for pi in current])

            tokens = 0
            for pi, para in enumerate(a.paragraphs):
                n = count_tokens(para)
                if current and tokens + n > doc_tokens:
                    flush()
                    current, tokens = [], 0
                current.append(pi)
                tokens = count_tokens(" ".join(a.paragraphs[p] for p in current))
            flush()
            for i in range(first, len(docs) - 1):
                rows.append(i)
                cols.append(i + 1)
    n = len(docs)
    links = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    links = links.maximum(links.T).tocsr()
    chunk = LaterChunking(words=PASSAGE_WORDS, name="later_chunking")
    passages: list[Unit] = []
    passage_paragraphs: list[tuple[int, ...]] = []
    passages_of_doc: list[list[int]] = []
    for di, d in enumerate(docs):
        children = chunk.split(d)
        # word -> paragraph map (word_windows keeps every whitespace token, in order)
        word_para = np.concatenate([np.full(n, pi) for pi, n in doc_paras[di]])
        lens = [len(c.text.split()) for c in children]
        exact = sum(lens) == len(word_para)
        start = 0
        idx = []
        for c, ln in zip(children, lens):
            idx.append(len(passages))
            passages.append(c)
            passage_paragraphs.append(tuple(sorted(set(word_para[start:start + ln].tolist())))
                                      if exact else tuple(pi for pi, _ in doc_paras[di]))
            start += ln
        passages_of_doc.append(idx)
    return LargeCorpus(documents=docs, passages=passages, questions=questions,
                       doc_of_paragraph=doc_of_paragraph, passage_paragraphs=passage_paragraphs,
                       passages_of_doc=passages_of_doc, links=links)
