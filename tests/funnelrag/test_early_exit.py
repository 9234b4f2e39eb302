"""Early exit (ours): the post-ranker is skipped for a query whose best pre-ranked document leads
the next by at least the margin; a document's passages count once."""

import asyncio
import math

import pytest

from funnel_core import Funnel, Unit
from funnel_core.funnel import Stage
from funnel_core.funnelrag.early_exit import ConfidentExit, lead_margin
from funnel_core.funnelrag.presets import funnelrag
from funnel_core.rerank.base import Reranker


class Count(Reranker):
    """Scores a text by how often it contains a word (model-free, scores known by hand)."""

    def __init__(self, word, **kw):
        super().__init__(**kw)
        self.word = word

    def score(self, query, texts):
        return [float(t.split().count(self.word)) for t in texts]


class Calls(Stage):
    """Reverses the order and records each call (the post-ranker whose skipping is checked)."""

    name = "post_ranking"

    def __init__(self):
        self.calls = 0

    def run(self, query, units):
        self.calls += 1
        return [u.copy() for u in units[::-1]]


def _passages(*docs):
    """Passages as later chunking leaves them: each carries its document's score."""
    return [Unit(id=f"{d}#{i}", text="x", score=s, parent_id=d) for d, s, n in docs for i in range(n)]


def test_the_lead_is_between_documents_not_passages():
    # document a (score 5.0, three passages) leads b (3.5) by 1.5; counting passages would see
    # a's second passage right behind its first and give 0
    units = _passages(("a", 5.0, 3), ("b", 3.5, 2), ("c", 1.0, 1))
    assert lead_margin(units) == pytest.approx(1.5)
    # units without a parent are their own document
    assert lead_margin([Unit(id="x", text="t", score=2.0), Unit(id="y", text="t", score=-1.0)]) == 3.0
    assert lead_margin(_passages(("a", 5.0, 4))) == math.inf  # one document: nothing competes
    assert lead_margin([]) == -math.inf
    with pytest.raises(ValueError, match="unit 'u' has no score"):
        lead_margin([Unit(id="u", text="t")])


def test_the_stage_is_skipped_at_the_margin_and_run_below_it():
    units = _passages(("a", 5.0, 2), ("b", 3.5, 2))
    for margin, skipped in ((1.5, True), (1.5 + 1e-9, False), (0.0, True), (math.inf, False)):
        inner = Calls()
        out = ConfidentExit(inner, margin)("q", units)
        assert inner.calls == (0 if skipped else 1)
        assert [u.id for u in out] == [u.id for u in (units if skipped else units[::-1])]
        inner = Calls()
        out = asyncio.run(ConfidentExit(inner, margin).acall("q", units))
        assert inner.calls == (0 if skipped else 1)
        assert [u.id for u in out] == [u.id for u in (units if skipped else units[::-1])]


def test_both_paths_keep_the_cut_off():
    units = _passages(("a", 5.0, 3), ("b", 1.0, 3))
    assert len(ConfidentExit(Calls() % 2, 1.0)("q", units)) == 2  # skipped: the inner cut-off caps
    assert len(ConfidentExit(Calls() % 2, 9.0)("q", units)) == 2  # run
    assert len((ConfidentExit(Calls(), 1.0) % 3)("q", units)) == 3
    assert len(ConfidentExit(Count("x", top_n=1), 1.0)("q", units)) == 1  # a reranker's top_n caps too


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True, None])
def test_a_bad_margin_is_named(bad):
    with pytest.raises(ValueError, match=r"margin must be a number >= 0 .*got " + repr(bad).replace("(", r"\(")):
        ConfidentExit(Calls(), bad)
    with pytest.raises(TypeError, match="wraps a funnel_core Stage"):
        ConfidentExit(lambda q, u: u, 1.0)  # type: ignore[arg-type]


DOCS = [Unit(id="a", text="mill mill mill mill river stone wheel water flows past the old house", level="document"),
        Unit(id="b", text="mill mill grain grain barley sacks stored in the loft above the yard", level="document"),
        Unit(id="c", text="mill grain grain grain grain wheat flour baked into bread each morning", level="document")]


def _funnel(margin):
    # pre-ranker: "mill" counts (a 4, b 2, c 1: a leads by 2); post-ranker: "grain" counts, which
    # puts c's passage first: it changes this query's order
    return funnelrag(DOCS, pre_ranker=Count("mill"), post_ranker=Count("grain"), k_clusters=10, k_documents=3,
                     k_passages=3, passage_words=6, max_tokens=12, exit_margin=margin)


def test_the_preset_at_margin_zero_has_no_post_ranker_and_at_inf_is_the_plain_funnel():
    query = "mill grain"
    plain = funnelrag(DOCS, pre_ranker=Count("mill"), post_ranker=Count("grain"), k_clusters=10, k_documents=3,
                      k_passages=3, passage_words=6, max_tokens=12)
    no_post = Funnel(plain.stages[:3]) % 3
    ids = lambda units: [u.id for u in units]  # noqa: E731
    assert ids(plain(query)) != ids(no_post(query))  # the post-ranker changes this query's order
    assert ids(_funnel(0.0)(query)) == ids(no_post(query))
    assert ids(_funnel(math.inf)(query)) == ids(plain(query))
    assert ids(_funnel(2.0)(query)) == ids(no_post(query))  # a leads b by exactly 2: skipped
    assert ids(_funnel(2.5)(query)) == ids(plain(query))
    post = _funnel(1.0).stages[-1]
    assert isinstance(post, ConfidentExit) and post.name == "post_ranking" and post.cutoff == 3
    res = _funnel(0.0).search(query, answers=["flour"])
    assert [s.name for s in res.trace.stages][-1] == "post_ranking % 3"
