"""FiD cross-attention reranking (FunnelRAG eq. 3, Tables 7-8) and FiD reader training.

The reference computation below runs the tiny T5 the textbook FiD way — all passages padded to
one length, encoded as a batch, concatenated with the padding mask, one decoder step with
``output_attentions=True`` — and aggregates the model's own ``cross_attentions`` with explicit
loops written from eq. 3 / Appendix A.2 (:func:`eq3_reference`). The scorer (chunked encoding,
padding stripped) must agree with it. Hand-made attention blocks pin each Table 7 scheme where
the paper's per-head token selection and the averaged-map order disagree.
"""

from __future__ import annotations

import itertools

import pytest

from funnel_core.errors import ModelLoadError
from funnel_core.rerank.fid import DEFAULT_LAST_K, FiDAttentionScorer, aggregate_cross_attention
from funnel_core.units import Unit

pytestmark = pytest.mark.models  # builds or loads a model in most tests

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
               include_query, last_k=6, steps=1):
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
        a = [[[float(cross[l][h, k * width + t]) for t in toks] for h in range(n_heads)]
             for l in range(n_layers)]
        scores.append(eq3_reference(a, aggregation, lr, last_k))
    return scores


def eq3_reference(a, scheme, lr, last_k=6):
    """FunnelRAG eq. 3 / Appendix A.2 and Table 7 (Appendix C.1), written from the paper.

    ``a[l][h][t]``: attention of layer ``l``, head ``h`` to candidate token ``t``. For every
    (layer, head) the ``lr`` most-attended tokens are picked in that head's own map and averaged
    (scheme "max_tokens": the single most-attended one); heads are averaged (max for
    "max_heads") inside each layer; layers are averaged (max for "max_layers"; only the last
    ``last_k`` for "last_k_layers").
    """
    n_layers = len(a)
    layers = list(range(n_layers))
    if scheme == "last_k_layers":
        layers = layers[-last_k:]
    per_layer = []
    for l in layers:
        per_head = []
        for h in range(len(a[l])):
            ranked = sorted(a[l][h], reverse=True)
            if scheme == "max_tokens":
                per_head.append(ranked[0])
            else:
                chosen = ranked if lr is None else ranked[:lr]
                per_head.append(sum(chosen) / len(chosen))
        if scheme == "max_heads":
            per_layer.append(max(per_head))
        else:
            per_layer.append(sum(per_head) / len(per_head))
    if scheme == "max_layers":
        return max(per_layer)
    return sum(per_layer) / len(per_layer)


PAPER_SCHEMES = ["mean", "max_layers", "max_heads", "max_tokens", "last_k_layers"]


def _score(a, scheme, lr, mask=None, **kw):
    import torch

    t = torch.tensor(a, dtype=torch.float64)
    m = torch.ones(t.shape[-1], dtype=torch.bool) if mask is None else torch.tensor(mask)
    return aggregate_cross_attention(t, m, aggregation=scheme, lr=lr, **kw)


# Hand-made attention blocks ``[layers][heads][tokens]`` for two passages A and B, chosen so the
# paper's per-(layer, head) token selection and the averaged-map order pick different winners.
HAND_MADE = {
    # (i) eq. 3, lr=1, one layer, two heads. A's heads look at different tokens.
    #   per head:      A = (1.0 + 1.0) / 2 = 1.0        B = (0.8 + 0.8) / 2 = 0.8   -> A
    #   averaged map:  A = top1(0.5, 0.5) = 0.5         B = top1(0.8, 0.0) = 0.8   -> B
    "mean": ([[[1.0, 0.0], [0.0, 1.0]]], [[[0.8, 0.0], [0.8, 0.0]]], 1, 1.0, 0.8),
    # (ii) max over layers, lr=1, two layers, two heads; layer 1 looks elsewhere.
    #   per head: layer means A = (1+1)/2 = 1.0, 0.0 -> max 1.0;  B = 0.8, 0.0 -> 0.8   -> A
    #   averaged map: head means A = (.5,.5),(0,0) -> max over layers (.5,.5) -> 0.5; B 0.8 -> B
    "max_layers": ([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]],
                   [[[0.8, 0.0], [0.8, 0.0]], [[0.0, 0.0], [0.0, 0.0]]], 1, 1.0, 0.8),
    # (iii) max over heads, lr=1, two layers, head 1 silent; A's layers look at different tokens.
    #   per head: A = mean(max(1, 0), max(1, 0)) = 1.0;  B = mean(0.8, 0.8) = 0.8       -> A
    #   averaged map: max over heads per token A = (1,0),(0,1) -> layer mean (.5,.5) -> 0.5 -> B
    "max_heads": ([[[1.0, 0.0], [0.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]]],
                  [[[0.8, 0.0], [0.0, 0.0]], [[0.8, 0.0], [0.0, 0.0]]], 1, 1.0, 0.8),
    # (iv) max over tokens (lr is ignored), one layer, two heads.
    #   per head: A = (max(1,0) + max(0,1)) / 2 = 1.0;   B = (0.8 + 0.8) / 2 = 0.8      -> A
    #   averaged map: max(0.5, 0.5) = 0.5 vs max(0.8, 0) = 0.8                           -> B
    "max_tokens": ([[[1.0, 0.0], [0.0, 1.0]]], [[[0.8, 0.0], [0.8, 0.0]]], 4, 1.0, 0.8),
}


@pytest.mark.parametrize("scheme", sorted(HAND_MADE))
def test_table7_scheme_selects_tokens_per_layer_and_head(scheme):
    a, b, lr, want_a, want_b = HAND_MADE[scheme]
    got_a, got_b = _score(a, scheme, lr), _score(b, scheme, lr)
    assert (got_a, got_b) == pytest.approx((want_a, want_b))
    assert (eq3_reference(a, scheme, lr), eq3_reference(b, scheme, lr)) == pytest.approx((want_a, want_b))
    assert got_a > got_b                                           # the paper ranks A first
    old_a = _score(a, "averaged_map_" + scheme, lr)
    old_b = _score(b, "averaged_map_" + scheme, lr)
    assert old_a < old_b                                           # the averaged map ranks B first


def test_defaults_are_eq3_with_lr_4_and_the_averaged_map_values():
    import torch

    # one layer, two heads, six tokens; head 0 peaks on tokens 0-3, head 1 on tokens 2-5
    a = [[[0.4, 0.3, 0.2, 0.1, 0.0, 0.0], [0.0, 0.0, 0.1, 0.2, 0.3, 0.4]]]
    t, mask = torch.tensor(a), torch.ones(6, dtype=torch.bool)
    # defaults: eq. 3 with lr = 4: each head's top 4 mean = 1.0 / 4 = 0.25 -> 0.25
    assert aggregate_cross_attention(t, mask) == pytest.approx(0.25)
    assert _score(a, "mean", 5) == pytest.approx(1.0 / 5)
    # averaged map: head mean (0.2, 0.15, 0.15, 0.15, 0.15, 0.2); top 2 -> 0.2
    assert _score(a, "averaged_map_mean", 2) == pytest.approx(0.2)
    # max over heads per token: (0.4, 0.3, 0.2, 0.2, 0.3, 0.4); top 2 -> 0.4; max -> 0.4
    assert _score(a, "averaged_map_max_heads", 2) == pytest.approx(0.4)
    assert _score(a, "averaged_map_max_heads", 4) == pytest.approx(0.35)
    assert _score(a, "averaged_map_max_tokens", 4) == pytest.approx(0.2)
    # two layers: layer 1 doubles layer 0; max over layers of the head mean, top 2
    two = a + [[[2 * v for v in row] for row in a[0]]]
    assert _score(two, "averaged_map_max_layers", 2) == pytest.approx(0.4)
    assert _score(two, "averaged_map_last_k_layers", 2, last_k=1) == pytest.approx(0.4)
    assert _score(two, "averaged_map_mean", 2) == pytest.approx(0.3)


def test_last_k_layers_defaults_to_the_last_six():
    # eight layers, one head, one token: A attends in layers 2-5, B everywhere a little
    a = [[[v]] for v in (0, 0, 1, 1, 1, 1, 0, 0)]
    b = [[[v]] for v in (1, 1, .5, .5, .5, .5, .6, .6)]
    # last 6 layers: A = 4/6 = 0.667, B = (4 * 0.5 + 2 * 0.6) / 6 = 0.533  -> A
    # last 2 layers: A = 0, B = 0.6 -> B;     all 8 layers: A = 0.5, B = 5.2 / 8 = 0.65 -> B
    assert _score(a, "last_k_layers", 4) == pytest.approx(4 / 6)
    assert _score(b, "last_k_layers", 4) == pytest.approx(3.2 / 6)
    assert _score(a, "last_k_layers", 4, last_k=2) == 0.0
    assert _score(b, "last_k_layers", 4, last_k=2) == pytest.approx(0.6)
    assert _score(a, "last_k_layers", 4, last_k=20) == pytest.approx(0.5)   # fewer layers: all
    assert DEFAULT_LAST_K == 6
    assert FiDAttentionScorer(model="x").last_k == 6


def test_query_tokens_and_lr_follow_the_mask():
    # one layer, one head, tokens: [query 0.9, passage 0.5, passage 0.3, passage 0.1]
    a = [[[0.9, 0.5, 0.3, 0.1]]]
    passage = [False, True, True, True]
    assert _score(a, "mean", 2, passage) == pytest.approx((0.5 + 0.3) / 2)   # query token excluded
    assert _score(a, "mean", 2) == pytest.approx((0.9 + 0.5) / 2)            # query tokens included
    assert _score(a, "mean", None, passage) == pytest.approx(0.9 / 3)        # lr=None: all passage tokens
    assert _score(a, "mean", 10, passage) == pytest.approx(0.3)              # lr above the length
    assert _score(a, "mean", 2, [False] * 4) == 0.0                          # nothing to score
    with pytest.raises(ValueError, match="aggregation must be one of"):
        _score(a, "median", 2)


@pytest.mark.parametrize("scheme", PAPER_SCHEMES)
@pytest.mark.parametrize("lr", [1, 3, None])
def test_aggregation_equals_the_equation_on_random_peaky_maps(scheme, lr):
    import torch

    gen = torch.Generator().manual_seed(7)
    disagreements = 0
    for trial in range(20):
        logits = torch.randn(8, 4, 30, generator=gen, dtype=torch.float64) * 3
        attn = torch.softmax(logits, dim=-1)
        mask = torch.rand(30, generator=gen) > 0.3
        got = aggregate_cross_attention(attn, mask, aggregation=scheme, lr=lr)
        a = attn[:, :, mask].tolist()
        assert got == pytest.approx(eq3_reference(a, scheme, lr), rel=1e-9, abs=1e-12)
        old = aggregate_cross_attention(attn, mask, aggregation="averaged_map_" + scheme, lr=lr)
        disagreements += abs(old - got) > 1e-9
    if not (lr is None and scheme in ("mean", "last_k_layers")):   # all-token means commute
        assert disagreements > 0


@pytest.fixture(scope="module")
def scorer(tiny_t5_path):
    return FiDAttentionScorer(model=tiny_t5_path, dtype="float32")  # the reference runs in fp32


def _with(scorer, **kw):
    """A scorer sharing the loaded model, with other settings."""
    new = FiDAttentionScorer(model=scorer.model_name, dtype=scorer.dtype, **kw)
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
    *[(agg, 4, False) for agg in PAPER_SCHEMES],
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
    assert out[0].scores["fid_attention"] == out[0].score
    assert isinstance(answer, str) and all(u.funnel["fid_answer"] == answer for u in out)
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
