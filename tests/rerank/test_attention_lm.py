"""Decoder-only attention reranking (ICR-style, calibrated) with the tiny Llama.

The reference runs the whole prompt (passages + query) through the model in one plain forward
pass with ``output_attentions=True`` — no KV cache, no grouping — and sums the attention the
query tokens pay to each passage's tokens by hand.
"""

from __future__ import annotations

import os

import pytest

from funnel_core.errors import ModelLoadError
from funnel_core.rerank.attention_lm import AttentionLMScorer
from funnel_core.units import Unit

pytestmark = pytest.mark.models  # builds or loads a model in most tests

QUERY = "who wrote the tragedy Hamlet?"
TEXTS = [
    "Paris is the capital of France.",
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "BM25 ranks documents by term frequency.",
]


def _mass(model, ids, spans, positions):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    n_layers = len(out.attentions)
    n_heads = out.attentions[0].shape[1]
    masses = []
    for a, b in spans:
        total = 0.0
        for layer in out.attentions:
            for h in range(n_heads):
                for p in positions:
                    total += float(layer[0, h, p, a:b].sum())
        masses.append(total / (n_layers * n_heads * len(positions)))
    return masses


def _reference(scorer, query, texts):
    head, pieces, suffixes = scorer.layout(query, texts)
    prefix, spans = list(head), []
    for p in pieces:
        spans.append((len(prefix), len(prefix) + len(p)))
        prefix += p
    results = []
    for ids, positions in suffixes:
        results.append(_mass(scorer.model, prefix + ids, spans, [len(prefix) + q for q in positions]))
    if len(results) == 1:
        return results[0]
    return [r - c for r, c in zip(*results)]


@pytest.fixture(scope="module")
def scorer(tiny_llama_path):
    return AttentionLMScorer(model=tiny_llama_path, dtype="float32")  # the reference runs in fp32


def _with(scorer, **kw):
    new = AttentionLMScorer(model=scorer.model_name, dtype=scorer.dtype, **kw)
    new._model = scorer._model
    return new


def test_layout_marks_passages_and_query(scorer):
    def text(ids):  # the tiny byte-level tokenizer decodes with extra spaces: compare without
        return "".join(scorer.tokenizer.decode(ids).split())

    head, pieces, suffixes = scorer.layout(QUERY, TEXTS)
    assert text(head).startswith("<|im_start|>user")                    # chat template used
    for i, (piece, passage) in enumerate(zip(pieces, TEXTS)):
        assert text(piece) == "".join(f"[{i + 1}] {passage}".split())
    (ids, positions), (cal_ids, cal_positions) = suffixes
    assert text([ids[p] for p in positions]) == "".join(QUERY.split())
    assert text([cal_ids[p] for p in cal_positions]) == "N/A"
    assert text(ids).endswith("<|im_start|>assistant")


@pytest.mark.parametrize("kw", [
    {},                                            # calibrated, query tokens attend (ICR)
    {"calibration_query": None},                   # raw attention
    {"attend_from": "answer"},                     # the position predicting the first answer token
    {"use_chat_template": False, "calibration_query": "none"},
    {"fast_prefix": False},                        # passages encoded with eager attention too
])
def test_scores_equal_full_prompt_reference(scorer, kw):
    s = _with(scorer, **kw)
    got = s.score(QUERY, TEXTS)
    want = _reference(s, QUERY, TEXTS)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert all(type(x) is float for x in got)


def test_calibration_subtracts_content_free_attention(scorer):
    raw = _with(scorer, calibration_query=None).score(QUERY, TEXTS)
    cal = scorer.score(QUERY, TEXTS)
    na = _with(scorer, calibration_query=None).score("N/A", TEXTS)
    assert cal == pytest.approx([r - n for r, n in zip(raw, na)], rel=1e-4, abs=1e-7)
    raw_part, cal_part = scorer.score_components(QUERY, TEXTS)       # both from one pass
    assert raw_part == pytest.approx(raw, rel=1e-4) and cal_part == pytest.approx(na, rel=1e-4)
    assert _with(scorer, calibration_query=None).score_components(QUERY, TEXTS)[1] is None


def test_long_inputs_are_split_into_groups_that_fit(scorer):
    head, pieces, suffixes = scorer.layout(QUERY, TEXTS)
    fixed = len(head) + max(len(s[0]) for s in suffixes)
    # room for the two longest passages but not all three
    limit = fixed + sorted(len(p) for p in pieces)[-1] + sorted(len(p) for p in pieces)[-2]
    grouped = _with(scorer, max_context=limit).score(QUERY, TEXTS)
    first = scorer.score(QUERY, TEXTS[:2])
    assert grouped[:2] == pytest.approx(first, rel=1e-4)      # group 1 = passages 1-2 alone
    with pytest.raises(ValueError, match="does not fit"):
        _with(scorer, max_context=fixed + 2).score(QUERY, TEXTS)
    truncated = _with(scorer, max_passage_tokens=3).layout(QUERY, TEXTS)[1]
    assert all(len(p) <= 3 + len(scorer._ids("[1] ")) + len(scorer._ids("\n\n")) for p in truncated)


def test_stage_behaviour_and_errors(scorer):
    units = [Unit(id=f"u{i}", text=t, score=1.0) for i, t in enumerate(TEXTS)]
    out = (scorer % 2)(QUERY, units)
    assert len(out) == 2 and out[0].score >= out[1].score
    assert out[0].scores["attention_lm"] == out[0].score
    assert scorer(QUERY, []) == []
    assert [u.id for u in scorer(" ", units)] == [u.id for u in units][:scorer.limit(scorer.top_n)
                                                                      or len(units)]
    with pytest.raises(ValueError, match="attend_from"):
        AttentionLMScorer(model="x", attend_from="passage")
    with pytest.raises(ValueError, match="calibration_query"):
        AttentionLMScorer(model="x", calibration_query=" ")
    with pytest.raises(ValueError, match=r"\{query\}"):
        AttentionLMScorer(model="x", query_template="Question:")
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-lm"):
        AttentionLMScorer(model="no-such-org/no-such-lm").score(QUERY, TEXTS)


def test_encoder_decoder_model_is_rejected(tiny_t5_path):
    with pytest.raises((TypeError, ModelLoadError)):
        AttentionLMScorer(model=tiny_t5_path).score(QUERY, TEXTS)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FUNNEL_SLOW"),
                    reason="loads SmolLM2 from GGUF (~60 s); set FUNNEL_SLOW=1")
def test_smollm2_ranks_the_answer_passage_first():
    from funnel_core.testing import SMOLLM2_GGUF, smollm2_path

    s = AttentionLMScorer(model=smollm2_path(), gguf_file=SMOLLM2_GGUF)
    scores = s.score("Who wrote Hamlet?", TEXTS)
    assert max(range(3), key=scores.__getitem__) == 1
