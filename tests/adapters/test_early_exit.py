"""Early exit inside both frameworks' FunnelRetriever: a confident query never calls the
post-ranker, sync or async, and the framework objects come back in the pre-ranker's order."""

import asyncio

from funnel_core import BM25Index, BM25Retrieve, LaterChunking
from funnel_core.funnelrag.early_exit import ConfidentExit
from langchain_funnel.funnel import FunnelRetriever as LCFunnelRetriever
from llama_index_funnel.funnel import FunnelRetriever as LIFunnelRetriever
from tests.funnelrag.test_early_exit import Calls, Count


def _stages(corpus_units, margin):
    post = Calls()
    index = BM25Index().index(corpus_units)
    return post, [BM25Retrieve(index, k=4), Count("Shakespeare") % 2, LaterChunking(words=4),
                  ConfidentExit(post, margin) % 3]


def test_both_frameworks_skip_the_post_ranker_when_confident(corpus_units):
    # "Shakespeare Hamlet": BM25 brings d5 and d6, which say "Shakespeare" once each, so the
    # pre-ranker's best document leads by 0: a margin of 0 skips the post-ranker, 1 runs it
    for margin, calls in ((0.0, 0), (1.0, 1)):
        for make, run in (
                (lambda st: LIFunnelRetriever(st), lambda r, q: r.retrieve(q)),
                (lambda st: LIFunnelRetriever(st), lambda r, q: asyncio.run(r.aretrieve(q))),
                (lambda st: LCFunnelRetriever.from_stages(*st, k=None), lambda r, q: r.invoke(q)),
                (lambda st: LCFunnelRetriever.from_stages(*st, k=None), lambda r, q: asyncio.run(r.ainvoke(q)))):
            post, stages = _stages(corpus_units, margin)
            out = run(make(stages), "Shakespeare Hamlet")
            assert post.calls == calls
            assert len(out) == 3 and {o.metadata["funnel_parent_id"] for o in out} <= {"d5", "d6"}
