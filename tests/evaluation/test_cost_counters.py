"""Rerankers count their own work (calls, (query, text) pairs) in the scoring path, once per
outermost ``score`` call; funnel_core.counters sums it process-wide."""

from __future__ import annotations

from typing import Sequence

import pytest

from funnel_core import counters
from funnel_core.rerank.base import Reranker
from funnel_core.rerank.bm25 import BM25Scorer
from funnel_core.units import Unit


def test_rank_and_direct_score_both_count_pairs():
    scorer = BM25Scorer()
    units = [Unit(id=str(i), text=t) for i, t in enumerate(["cats purr", "dogs bark", "cats and dogs"])]
    before = counters.snapshot()
    scorer.rank("cats", units)
    scorer.score("dogs", ["dogs bark", "birds sing"])
    diff = counters.difference(counters.snapshot(), before)
    assert (scorer.calls, scorer.pairs_scored) == (2, 5)
    assert diff["model_calls"] == 2 and diff["pairs_scored"] == 5
    assert (scorer % 1).rank("cats", units) and scorer.calls == 2  # a cut copy counts on itself


def test_a_scorer_calling_another_counts_once():
    inner = BM25Scorer()

    class Wrapper(Reranker):
        def score(self, query: str, texts: Sequence[str]) -> list[float]:
            return [s * 2 for s in inner.score(query, texts)]

    w = Wrapper()
    before = counters.snapshot()
    w.score("q", ["a", "b", "c"])
    diff = counters.difference(counters.snapshot(), before)
    assert (w.calls, w.pairs_scored) == (1, 3) and inner.calls == 0
    assert diff["pairs_scored"] == 3


def test_a_failed_score_counts_nothing():
    class Broken(Reranker):
        def score(self, query: str, texts: Sequence[str]) -> list[float]:
            raise RuntimeError("backend down")

    b = Broken()
    with pytest.raises(RuntimeError):
        b.score("q", ["a"])
    assert b.calls == 0 and b.pairs_scored == 0
    with pytest.raises(KeyError, match="unknown counter"):
        counters.add(pairs=1)


def test_a_local_llm_counts_prompts_and_tokens(tiny_llama_path):
    from funnel_core.llm import TransformersLLM

    llm = TransformersLLM(tiny_llama_path, batch_size=2, use_chat_template=False)
    tok = llm.tokenizer
    prompts = ["what is bm25", "a longer prompt about cross encoders and rerankers"]
    expected_prompt_tokens = sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    before = counters.snapshot()
    out = llm.generate(prompts, max_new_tokens=3)
    llm.next_token_logprobs(prompts[:1], ["True", "False"])
    diff = counters.difference(counters.snapshot(), before)
    assert diff["llm_calls"] == 3  # two generated prompts, one scored prompt
    # prompt tokens read: each prompt once for generation, the first once more for the log-probs;
    # padding is not counted
    assert diff["llm_prompt_tokens"] == expected_prompt_tokens + len(tok(prompts[0], add_special_tokens=False)["input_ids"])
    assert 0 < diff["llm_completion_tokens"] <= 2 * 3 and len(out) == 2


def test_fid_passages_are_counted_apart_from_cross_encoder_pairs(tiny_t5_path, tiny_cross_encoder_path):
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from funnel_core.rerank.fid import FiDAttentionScorer

    units = [Unit(id=str(i), text=t, metadata={"title": f"T{i}"})
             for i, t in enumerate(["cats purr", "dogs bark", "cats and dogs"])]
    ce = CrossEncoderScorer(tiny_cross_encoder_path, device="cpu", runtime="torch")
    fid = FiDAttentionScorer(model=tiny_t5_path, device="cpu", max_length=32)
    before = counters.snapshot()
    ce.rank("cats", units)
    fid.rank("cats", units[:2])          # through rank (titles read from the units)
    fid.score("dogs", ["dogs bark"])     # and through score
    diff = counters.difference(counters.snapshot(), before)
    # pairs_scored is every pair either model scored; fid_passages the reader's share alone
    assert diff["pairs_scored"] == 6 and diff["fid_passages"] == 3 and diff["model_calls"] == 3
    assert (fid.calls, fid.pairs_scored) == (2, 3)
