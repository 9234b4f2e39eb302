"""FiD cross-attention reranking (FunnelRAG eq. 3, Tables 7-8) and FiD reader training.

The reference computation below runs the tiny T5 the textbook FiD way (all passages padded to
one length, encoded as a batch, concatenated with the padding mask, one decoder step) with an
attention function registered here that records the raw score ``alpha`` each cross-attention
module passes to its softmax (a route into the model independent of the scorer's hooks), and
aggregates it with loops written from eq. 3 and Table 7 as the paper writes them
(:func:`paper_reference`). Hand-made ``alpha`` tensors pin each scheme where the paper's reading
and the earlier readings (probabilities instead of alpha; max/mean over selected tokens for (ii)
and (iii); lr kept in Table 8) pick different winners.
"""

from __future__ import annotations

import itertools
import math

import pytest

from funnel_core.errors import ModelLoadError
from funnel_core.rerank.fid import DEFAULT_LAST_K, FiDAttentionScorer, aggregate_cross_attention
from funnel_core.units import Unit
from tests.rerank.fid_reference import padded_fid_encoding

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
PAPER_SCHEMES = ["mean", "max_layers", "max_heads", "max_tokens", "last_k_layers"]


def paper_reference(a, scheme, lr, last_k=6):
    """Table 7 of FunnelRAG (Appendix C.1) over ``a[i][j][k]`` = alpha_{0,i,j,k}: layer ``i``,
    head ``j``, token ``k`` of the passage; written from the paper, one loop per sum.

    (i)   eq. 3: 1/(L H lr) sum_i sum_j sum_{k in top-lr(i, j)} alpha_{0,i,j,k}
    (ii)  mean_{j,k} max_i alpha_{0,i,j,k}          (all tokens)
    (iii) mean_{i,k} max_j alpha_{0,i,j,k}          (all tokens)
    (iv)  mean_{i,j} max_k alpha_{0,i,j,k}
    (v)   eq. 3 over the last ``last_k`` layers
    """
    L, H, K = len(a), len(a[0]), len(a[0][0])
    if scheme == "max_layers":
        return sum(max(a[i][j][k] for i in range(L)) for j in range(H) for k in range(K)) / (H * K)
    if scheme == "max_heads":
        return sum(max(a[i][j][k] for j in range(H)) for i in range(L) for k in range(K)) / (L * K)
    if scheme == "max_tokens":
        return sum(max(a[i][j]) for i in range(L) for j in range(H)) / (L * H)
    layers = range(max(0, L - last_k), L) if scheme == "last_k_layers" else range(L)
    n = K if lr is None else min(lr, K)
    total = 0.0
    for i in layers:
        for j in range(H):
            total += sum(sorted(a[i][j], reverse=True)[:n])
    return total / (len(layers) * H * n)


def _score(a, scheme, lr, mask=None, **kw):
    import torch

    t = torch.tensor(a, dtype=torch.float64)
    m = torch.ones(t.shape[-1], dtype=torch.bool) if mask is None else torch.tensor(mask)
    return aggregate_cross_attention(t, m, aggregation=scheme, lr=lr, **kw)


def _softmax_over_passages(blocks):
    """Per (layer, head), one softmax over every passage's tokens (FiD's concatenation)."""
    L, H = len(blocks[0]), len(blocks[0][0])
    out = [[[[0.0] * len(b[0][0]) for _ in range(H)] for _ in range(L)] for b in blocks]
    for i in range(L):
        for j in range(H):
            z = sum(math.exp(x) for b in blocks for x in b[i][j])
            for p, b in enumerate(blocks):
                out[p][i][j] = [math.exp(x) / z for x in b[i][j]]
    return out


def test_eq3_on_alpha_and_on_probabilities_pick_different_winners():
    # one layer, two heads, lr=1; passage C makes head 0's softmax normaliser huge
    A = [[[3.0], [0.0]]]
    B = [[[0.0], [2.5]]]
    C = [[[10.0], [0.0]]]
    # on alpha (the paper): A = (3 + 0) / 2 = 1.5 > B = (0 + 2.5) / 2 = 1.25
    assert paper_reference(A, "mean", 1) == pytest.approx(1.5)
    assert _score(A, "mean", 1) > _score(B, "mean", 1)
    # on probabilities, head 0 is crushed by C and head 1 decides: B wins
    pA, pB, _ = _softmax_over_passages([A, B, C])
    assert _score(pA, "mean", 1) < _score(pB, "mean", 1)
    # log-probabilities differ from alpha by one constant per (layer, head): same winner as alpha
    lA, lB = ([[[math.log(x) for x in h] for h in layer] for layer in p] for p in (pA, pB))
    assert _score(lA, "mean", 1) > _score(lB, "mean", 1)
    assert _score(A, "mean", 1) - _score(lA, "mean", 1) == pytest.approx(
        _score(B, "mean", 1) - _score(lB, "mean", 1))


# Hand-made alpha blocks ``[layers][heads][tokens]`` for passages A and B where Table 7 as the
# paper writes it and the earlier reading (max/mean over the lr selected tokens, max outside
# the mean) rank the two oppositely.
def _old_reading(a, scheme, lr):
    """The earlier code: s[i][j] = mean of top-lr tokens; then max over layers of the head mean
    ((ii)) or the layer mean of the max over heads ((iii))."""
    s = [[sum(sorted(h, reverse=True)[:lr]) / min(lr, len(h)) for h in layer] for layer in a]
    if scheme == "max_layers":
        return max(sum(layer) / len(layer) for layer in s)
    return sum(max(layer) for layer in s) / len(s)


HAND_MADE = {
    # (ii) two layers, one head, three tokens, lr=1.
    #   paper: mean_k max_i: A = (1 + 1 + 1) / 3 = 1.0;  B = (3 + 0 + 0) / 3 = 1.0 ... see below
    "max_layers": ([[[1.0, 0.0, 1.0]], [[0.0, 1.0, 0.0]]],      # A: max_i = (1, 1, 1) -> 1.0
                   [[[2.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]]]),     # B: max_i = (2, 0, 0) -> 0.667
    # (iii) one layer, two heads, three tokens, lr=1: the same maps with heads for layers.
    "max_heads": ([[[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]],
                  [[[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]),
}


@pytest.mark.parametrize("scheme", sorted(HAND_MADE))
def test_table7_ii_iii_average_all_tokens_of_the_max(scheme):
    a, b = HAND_MADE[scheme]
    assert paper_reference(a, scheme, 1) == pytest.approx(1.0)
    assert paper_reference(b, scheme, 1) == pytest.approx(2 / 3)
    assert (_score(a, scheme, 1), _score(b, scheme, 1)) == pytest.approx((1.0, 2 / 3))
    # lr is not used by (ii) / (iii): every token counts
    assert _score(a, scheme, 4) == _score(a, scheme, None) == _score(a, scheme, 1)
    # the earlier reading (top-lr tokens, max outside the mean) ranks B first
    assert _old_reading(a, scheme, 1) < _old_reading(b, scheme, 1)


def test_table7_iv_and_v_select_tokens_per_layer_and_head():
    # (iv): one layer, two heads; A's heads peak on different tokens.
    #   paper: mean_{i,j} max_k: A = (1 + 1) / 2 = 1.0;  B = (0.8 + 0.8) / 2 = 0.8     -> A
    #   max over the head-averaged map (earlier order): A = 0.5, B = 0.8             -> B
    A, B = [[[1.0, 0.0], [0.0, 1.0]]], [[[0.8, 0.0], [0.8, 0.0]]]
    assert (_score(A, "max_tokens", 4), _score(B, "max_tokens", 4)) == pytest.approx((1.0, 0.8))
    assert (paper_reference(A, "max_tokens", 4), paper_reference(B, "max_tokens", 4)) == \
        pytest.approx((1.0, 0.8))
    # (i) with lr=1 on the same maps: selection per (layer, head) -> same values
    assert (_score(A, "mean", 1), _score(B, "mean", 1)) == pytest.approx((1.0, 0.8))


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


def test_defaults_are_eq3_with_lr_4():
    import torch

    # one layer, two heads, six tokens; head 0 peaks on tokens 0-3, head 1 on tokens 2-5
    a = [[[0.4, 0.3, 0.2, 0.1, 0.0, 0.0], [0.0, 0.0, 0.1, 0.2, 0.3, 0.4]]]
    t, mask = torch.tensor(a), torch.ones(6, dtype=torch.bool)
    # defaults: eq. 3 with lr = 4: each head's top 4 mean = 1.0 / 4 = 0.25 -> 0.25
    assert aggregate_cross_attention(t, mask) == pytest.approx(0.25)
    assert _score(a, "mean", 5) == pytest.approx(1.0 / 5)
    assert FiDAttentionScorer(model="x").score_on == "alpha"


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
def test_aggregation_equals_the_paper_on_random_maps(scheme, lr):
    import torch

    gen = torch.Generator().manual_seed(7)
    for _ in range(20):
        alpha = torch.randn(8, 4, 30, generator=gen, dtype=torch.float64) * 3
        mask = torch.rand(30, generator=gen) > 0.3
        got = aggregate_cross_attention(alpha, mask, aggregation=scheme, lr=lr)
        assert got == pytest.approx(paper_reference(alpha[:, :, mask].tolist(), scheme, lr),
                                    rel=1e-9, abs=1e-12)


def _reference(scorer: FiDAttentionScorer, query, texts, titles, *, aggregation, lr,
               include_query, last_k=6, steps=1, quantity="alpha"):
    """Textbook FiD forward (padded batch + mask) with a recording attention function; the
    raw score alpha each decoder cross-attention module feeds its softmax, aggregated with
    :func:`paper_reference`. Table 8 "w/ query": every question + passage token, no lr."""
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface, AutoModelForSeq2SeqLM
    from transformers.masking_utils import eager_mask

    recorded: list = []

    def recording(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  position_bias=None, **kw):
        w = torch.matmul(query, key.transpose(2, 3)) * (1.0 if scaling is None else scaling)
        if position_bias is not None:
            w = w + position_bias
        raw = w
        if attention_mask is not None:
            w = w + attention_mask
        recorded.append((module, raw))
        p = torch.softmax(w, dim=-1)
        return torch.matmul(p, value).transpose(1, 2).contiguous(), p

    AttentionInterface.register("test_recording_scores", recording)
    AttentionMaskInterface.register("test_recording_scores", eager_mask)   # additive masks
    model = AutoModelForSeq2SeqLM.from_pretrained(scorer.model_name,
                                                  attn_implementation="test_recording_scores")
    model.eval()
    tok = scorer.tokenizer
    inputs = scorer.build_inputs(query, texts, titles)  # token roles only
    n = len(texts)
    enc, flat_mask, width = padded_fid_encoding(model, tok.pad_token_id, inputs)
    with torch.no_grad():
        dec = torch.tensor([[model.config.decoder_start_token_id]])
        if steps > 1:
            gen = model.generate(encoder_outputs=enc, attention_mask=flat_mask,
                                 decoder_input_ids=dec, max_new_tokens=steps - 1, do_sample=False)
            dec = gen[:, :steps]
        recorded.clear()
        out = model(encoder_outputs=enc, attention_mask=flat_mask, decoder_input_ids=dec,
                    output_attentions=True, use_cache=False)
    cross_modules = [block.layer[1].EncDecAttention for block in model.decoder.block]
    alpha = [next(w for m, w in recorded if m is cm)[0] for cm in cross_modules]  # [H, S, n*width]
    if quantity == "log_attention":
        maps = [p[0].log().mean(dim=1) for p in out.cross_attentions]
    elif quantity == "attention":
        maps = [p[0].mean(dim=1) for p in out.cross_attentions]
    else:
        maps = [x.mean(dim=1) for x in alpha]                               # mean over positions
    n_layers, n_heads = len(maps), maps[0].shape[0]
    scores = []
    for k in range(n):
        keep = inputs.passage_mask[k] | inputs.query_mask[k] if include_query else inputs.passage_mask[k]
        toks = [t for t in range(inputs.lengths[k]) if keep[t]]
        a = [[[float(maps[i][j, k * width + t]) for t in toks] for j in range(n_heads)]
             for i in range(n_layers)]
        scores.append(paper_reference(a, aggregation, None if include_query else lr, last_k))
    return scores


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
    ("mean", 4, True),           # Table 8 "w/ query": all question + passage tokens, lr unused
])
def test_scores_equal_reference_alpha(scorer, aggregation, lr, include_query):
    s = _with(scorer, aggregation=aggregation, lr=lr, include_query_tokens=include_query,
              batch_size=3)
    got, _ = s.score_with_titles(QUERY, TEXTS, TITLES)
    want = _reference(s, QUERY, TEXTS, TITLES, aggregation=aggregation, lr=lr,
                      include_query=include_query)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert all(type(x) is float for x in got)


@pytest.mark.parametrize("quantity", ["log_attention", "attention"])
@pytest.mark.parametrize("aggregation", PAPER_SCHEMES)
def test_other_quantities_equal_reference(scorer, quantity, aggregation):
    s = _with(scorer, aggregation=aggregation, score_on=quantity, batch_size=3)
    got, _ = s.score_with_titles(QUERY, TEXTS, TITLES)
    want = _reference(s, QUERY, TEXTS, TITLES, aggregation=aggregation, lr=4,
                      include_query=False, quantity=quantity)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_softmax_of_alpha_is_the_models_attention(scorer):
    import torch

    inputs = scorer.build_inputs(QUERY, TEXTS, TITLES)
    states = scorer.encode(inputs)
    dec, _ = scorer._decoder_prefix(states)
    alpha, probs = scorer.raw_scores(states, dec)
    assert alpha.shape == probs.shape == (2, 4, sum(inputs.lengths))
    assert torch.allclose(torch.softmax(alpha, dim=-1), probs, atol=1e-6)
    assert torch.allclose(probs, scorer.cross_attention(states, dec), atol=1e-6)


@pytest.mark.parametrize("aggregation,include_query", [
    ("mean", False), ("max_tokens", False), ("last_k_layers", False), ("mean", True)])
def test_log_attention_is_alpha_minus_one_constant_shared_by_passages(scorer, aggregation,
                                                                      include_query):
    """The rank-equivalence, proved on the tiny T5: one softmax per (layer, head, decoder
    position) spans every passage, so log p = alpha - c[i, j] and the mean over any selected
    tokens shifts every passage's score by the same mean of c."""
    texts = TEXTS + ["Hamlet, Prince of Denmark, by Shakespeare.", "Berlin is in Germany."]
    kw = dict(aggregation=aggregation, include_query_tokens=include_query)
    alpha = _with(scorer, **kw).score(QUERY, texts)
    logp = _with(scorer, score_on="log_attention", **kw).score(QUERY, texts)
    shift = [x - y for x, y in zip(alpha, logp)]
    assert max(shift) - min(shift) < 1e-4 * max(1.0, abs(shift[0]))
    assert sorted(range(len(texts)), key=alpha.__getitem__) == \
        sorted(range(len(texts)), key=logp.__getitem__)


def test_include_query_tokens_is_table8_and_bad_settings_fail():
    with pytest.raises(ValueError, match="Table 8"):
        FiDAttentionScorer(model="x", include_query_tokens=True, aggregation="max_heads")
    with pytest.raises(ValueError, match="score_on must be one of"):
        FiDAttentionScorer(model="x", score_on="probs")


def test_table8_with_query_ignores_lr(scorer):
    one = _with(scorer, include_query_tokens=True, lr=1).score(QUERY, TEXTS)
    four = _with(scorer, include_query_tokens=True, lr=4).score(QUERY, TEXTS)
    assert one == four


def test_last_k_layers_and_decoder_steps_match_reference(scorer):
    s = _with(scorer, aggregation="last_k_layers", last_k=1, decoder_steps=3)
    got, _ = s.score_with_titles(QUERY, TEXTS, TITLES)
    want = _reference(s, QUERY, TEXTS, TITLES, aggregation="last_k_layers", lr=4,
                      include_query=False, last_k=1, steps=3)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_return_answer_still_scores_the_first_decoder_token(scorer):
    """Eq. 3 reads alpha_0: the first decoder token. Generating an answer (return_answer=True)
    runs the decoder further, but the scores must stay those of the first token: equal to the
    reference's one-step forward and to the scores without the answer."""
    s = _with(scorer, return_answer=True, max_answer_tokens=5)
    got, answer = s.score_with_titles(QUERY, TEXTS, TITLES)
    assert isinstance(answer, str)
    want = _reference(s, QUERY, TEXTS, TITLES, aggregation="mean", lr=4, include_query=False)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert got == pytest.approx(scorer.score_with_titles(QUERY, TEXTS, TITLES)[0], rel=1e-5)


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
    assert padded == pytest.approx(ref, rel=1e-4, abs=1e-6)


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
    assert scorer(QUERY, []) == []
    assert [u.id for u in scorer("  ", [Unit(id="a", text="x")])] == ["a"]  # no query: the order kept
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


def test_rank_orders_by_the_titled_scores_and_the_call_top_n_wins(scorer):
    """``rank`` reads each unit's title from its metadata, scores the units as
    ``score_with_titles`` does, returns them best first, and a ``top_n`` given to the call
    overrides the instance's."""
    units = [Unit(id=f"u{i}", text=t, metadata={"title": ti} if ti else {})
             for i, (t, ti) in enumerate(zip(TEXTS, TITLES))]
    raw, _ = scorer.score_with_titles(QUERY, TEXTS, TITLES)
    best_first = sorted(range(len(TEXTS)), key=lambda i: -raw[i])
    out = scorer.rank(QUERY, units)
    assert [u.id for u in out] == [f"u{i}" for i in best_first]
    assert [u.score for u in out] == pytest.approx([raw[i] for i in best_first], rel=1e-5)
    capped = _with(scorer, top_n=3)
    assert [u.id for u in capped.rank(QUERY, units)] == [f"u{i}" for i in best_first[:3]]
    assert [u.id for u in capped.rank(QUERY, units, top_n=1)] == [f"u{best_first[0]}"]
    with pytest.raises(TypeError, match=r"^FiDAttentionScorer expects Unit objects, got str\.$"):
        scorer.rank(QUERY, [TEXTS[0]])


def test_alpha_reads_the_query_and_key_projections_of_each_decoder_cross_attention():
    """Eq. 3's alpha = Q K^T * scaling needs, per decoder layer, the cross-attention's query and
    key projections, its head count and its scaling: T5 names them ``EncDecAttention.q/.k/
    .n_heads`` and does not scale (scaling 1); a BERT decoder (``crossattention.self.query/
    .key/.num_attention_heads``) scales by 1/sqrt(head size). Self-attention is never read, and
    a module without all three parts is skipped; an unscaled one counts as scaling 1."""
    import torch
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel, T5Config, T5ForConditionalGeneration

    from funnel_core.rerank.fid import _cross_attention_modules

    t5 = T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=37,
                                             num_layers=2, num_heads=4))
    found = _cross_attention_modules(t5)
    assert [f[0] for f in found] == [f"decoder.block.{i}.layer.1.EncDecAttention" for i in (0, 1)]
    for i, (_, q, k, scaling, heads) in enumerate(found):
        attn = t5.decoder.block[i].layer[1].EncDecAttention
        assert (q, k, scaling, heads) == (attn.q, attn.k, 1.0, 4)

    bert = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37)
    b2b = EncoderDecoderModel(config=EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(**bert), BertConfig(**bert, is_decoder=True, add_cross_attention=True)))
    found = _cross_attention_modules(b2b)
    assert [f[0] for f in found] == [f"decoder.bert.encoder.layer.{i}.crossattention.self"
                                     for i in (0, 1)]
    for i, (_, q, k, scaling, heads) in enumerate(found):
        attn = b2b.decoder.bert.encoder.layer[i].crossattention.self
        assert (q, k, heads) == (attn.query, attn.key, 4)
        assert scaling == pytest.approx((32 / 4) ** -0.5)

    class Parts(torch.nn.Module):
        def __init__(self, **parts):
            super().__init__()
            for name, value in parts.items():
                setattr(self, name, value)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.CrossAttention = Parts(query=torch.nn.Linear(2, 2), key=torch.nn.Linear(2, 2),
                                        num_attention_heads=1)             # no scaling: 1
            self.crossattention_no_key = Parts(query=torch.nn.Linear(2, 2), num_attention_heads=1)
            self.crossattention_no_heads = Parts(query=torch.nn.Linear(2, 2),
                                                 key=torch.nn.Linear(2, 2))
            self.crossattention_no_query = Parts(key=torch.nn.Linear(2, 2), num_attention_heads=1)
            self.selfattention = Parts(q=torch.nn.Linear(2, 2), k=torch.nn.Linear(2, 2),
                                       n_heads=1)

    d = Decoder()
    assert _cross_attention_modules(d) == [("CrossAttention", d.CrossAttention.query,
                                            d.CrossAttention.key, 1.0, 1)]


def test_score_keeps_the_readers_answer(scorer):
    s = _with(scorer, return_answer=True, max_answer_tokens=3)
    scores = s.score(QUERY, TEXTS)
    again, answer = s.score_with_titles(QUERY, TEXTS)
    assert scores == again and isinstance(answer, str)
    assert s.last_answer == answer


@pytest.mark.parametrize("maps", ["none", "first_missing", "one_layer_short"])
def test_a_model_that_returns_no_usable_cross_attention_is_refused_with_the_fix(scorer, monkeypatch,
                                                                               maps):
    """The model's own output is cut (none at all, the first layer's map missing, one layer's map
    fewer than cross-attention modules): both readers of the maps refuse, naming the fix."""
    model, _, _ = scorer._model.get()
    forward = model.forward

    def cut(*args, **kwargs):
        out = forward(*args, **kwargs)
        full = out.cross_attentions
        out.cross_attentions = {"none": None, "first_missing": (None, *full[1:]),
                                "one_layer_short": full[:-1]}[maps]
        return out

    inputs = scorer.build_inputs(QUERY, TEXTS, TITLES)
    states = scorer.encode(inputs)
    dec, _ = scorer._decoder_prefix(states)
    monkeypatch.setattr(model, "forward", cut)
    with pytest.raises(RuntimeError, match=r"cross-attention maps for 2 cross-attention modules; "
                       r"load it with attn_implementation='eager' or use "
                       r"score_on='log_attention'\.$"):
        scorer.raw_scores(states, dec)
    if maps != "one_layer_short":   # the probabilities alone need no count
        with pytest.raises(RuntimeError, match=r"returned no cross-attentions; load it with "
                           r"attn_implementation='eager'\.$"):
            scorer.cross_attention(states, dec)


def test_a_model_whose_cross_attention_projections_are_not_found_is_sent_to_log_attention(
        scorer, monkeypatch):
    import funnel_core.rerank.fid as fid

    inputs = scorer.build_inputs(QUERY, TEXTS, TITLES)
    states = scorer.encode(inputs)
    dec, _ = scorer._decoder_prefix(states)
    monkeypatch.setattr(fid, "_cross_attention_modules", lambda model: [])
    with pytest.raises(RuntimeError, match=r"found no decoder cross-attention projections in .*; "
                       r"use score_on='log_attention' \(rank-equivalent to alpha for eq\. 3, "
                       r"\(iv\), \(v\) and Table 8\)\.$"):
        scorer.raw_scores(states, dec)


def test_render_gives_each_fields_character_span():
    from funnel_core.rerank.fid import _render

    text, spans = _render("q: {question} {{t}} {title:>6}|{text}.",
                          {"question": "who?", "title": "Ham", "text": "Hamlet"})
    # worked by hand: "q: " (3) + "who?" (3-7) + " {t} " (7-12) + "   Ham" (12-18) + "|" + ...
    assert text == "q: who? {t}    Ham|Hamlet."
    assert spans == {"question": (3, 7), "title": (12, 18), "text": (19, 25)}
    assert all(text[a:b] == v for (a, b), v in zip(spans.values(), ["who?", "   Ham", "Hamlet"]))
    with pytest.raises(KeyError, match=r"template field \{passage\} is unknown; use \{question\}, "
                       r"\{title\} and \{text\}\."):
        _render("{question} {passage}", {"question": "q", "title": "", "text": ""})


def _greedy(scorer, states, steps):
    """Greedy decoding written out: from the decoder start token, append the argmax of the
    next-token logits ``steps`` times (stopping at the end token)."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    model, tokenizer, _ = scorer._model.get()
    ids = [model.config.decoder_start_token_id]
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(encoder_outputs=BaseModelOutput(last_hidden_state=states),
                           decoder_input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
            if ids[-1] == tokenizer.eos_token_id:
                break
    return ids


def test_the_answer_is_the_greedy_continuation_without_special_tokens(scorer):
    s = _with(scorer, return_answer=True, max_answer_tokens=4)
    states = s.encode(s.build_inputs(QUERY, TEXTS, TITLES))
    prefix, answer = s._decoder_prefix(states)
    ids = _greedy(s, states, 4)
    assert answer == s.tokenizer.decode(ids[1:], skip_special_tokens=True).strip()
    assert prefix.tolist() == [[ids[0]]]                  # one scored position: the start token
    two = _with(scorer, decoder_steps=2)                  # no answer asked: none kept
    prefix, answer = two._decoder_prefix(states)
    assert prefix.tolist() == [ids[:2]] and answer is None
    two.score(QUERY, TEXTS)
    assert two.last_answer is None


def test_a_long_passage_is_truncated_to_max_length_tokens(scorer):
    long = " ".join(["Hamlet is a tragedy written by William Shakespeare."] * 20)
    full = _with(scorer, max_length=512).build_inputs(QUERY, [long, TEXTS[1]], [None, None])
    cut = _with(scorer, max_length=16).build_inputs(QUERY, [long, TEXTS[1]], [None, None])
    assert full.lengths[0] > 16
    assert cut.lengths[0] == 16 and cut.lengths[1] == min(full.lengths[1], 16)
    assert cut.input_ids[0][:15].tolist() == full.input_ids[0][:15].tolist()  # the same start
    assert len(cut.passage_mask[0]) == len(cut.query_mask[0]) == 16


def test_the_answer_is_greedy_even_when_the_checkpoint_asks_for_sampling(scorer):
    """A hub checkpoint's generation_config may ask for sampling or beams; the reader's answer
    (and the scored prefix) stay greedy."""
    model, _, _ = scorer._model.get()
    s = _with(scorer, return_answer=True, max_answer_tokens=4)
    states = s.encode(s.build_inputs(QUERY, TEXTS, TITLES))
    greedy = s.tokenizer.decode(_greedy(s, states, 4)[1:], skip_special_tokens=True).strip()
    saved = model.generation_config
    try:
        model.generation_config = type(saved).from_dict(
            {**saved.to_dict(), "do_sample": True, "top_k": 50, "temperature": 5.0, "num_beams": 3})
        for seed in range(3):
            import torch
            torch.manual_seed(seed)
            assert s._decoder_prefix(states)[1] == greedy
    finally:
        model.generation_config = saved
