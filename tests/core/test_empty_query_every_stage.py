"""Every ``funnel_core`` stage on an empty or blank query does what the adapters do: nothing is
scored, the incoming units keep their order, capped by the stage's ``top_n`` and its cut-off.
The stage classes are found by walking ``funnel_core``, so a new stage cannot be forgotten.
No model is loaded: an empty query never reaches one."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
from typing import Any, Callable

import pytest

import funnel_core
from funnel_core import Unit
from funnel_core.best_practices.classify import QueryClassifier, RetrievalGate
from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.best_practices.fusion import HybridRetrieve
from funnel_core.best_practices.hyde import HyDE, HyDERetrieve
from funnel_core.best_practices.repack import Repack
from funnel_core.bm25 import BM25Index, BM25Retrieve
from funnel_core.embeddings import DenseIndex, DenseRetrieve, SentenceEmbedder
from funnel_core.fbrag import ForwardLookup
from funnel_core.funnel import FunctionStage, Funnel, Stage
from funnel_core.funnelrag.chunking import LaterChunking, OpenClusters
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
from funnel_core.funnelrag.early_exit import ConfidentExit
from funnel_core.granularity.levels import MultiGranularityChunker
from funnel_core.granularity.retrieval import MixOfGranularityRetrieve
from funnel_core.rerank.attention_lm import AttentionLMScorer
from funnel_core.rerank.bm25 import BM25Scorer
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.embedding import EmbeddingScorer
from funnel_core.rerank.fid import FiDAttentionScorer
from funnel_core.rerank.monot5 import MonoT5Scorer
from funnel_core.rerank.rankrag import RankRAGScorer

UNITS = [Unit(id=f"u{i}", text=f"Passage {i} about rivers, mills and grain number {i}.",
              score=float(10 - i), level="document") for i in range(6)]
NO_MODEL = "no-such-org/no-such-model"  # never loaded: an empty query scores nothing


def _index() -> BM25Index:
    return BM25Index().index(UNITS)


def _gate(request: pytest.FixtureRequest) -> RetrievalGate:
    embedder = SentenceEmbedder(request.getfixturevalue("tiny_cross_encoder_path"), device="cpu")
    classifier = QueryClassifier(embedder=embedder).fit(
        ["Who wrote Hamlet?", "What is BM25?", "Say hi", "Translate: hello"],
        ["retrieval", "retrieval", "sufficient", "sufficient"])
    return RetrievalGate(classifier, BM25Scorer(top_n=3))


#: class name -> build(request); a reranker gets top_n=3, so the cap is checked too.
BUILD: dict[str, Callable[[Any], Stage]] = {
    "BM25Retrieve": lambda r: BM25Retrieve(_index(), k=3),
    "DenseRetrieve": lambda r: DenseRetrieve(DenseIndex(SentenceEmbedder(NO_MODEL)), k=3),
    "ClusteredBM25Retrieve": lambda r: ClusteredBM25Retrieve(
        ClusteredBM25Index(max_tokens=30).index(UNITS), k=3),
    "HybridRetrieve": lambda r: HybridRetrieve(BM25Retrieve(_index()), BM25Retrieve(_index()), k=3),
    "HyDERetrieve": lambda r: HyDERetrieve(DenseIndex(SentenceEmbedder(NO_MODEL)), HyDE(NO_MODEL), k=3),
    "MixOfGranularityRetrieve": lambda r: MixOfGranularityRetrieve(
        MultiGranularityChunker(chunk_size=4, n_gra=2).split([u.text for u in UNITS]), top_k=3),
    "Repack": lambda r: Repack(),
    "ExtractiveCompressor": lambda r: ExtractiveCompressor(method="bm25"),
    "ForwardLookup": lambda r: ForwardLookup(llm=NO_MODEL, k=3),
    "FunctionStage": lambda r: FunctionStage(lambda q, us: us[::-1]),
    "Funnel": lambda r: Funnel([BM25Scorer(top_n=4), CrossEncoderScorer(NO_MODEL, top_n=3)]),
    "LaterChunking": lambda r: LaterChunking(words=2),
    "ConfidentExit": lambda r: ConfidentExit(CrossEncoderScorer(NO_MODEL, top_n=3), 1.0),
    "OpenClusters": lambda r: OpenClusters(UNITS),
    "RetrievalGate": _gate,
    "CrossEncoderScorer": lambda r: CrossEncoderScorer(NO_MODEL, top_n=3),
    "MonoT5Scorer": lambda r: MonoT5Scorer(NO_MODEL, top_n=3),
    "FiDAttentionScorer": lambda r: FiDAttentionScorer(model=NO_MODEL, top_n=3),
    "AttentionLMScorer": lambda r: AttentionLMScorer(model=NO_MODEL, top_n=3),
    "RankRAGScorer": lambda r: RankRAGScorer(llm=NO_MODEL, top_n=3),
    "EmbeddingScorer": lambda r: EmbeddingScorer(SentenceEmbedder(NO_MODEL), top_n=3),
    "BM25Scorer": lambda r: BM25Scorer(top_n=3),
}
#: Expected length of the output for 6 incoming units: 3 for a stage with top_n=3 (a
#: reranker, and the funnel whose last reranker keeps 3), else all 6.
CAPPED = {"CrossEncoderScorer", "MonoT5Scorer", "FiDAttentionScorer", "AttentionLMScorer",
          "RankRAGScorer", "EmbeddingScorer", "BM25Scorer", "Funnel", "RetrievalGate", "ConfidentExit"}


def _concrete_stages() -> set[str]:
    for m in pkgutil.walk_packages(funnel_core.__path__, "funnel_core."):
        if not m.name.rsplit(".", 1)[-1].startswith("_") and m.name != "funnel_core.cli":
            importlib.import_module(m.name)

    def subclasses(c: type) -> Any:
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    return {c.__name__ for c in subclasses(Stage) if c.__module__.startswith("funnel_core")
            and not inspect.isabstract(c) and not c.__name__.startswith("_")}


def test_every_core_stage_has_a_case():
    assert _concrete_stages() == set(BUILD), "add the new stage to BUILD"


CASES = [pytest.param(n, marks=pytest.mark.models) if n == "RetrievalGate" else n for n in BUILD]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("query", ["", "   "])
def test_an_empty_query_keeps_the_candidates_in_their_order(name, query, request):
    stage = BUILD[name](request)
    ids = [u.id for u in UNITS]
    n = 3 if name in CAPPED else len(UNITS)
    assert [u.id for u in stage(query, UNITS)] == ids[:n]
    assert [u.id for u in asyncio.run(stage.acall(query, UNITS))] == ids[:n]
    assert [u.id for u in (stage % 2)(query, UNITS)] == ids[:2]  # the cut-off still caps
    assert stage(query, []) == []  # a first stage gets nothing, and returns nothing
