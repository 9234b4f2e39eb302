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
