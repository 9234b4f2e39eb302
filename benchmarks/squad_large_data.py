"""The large SQuAD corpus, its question samples, its MiniLM embeddings and their faiss HNSW index.

* documents : ~1K-token runs of consecutive paragraphs of an article (the former ``squad_units`` of the
  removed ``bench_funnel.py``), every article of one or more SQuAD-format files together;
* passages  : ``LaterChunking(words=100)`` of those documents (sentence-aware ~100-word windows);
  these are exactly the windows a ``CrossEncoderScorer(window_words=100)`` cuts a document into,
  so a document's MaxP score equals the maximum of its passages' scores;
* adjacency : neighbouring documents of an article + BM25 kNN between documents (Algorithm 1's
  graph for :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`).

Questions keep the name of the file they came from (``split``), so a run can tune on the train
file's questions and report on another file's questions over the same corpus.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from common import default_data_dir

from funnel_core.embeddings import DenseIndex
from funnel_core.evaluation.datasets import load_squad
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.text import count_tokens, normalize_answer
from funnel_core.units import Unit

PASSAGE_WORDS = 100
#: every article of SQuAD v1.1 train + dev-a
SQUAD_FILES = [default_data_dir() / "squad" / "squad-v1.1-train.json",
               default_data_dir() / "squad" / "squad-v1.1-dev-a.json"]
#: the faiss HNSW graph of the dense first stage
HNSW = {"M": 32, "efConstruction": 200, "efSearch": 128}
#: the tuning sample is a seeded sample of TUNE_N train questions; the report sample a prefix of one
#: seeded permutation of dev-a; the timing sample a seeded sample of the report sample
TRAIN_SEED, REPORT_SEED, TIMING_SEED, TUNE_N = 0, 1, 2, 400
SEEDS = {"train": TRAIN_SEED, "report": REPORT_SEED, "timing": TIMING_SEED}


@dataclass
class LargeCorpus:
    documents: list[Unit]
    passages: list[Unit]
    questions: dict[str, list]        # split name -> SquadQuestion list
    passages_of_doc: list[list[int]]
    links: sp.csr_matrix              # neighbouring documents of an article

    @cached_property
    def passage_index(self) -> dict[str, int]:
        return {u.id: i for i, u in enumerate(self.passages)}

    @cached_property
    def doc_index(self) -> dict[str, int]:
        return {d.id: i for i, d in enumerate(self.documents)}

    def adjacency(self, knn_k: int = 20) -> sp.csr_matrix:
        """Article links + BM25 kNN between documents (the graph Algorithm 1 clusters)."""
        from funnel_core.bm25 import BM25Index
        from funnel_core.funnelrag.clustering import bm25_knn_adjacency

        return (self.links + bm25_knn_adjacency(BM25Index().index(self.documents), k=knn_k)).tocsr()

    def tuning_sample(self) -> list:
        """The seeded sample of train questions every choice is tuned on (in sampled order)."""
        train = self.questions["train"]
        return random.Random(TRAIN_SEED).sample(train, min(TUNE_N, len(train)))

    def report_sample(self, n: int) -> list:
        """The first ``n`` questions of the seeded permutation of dev-a (samples of any size nest)."""
        dev = self.questions["dev-a"]
        return random.Random(REPORT_SEED).sample(dev, len(dev))[:n]

    def embedded_questions(self) -> dict[str, list]:
        """The questions embed_texts.py embeds, by name: all of dev-a; the tuning sample in file order."""
        ids = {q.id for q in self.tuning_sample()}
        return {"dev_a": self.questions["dev-a"], "train_tune": [q for q in self.questions["train"] if q.id in ids]}


class AnswerTexts:
    """``has_answer`` over a fixed list of texts (passages or documents), each text and each answer
    list normalised once: the same test as :func:`funnel_core.text.has_answer` (a SQuAD-normalised
    answer occurs in the normalised text on word boundaries), fast enough for millions of checks."""

    def __init__(self, texts: Sequence[str]):
        self.texts, self._norm, self._answers = texts, {}, {}

    def __call__(self, answers: Sequence[str], i: int) -> bool:
        if i not in self._norm:
            self._norm[i] = f" {normalize_answer(self.texts[i])} "
        key = tuple(answers)
        if key not in self._answers:
            self._answers[key] = [f" {a} " for a in map(normalize_answer, answers) if a]
        return any(a in self._norm[i] for a in self._answers[key])

    def hit_rank(self, answers: Sequence[str], ranked: Sequence[int]) -> int:
        """1-based rank of the first text of ``ranked`` containing a gold answer; 0 when none does."""
        return next((r for r, i in enumerate(ranked, 1) if self(answers, i)), 0)


def split_name(path: Path) -> str:
    return next((key for key in ("train", "dev-a", "dev-b", "dev", "test") if key in Path(path).name), Path(path).stem)


def build_corpus(paths: Sequence[Path], doc_tokens: int = 1000) -> LargeCorpus:
    docs: list[Unit] = []
    questions: dict[str, list] = {}
    for path in paths:
        articles = load_squad(path)
        questions[split_name(path)] = [q for a in articles for q in a.questions]
        for a in articles:
            runs: list[list[str]] = [[]]      # paragraphs of each document, in order
            for para in a.paragraphs:
                if runs[-1] and count_tokens(" ".join(runs[-1])) + count_tokens(para) > doc_tokens:
                    runs.append([])
                runs[-1].append(para)
            docs += [Unit(id=f"{a.title}/{j}", text="\n".join(run), level="document", metadata={"title": a.title})
                     for j, run in enumerate(runs) if run]
    n = len(docs)
    after = [i for i in range(n - 1) if docs[i].metadata["title"] == docs[i + 1].metadata["title"]]
    links = sp.csr_matrix((np.ones(len(after)), (after, [i + 1 for i in after])), shape=(n, n))
    chunk = LaterChunking(words=PASSAGE_WORDS, name="later_chunking")
    passages: list[Unit] = []
    passages_of_doc: list[list[int]] = []
    for d in docs:
        children = chunk.split(d)
        passages_of_doc.append(list(range(len(passages), len(passages) + len(children))))
        passages += children
    return LargeCorpus(documents=docs, passages=passages, questions=questions, passages_of_doc=passages_of_doc,
                       links=links.maximum(links.T).tocsr())


def load_embeddings(prefix: Path, name: str) -> np.ndarray | None:
    """The L2-normalised rows embed_texts.py wrote for ``name`` (shards under ``PREFIX.<name>``; None when absent)."""
    folder = Path(f"{prefix}.{name}")
    if not folder.is_dir():
        return None
    from funnel_core.offline import read_embeddings

    e = read_embeddings(folder)[1]
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def passage_embeddings(prefix: Path, passages, embedder) -> tuple[np.ndarray, str]:
    """The passages' embeddings (embed_texts.py's files, else encoded here once and kept under .cache/), and whence."""
    emb = load_embeddings(prefix, "passages")
    if emb is not None and len(emb) == len(passages):
        return emb, f"{prefix}.passages (embed_texts.py)"
    from common import cached_embeddings

    return cached_embeddings(embedder, [u.text for u in passages], "squad_large"), "encoded here (CPU, fp32)"


def question_embeddings(prefix: Path, corpus: LargeCorpus, qs, embedder) -> dict[str, np.ndarray]:
    """Embeddings of the questions ``qs``: from embed_texts.py's files when present, else encoded here."""
    out = {}
    for name, split in corpus.embedded_questions().items():
        e = load_embeddings(prefix, name)
        if e is not None and len(e) == len(split):
            out.update(zip([q.id for q in split], e))
    missing = [q for q in qs if q.id not in out]
    if missing:
        out.update(zip([q.id for q in missing], embedder.encode([q.question for q in missing])))
    return out


def dense_index(passages, emb: np.ndarray, embedder) -> DenseIndex:
    """faiss HNSW (inner product) over the normalised passage embeddings, built on one thread (reproducible)."""
    import faiss

    faiss.omp_set_num_threads(1)
    return DenseIndex(embedder, index="hnsw", hnsw_m=HNSW["M"], ef_construction=HNSW["efConstruction"],
                      ef_search=HNSW["efSearch"]).index(passages, embeddings=emb)


def exact_top(emb: np.ndarray, q_emb: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the exact top-``k`` inner products of each query, best first."""
    out = []
    for b in range(0, len(q_emb), 512):
        sims = q_emb[b:b + 512] @ emb.T
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(sims, top, 1).argsort(axis=1)[:, ::-1]
        out.append(np.take_along_axis(top, order, 1))
    return np.concatenate(out)
