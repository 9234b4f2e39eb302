"""The `funnelrag` preset: the default cut-offs and the paper's Table 2 settings (NQ: 80 clusters
-> 8 documents -> 4 passages of ~100 words, FiD post-ranking; TQA: 80 clusters -> 12 documents)."""

import pytest

from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.presets import PRESETS, funnelrag
from funnel_core.rerank.bm25 import BM25Scorer
from funnel_core.rerank.fid import FiDAttentionScorer

pytestmark = pytest.mark.models


def _cuts(funnel):
    retrieve, pre, chunking, post = funnel.stages
    return retrieve.k, pre.cutoff, chunking.words, post.cutoff


def test_paper_preset_is_table2_with_a_fid_post_ranker(corpus_units, tiny_t5_path):
    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)
    funnel = funnelrag(index, pre_ranker=BM25Scorer(), post_ranker=tiny_t5_path, preset="paper",
                       fid_kwargs={"dtype": "float32"})
    assert _cuts(funnel) == (80, 8, 100, 4)
    post = funnel.stages[-1]
    assert isinstance(post, FiDAttentionScorer) and post.model_name == tiny_t5_path
    assert post.name == "post_ranking" and post.score_on == "alpha" and post.lr == 4
    res = funnel.search("Paris France tower", answers=["Eiffel"])
    assert [r.name for r in res.trace.stages][-1] == "post_ranking % 4"
    assert 0 < len(res.units) <= 4
    assert all("post_ranking" in u.scores for u in res.units)
    # a FiDAttentionScorer is taken as is (renamed); cut-offs can still be overridden
    fid = FiDAttentionScorer(model=tiny_t5_path)
    again = funnelrag(index, pre_ranker=BM25Scorer(), post_ranker=fid, preset="paper", k_clusters=5)
    assert _cuts(again) == (5, 8, 100, 4) and again.stages[-1].name == "post_ranking"


def test_paper_preset_needs_a_fid_reader_and_default_keeps_10_clusters(corpus_units):
    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)
    with pytest.raises(ValueError, match="FiD reader"):
        funnelrag(index, pre_ranker=BM25Scorer(), preset="paper")
    with pytest.raises(ValueError, match="FiD reader"):
        funnelrag(index, pre_ranker=BM25Scorer(), post_ranker=BM25Scorer(), preset="paper")
    with pytest.raises(ValueError, match="preset='paper-tqa' post-ranks with a FiD reader"):
        funnelrag(index, pre_ranker=BM25Scorer(), preset="paper-tqa")
    with pytest.raises(ValueError, match="preset must be one of"):
        funnelrag(index, pre_ranker=BM25Scorer(), preset="table2")
    default = funnelrag(index, pre_ranker=BM25Scorer())
    assert _cuts(default) == (10, 8, 100, 4)
    assert PRESETS["paper"] == {"k_clusters": 80, "k_documents": 8, "k_passages": 4,
                                "passage_words": 100}


def test_paper_tqa_preset_is_table2_tqa_row(corpus_units, tiny_t5_path):
    """Table 2, TQA row: 80 clusters -> 12 documents (NQ keeps 8), FiD post-ranking to 4."""
    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)
    funnel = funnelrag(index, pre_ranker=BM25Scorer(), post_ranker=tiny_t5_path, preset="paper-tqa",
                       fid_kwargs={"dtype": "float32"})
    assert _cuts(funnel) == (80, 12, 100, 4)
    assert isinstance(funnel.stages[-1], FiDAttentionScorer)
    assert PRESETS["paper-tqa"] == {"k_clusters": 80, "k_documents": 12, "k_passages": 4,
                                    "passage_words": 100}
    res = funnel.search("Paris France tower", answers=["Eiffel"])
    assert [r.name for r in res.trace.stages][1] == "pre_ranking % 12"
    assert 0 < len(res.units) <= 4
    # explicit cut-offs still win over the preset
    assert _cuts(funnelrag(index, pre_ranker=BM25Scorer(), post_ranker=tiny_t5_path,
                           preset="paper-tqa", k_documents=6)) == (80, 6, 100, 4)


def test_paper_tqa_preset_from_an_evaluation_config(corpus_units, tiny_cross_encoder_path, tiny_t5_path):
    """The evaluation config's ``funnelrag`` component takes the TQA preset by name."""
    from funnel_core.evaluation.config import build_systems

    spec = {"component": "funnelrag", "pre_ranker": tiny_cross_encoder_path, "max_tokens": 40,
            "post_ranker": tiny_t5_path, "preset": "paper-tqa", "fid_kwargs": {"dtype": "float32"}}
    funnel = build_systems({"tqa": spec}, list(corpus_units))["tqa"]
    assert _cuts(funnel) == (80, 12, 100, 4)
    assert isinstance(funnel.stages[-1], FiDAttentionScorer)


def _stage_names(funnel, query="Paris France tower"):
    return [r.name for r in funnel.search(query).trace.stages]


def test_the_funnel_is_retrieval_pre_ranking_later_chunking_post_ranking(corpus_units):
    """The paper's three stages plus later chunking, each under its own name in the trace and in
    the score history; the default preset post-ranks with (a renamed copy of) the pre-ranker, and
    a corpus given as units is clustered here with the index's own default cluster size S."""
    from funnel_core.funnelrag.chunking import LaterChunking

    pre = BM25Scorer()
    funnel = funnelrag(corpus_units, pre_ranker=pre, k_documents=3, k_passages=2, passage_words=6)
    retrieve, pre_stage, chunking, post = funnel.stages
    assert retrieve.index.max_tokens == ClusteredBM25Index().max_tokens
    assert isinstance(chunking, LaterChunking) and chunking.words == 6
    assert type(post) is BM25Scorer and post is not pre and pre.name != "post_ranking"
    res = funnel.search("Paris France tower")
    assert [r.name for r in res.trace.stages] == ["retrieval", "pre_ranking % 3", "later_chunking",
                                                  "post_ranking % 2"]
    assert res.units and all({"pre_ranking", "post_ranking"} <= set(u.scores) for u in res.units)
    small = funnelrag(corpus_units, pre_ranker=pre, max_tokens=12)
    assert small.stages[0].index.max_tokens == 12


def test_a_prebuilt_index_with_the_search_interface_is_used_as_is(corpus_units):
    """An index that is not a ClusteredBM25Index but searches like one (e.g. the Milvus index)
    is used as is, not clustered again."""
    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)

    class DuckIndex:                       # the clustered search interface, by delegation
        def __getattr__(self, name):
            return getattr(index, name)

    duck = DuckIndex()
    funnel = funnelrag(duck, pre_ranker=BM25Scorer())
    assert funnel.stages[0].index is duck
    assert funnel.search("Paris France tower").units


def test_k_retrieved_cuts_the_retrieval_stage(corpus_units):
    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)
    funnel = funnelrag(index, pre_ranker=BM25Scorer(), k_retrieved=2)
    res = funnel.search("Paris France tower")
    first = res.trace.stages[0]
    assert first.name == "retrieval % 2" and first.units_out == 2
    uncut = funnelrag(index, pre_ranker=BM25Scorer()).search("Paris France tower").trace.stages[0]
    assert uncut.name == "retrieval" and uncut.units_out > 2
    with pytest.raises(ValueError, match=r"^k_retrieved must be >= 1, got 0;"):
        funnelrag(index, pre_ranker=BM25Scorer(), k_retrieved=0)
    with pytest.raises(ValueError, match=r"^k_documents must be >= 1, got 0;"):
        funnelrag(index, pre_ranker=BM25Scorer(), k_documents=0)


def test_rankers_given_by_name_get_the_ranker_settings(corpus_units, tiny_cross_encoder_path):
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)
    funnel = funnelrag(index, pre_ranker=tiny_cross_encoder_path, post_ranker=tiny_cross_encoder_path,
                       batch_size=3, max_length=64)
    pre, post = funnel.stages[1], funnel.stages[3]
    for stage, name in ((pre, "pre_ranking"), (post, "post_ranking")):
        assert isinstance(stage, CrossEncoderScorer) and stage.name == name
        assert stage.batch_size == 3 and stage.max_length == 64
    given = BM25Scorer()
    funnel = funnelrag(index, pre_ranker=tiny_cross_encoder_path, post_ranker=given)
    assert type(funnel.stages[3]) is BM25Scorer and funnel.stages[3].name == "post_ranking"


def test_paper_preset_passes_fid_kwargs_and_names_what_it_needs(corpus_units, tiny_t5_path):
    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)
    funnel = funnelrag(index, pre_ranker=BM25Scorer(), post_ranker=tiny_t5_path, preset="paper",
                       fid_kwargs={"dtype": "float32", "batch_size": 3, "lr": 2})
    post = funnel.stages[-1]
    assert (post.dtype, post.batch_size, post.lr) == ("float32", 3, 2)
    with pytest.raises(ValueError, match=r"pass post_ranker= a T5 / FiD checkpoint \(hub name or "
                       r"folder\) or a FiDAttentionScorer, got None; or use preset='default'"):
        funnelrag(index, pre_ranker=BM25Scorer(), preset="paper")


def test_exit_margin_wraps_the_post_ranker_in_a_confident_exit(corpus_units):
    from funnel_core.funnelrag.early_exit import ConfidentExit

    index = ClusteredBM25Index(max_tokens=40).index(corpus_units)
    funnel = funnelrag(index, pre_ranker=BM25Scorer(), exit_margin=0.5, k_passages=3)
    post = funnel.stages[-1]
    assert isinstance(post, ConfidentExit) and post.name == "post_ranking" and post.margin == 0.5
    assert isinstance(post.stage, BM25Scorer) and post.stage.name == "post_ranking"
    assert post.cutoff == 3
    assert _stage_names(funnel)[-1] == "post_ranking % 3"
    assert not isinstance(funnelrag(index, pre_ranker=BM25Scorer()).stages[-1], ConfidentExit)
