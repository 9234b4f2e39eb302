"""FiD cross-attention reranking (FunnelRAG eq. 3, Tables 7-8) and FiD reader training.

The reference computation below runs the tiny T5 the textbook FiD way — all passages padded to
one length, encoded as a batch, concatenated with the padding mask, one decoder step with
``output_attentions=True`` — and aggregates the model's own ``cross_attentions`` with explicit
loops. The scorer (chunked encoding, padding stripped) must agree with it.
"""

from __future__ import annotations

import itertools

import pytest

from funnel_core.errors import ModelLoadError
from funnel_core.rerank.fid import AGGREGATIONS, FiDAttentionScorer
from funnel_core.units import Unit

QUERY = "who wrote the tragedy Hamlet?"
TEXTS = [
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "Paris is the capital of France.",
    "BM25 is a ranking function used by search engines to rank documents by term frequency "
    "and inverse document frequency; it is a bag-of-words model with two free parameters.",
    "Shakespeare was an English playwright.",
]
TITLES = ["Hamlet", None, "BM25", "Shakespeare"]


def _reference(scorer: FiDAttentionScorer, query, texts, titles, *, aggregation, lr,
               include_query, last_k=2, steps=1):
    """Textbook FiD forward (padded batch + mask) and explicit-loop aggregation."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    model, tok = scorer.model, scorer.tokenizer
    inputs = scorer.build_inputs(query, texts, titles)  # token roles only
    n, width = len(texts), max(inputs.lengths)
    ids = torch.full((n, width), tok.pad_token_id)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, x in enumerate(inputs.input_ids):
        ids[i, :len(x)] = x
        mask[i, :len(x)] = 1
    with torch.no_grad():
        states = model.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        enc = BaseModelOutput(last_hidden_state=states.reshape(1, n * width, -1))
        flat_mask = mask.reshape(1, n * width)
        dec = torch.tensor([[model.config.decoder_start_token_id]])
        if steps > 1:
            gen = model.generate(encoder_outputs=enc, attention_mask=flat_mask,
                                 decoder_input_ids=dec, max_new_tokens=steps - 1, do_sample=False)
            dec = gen[:, :steps]
        out = model(encoder_outputs=enc, attention_mask=flat_mask, decoder_input_ids=dec,
                    output_attentions=True)
    cross = [a[0].mean(dim=1) for a in out.cross_attentions]  # per layer [H, n*width]
    n_layers, n_heads = len(cross), cross[0].shape[0]
    scores = []
    for k in range(n):
        keep = inputs.passage_mask[k] | inputs.query_mask[k] if include_query else inputs.passage_mask[k]
        toks = [t for t in range(inputs.lengths[k]) if keep[t]]
        a = {(l, h, t): float(cross[l][h, k * width + t])
             for l in range(n_layers) for h in range(n_heads) for t in toks}
        if aggregation in ("mean", "max_layers", "last_k_layers"):
            layers = range(n_layers - last_k, n_layers) if aggregation == "last_k_layers" else range(n_layers)
            per_layer = {(l, t): sum(a[l, h, t] for h in range(n_heads)) / n_heads
                         for l in layers for t in toks}
            if aggregation == "max_layers":
                per_tok = [max(per_layer[l, t] for l in layers) for t in toks]
            else:
                per_tok = [sum(per_layer[l, t] for l in layers) / len(layers) for t in toks]
        elif aggregation == "max_heads":
            per_tok = [sum(max(a[l, h, t] for h in range(n_heads)) for l in range(n_layers)) / n_layers
                       for t in toks]
        else:  # max_tokens
            per_tok = [sum(a[l, h, t] for l in range(n_layers) for h in range(n_heads))
                       / (n_layers * n_heads) for t in toks]
            scores.append(max(per_tok))
            continue
        best = sorted(per_tok, reverse=True)[: (len(per_tok) if lr is None else lr)]
        scores.append(sum(best) / len(best))
    return scores


@pytest.fixture(scope="module")
def scorer(tiny_t5_path):
    return FiDAttentionScorer(model=tiny_t5_path)


def _with(scorer, **kw):
    """A scorer sharing the loaded model, with other settings."""
    new = FiDAttentionScorer(model=scorer.model_name, **kw)
    new._model = scorer._model
    return new


def test_token_roles_follow_the_template(scorer):
    inputs = scorer.build_inputs(QUERY, TEXTS[:2], TITLES[:2])
    tok = scorer.tokenizer
    passage0 = tok.decode(inputs.input_ids[0][inputs.passage_mask[0]]).split()
    assert passage0 == ("Hamlet " + TEXTS[0]).split()          # title + text, no "context:"
    assert tok.decode(inputs.input_ids[1][inputs.passage_mask[1]]).split() == TEXTS[1].split()
    assert tok.decode(inputs.input_ids[0][inputs.query_mask[0]]).split() == QUERY.split()
    assert not (inputs.passage_mask[0] & inputs.query_mask[0]).any()


@pytest.mark.parametrize("aggregation,lr,include_query", [
    *[(agg, 4, False) for agg in AGGREGATIONS],
    ("mean", None, False),       # mean over every passage token
    ("mean", 1, False),
    ("mean", 4, True),           # Table 8: query tokens included
    ("max_heads", 2, True),
])
def test_scores_equal_reference_cross_attention(scorer, aggregation, lr, include_query):
    s = _with(scorer, aggregation=aggregation, lr=lr, include_query_tokens=include_query,
              batch_size=3)
    got, _ = s.score_with_titles(QUERY, TEXTS, TITLES)
    want = _reference(s, QUERY, TEXTS, TITLES, aggregation=aggregation, lr=lr,
                      include_query=include_query)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert all(type(x) is float for x in got)


def test_last_k_layers_and_decoder_steps_match_reference(scorer):
    s = _with(scorer, aggregation="last_k_layers", last_k=1, decoder_steps=3)
    got, _ = s.score_with_titles(QUERY, TEXTS, TITLES)
    want = _reference(s, QUERY, TEXTS, TITLES, aggregation="last_k_layers", lr=4,
                      include_query=False, last_k=1, steps=3)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_passage_order_does_not_change_scores(scorer):
    base = dict(zip(TEXTS, scorer.score(QUERY, TEXTS)))
    for perm in list(itertools.permutations(range(len(TEXTS))))[1:6]:
        texts = [TEXTS[i] for i in perm]
        for t, s in zip(texts, scorer.score(QUERY, texts)):
            assert s == pytest.approx(base[t], rel=1e-5)


def test_padding_does_not_leak_into_scores(scorer):
    long_text = " ".join(["Shakespeare wrote many plays and sonnets in London."] * 12)
    texts = ["Hamlet is a tragedy.", long_text]
    alone = _with(scorer, batch_size=1).score(QUERY, texts)      # no padding anywhere
    padded = _with(scorer, batch_size=2).score(QUERY, texts)     # short one padded to the long one
    assert padded == pytest.approx(alone, rel=1e-5)
    # and the reference (padded batch + attention mask) agrees too
    ref = _reference(scorer, QUERY, texts, None, aggregation="mean", lr=4, include_query=False)
    assert padded == pytest.approx(ref, rel=1e-4)


def test_rank_reads_titles_and_returns_answer(scorer):
    s = _with(scorer, return_answer=True, max_answer_tokens=5)
    units = [Unit(id=f"u{i}", text=t, score=1.0, metadata={"title": ti} if ti else {})
             for i, (t, ti) in enumerate(zip(TEXTS, TITLES))]
    out = s(QUERY, units)
    expected, answer = s.score_with_titles(QUERY, TEXTS, TITLES)
    by_id = {u.id: u for u in out}
    assert [by_id[f"u{i}"].score for i in range(4)] == pytest.approx(expected)
    assert [u.score for u in out] == sorted((u.score for u in out), reverse=True)
    assert out[0].metadata["scores"]["fid_attention"] == out[0].score
    assert isinstance(answer, str) and all(u.metadata["fid_answer"] == answer for u in out)
    assert units[0].score == 1.0 and "scores" not in units[0].metadata   # inputs untouched
    untitled = s.score_with_titles(QUERY, TEXTS)[0]
    assert untitled != pytest.approx(expected)                           # titles were used
    assert len(s(QUERY, units)) == 4 and len((s % 2)(QUERY, units)) == 2


def test_empty_inputs_and_bad_config(scorer, tiny_llama_path):
    assert scorer(QUERY, []) == [] and scorer("  ", [Unit(id="a", text="x")]) == []
    with pytest.raises(ValueError, match="aggregation must be one of"):
        FiDAttentionScorer(model="x", aggregation="median")
    with pytest.raises(ValueError, match="lacks the field"):
        FiDAttentionScorer(model="x", template="context: {text}")
    with pytest.raises(ValueError, match="lr must be >= 1"):
        FiDAttentionScorer(model="x", lr=0)
    with pytest.raises(TypeError, match="model must be"):
        FiDAttentionScorer(model=None)  # type: ignore[arg-type]
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-t5"):
        FiDAttentionScorer(model="no-such-org/no-such-t5").score(QUERY, TEXTS)
    with pytest.raises((TypeError, ModelLoadError)):
        FiDAttentionScorer(model=tiny_llama_path).score(QUERY, TEXTS)


def test_fid_training_reduces_loss_and_checkpoint_loads(tiny_t5_path, tmp_path):
    from funnel_core.train.fid import FiDExample, evaluate_fid_loss, train_fid

    examples = [
        FiDExample("who wrote Hamlet?", ["Shakespeare"],
                   [("Hamlet", "Hamlet is a tragedy by Shakespeare."), "Paris is in France."]),
        FiDExample("capital of France?", ["Paris"],
                   ["Paris is the capital of France.", {"title": "Berlin", "text": "Berlin is in Germany."}]),
        FiDExample("what ranks documents?", "BM25", ["BM25 ranks documents."]),
    ]
    before = evaluate_fid_loss(tiny_t5_path, examples, n_passages=2)
    result = train_fid(tiny_t5_path, examples, tmp_path / "fid", n_passages=2, epochs=8,
                       batch_size=3, learning_rate=5e-3, progress=False, device="cpu")
    after = evaluate_fid_loss(result.output_dir, examples, n_passages=2)
    assert after < 0.7 * before
    assert result.epoch_losses[-1] < result.epoch_losses[0] and result.steps == 8
    trained = FiDAttentionScorer(model=result.output_dir)
    scores = trained.score("who wrote Hamlet?", ["Hamlet is a tragedy by Shakespeare.", "Paris is in France."])
    assert len(scores) == 2 and all(s > 0 for s in scores)
    with pytest.raises(ValueError, match="no passages"):
        FiDExample("q?", ["a"], [])
    with pytest.raises(ValueError, match="empty list"):
        train_fid(tiny_t5_path, [], tmp_path / "x")
