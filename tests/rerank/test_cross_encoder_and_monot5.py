"""Cross-encoder and monoT5 scorers in funnel_core: real (tiny, random) models loaded from folders."""

import asyncio
import math

import pytest

from funnel_core.errors import ModelLoadError
from funnel_core.rerank.cross_encoder import CrossEncoderScorer, encode_pairs, minmax
from funnel_core.rerank.monot5 import MonoT5Scorer
from funnel_core.units import Unit

QUERY = "what is the capital of France?"


@pytest.fixture(scope="module")
def scorer(tiny_cross_encoder_path):
    return CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", device="cpu",
                              max_length=64, batch_size=3)


def test_rank_orders_by_model_scores_and_keeps_history(scorer, corpus_units):
    units = [u.rescored(float(i), "bm25") for i, u in enumerate(corpus_units)]
    raw = scorer.score(QUERY, [u.text for u in units])
    assert all(type(s) is float for s in raw)
    out = scorer(QUERY, units)
    assert [u.id for u in out] == [units[i].id for i in sorted(range(len(raw)), key=lambda i: -raw[i])]
    assert [u.score for u in out] == sorted(raw, reverse=True)
    by_id = {u.id: u for u in units}
    for u in out:  # metadata survives; the BM25 score is kept next to the new one
        assert u.metadata["topic"] == by_id[u.id].metadata["topic"]
        assert u.scores["bm25"] == by_id[u.id].score
        assert u.scores["cross_encoder"] == u.score
    assert units[0].scores == {"bm25": 0.0}  # inputs untouched


def test_top_n_threshold_and_normalize(tiny_cross_encoder_path, corpus_units):
    # fp32: this tiny random model's scores differ by ~1e-5, below bf16's resolution, and
    # dtype="auto" (or runtime="auto") runs bf16 on a CPU with native bf16
    base = CrossEncoderScorer(tiny_cross_encoder_path, dtype="float32", library="transformers", max_length=64)
    raw = sorted(base.score(QUERY, [u.text for u in corpus_units]), reverse=True)
    top3 = CrossEncoderScorer(tiny_cross_encoder_path, dtype="float32", library="transformers", top_n=3)
    assert len(top3(QUERY, corpus_units)) == 3
    assert len((base % 2)(QUERY, corpus_units)) == 2
    cut = (raw[2] + raw[3]) / 2
    thr = CrossEncoderScorer(tiny_cross_encoder_path, dtype="float32", library="transformers", score_threshold=cut)
    kept = thr(QUERY, corpus_units)
    assert len(kept) == 3 and all(u.score >= cut for u in kept)
    norm = CrossEncoderScorer(tiny_cross_encoder_path, dtype="float32", library="transformers", normalize=True)
    probs = [u.score for u in norm(QUERY, corpus_units)]
    assert probs == pytest.approx([1 / (1 + math.exp(-s)) for s in raw], rel=1e-5)


def test_backends_agree_on_the_same_folder(tiny_cross_encoder_path):
    texts = ["Paris is the capital of France.", "Berlin is in Germany.", "BM25 ranks documents."]
    hf = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers").score(QUERY, texts)
    st = CrossEncoderScorer(tiny_cross_encoder_path, library="sentence-transformers",
                            device="cpu").score(QUERY, texts)
    assert st == pytest.approx(hf, abs=1e-5)


def test_length_sorting_does_not_change_scores(tiny_cross_encoder_path):
    texts = ["short", "a much longer passage " * 20, "medium length passage here", "x " * 3]
    a = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", batch_size=2,
                           sort_by_length=True).score(QUERY, texts)
    b = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", batch_size=2,
                           sort_by_length=False).score(QUERY, texts)
    assert a == pytest.approx(b, abs=1e-5)


def test_truncation_keeps_the_query(scorer, tiny_cross_encoder_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_cross_encoder_path)
    long_passage = "evidence " * 3000  # far beyond the 512 positions of the model
    enc = encode_pairs(tok, [QUERY], [long_passage], max_length=32, return_tensors=None)
    ids = enc["input_ids"][0]
    assert len(ids) == 32
    q_ids = tok(QUERY, add_special_tokens=False)["input_ids"]
    assert ids[1:1 + len(q_ids)] == q_ids  # the whole query, then the truncated passage
    for backend in ("transformers", "sentence-transformers"):
        s = CrossEncoderScorer(tiny_cross_encoder_path, library=backend, max_length=512, device="cpu")
        assert len(s.score(QUERY, [long_passage, "short"])) == 2
    huge_query = "why " * 400  # a query longer than max_length is clipped to half, not an error
    assert len(scorer.score(huge_query, [long_passage])) == 1


def test_fuse_weight_interpolates_previous_scores(tiny_cross_encoder_path, corpus_units):
    units = [u.rescored(float(len(corpus_units) - i), "bm25") for i, u in enumerate(corpus_units)]
    pure = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers")
    fused_all = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", fuse_weight=1.0)
    assert [u.id for u in fused_all(QUERY, units)] == [u.id for u in units]  # w=1: previous order
    half = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", fuse_weight=0.5)
    ce = minmax(pure.score(QUERY, [u.text for u in units]))
    prev = minmax([u.score for u in units])
    expected = sorted((0.5 * c + 0.5 * p for c, p in zip(ce, prev)), reverse=True)
    assert [u.score for u in half(QUERY, units)] == pytest.approx(expected)


def test_bad_input(scorer, tiny_cross_encoder_path):
    assert scorer(QUERY, []) == [] and scorer.score(QUERY, []) == []
    assert [u.id for u in scorer("   ", [Unit(id="a", text="x")])] == ["a"]  # kept, unscored
    with pytest.raises(ValueError, match="top_n must be >= 1"):
        CrossEncoderScorer(tiny_cross_encoder_path, top_n=0)
    with pytest.raises(ValueError, match="top_n must be >= 1"):
        CrossEncoderScorer(tiny_cross_encoder_path, top_n=-2)
    with pytest.raises(ValueError, match="unknown cross-encoder library 'onnx'"):
        CrossEncoderScorer(tiny_cross_encoder_path, library="onnx")
    # ``backend=`` means storage (memory or Milvus) in this package: the model library is
    # ``library=``, and the old name is refused, naming it
    with pytest.raises(TypeError, match=r"'backend'.*accepted.*'library'"):
        CrossEncoderScorer(tiny_cross_encoder_path, backend="transformers")
    with pytest.raises(TypeError, match="texts must be strings"):
        scorer.score(QUERY, ["fine", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="expects Unit objects"):
        scorer(QUERY, ["not a unit"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="query must be a str"):
        scorer(None, [Unit(id="a", text="x")])  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["transformers", "sentence-transformers"])
def test_unloadable_hub_name_names_the_model(backend):
    s = CrossEncoderScorer("no-such-org/no-such-reranker", library=backend, device="cpu")
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-reranker") as err:
        s.score(QUERY, ["text"])
    assert "local folder" in str(err.value) or "folder" in str(err.value)


def test_model_loads_lazily_and_once(tiny_cross_encoder_path):
    s = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers")
    assert not s._model.loaded
    s.score(QUERY, ["a"])
    first = s._model.get()
    s.score(QUERY, ["b"])
    assert s._model.get() is first


def test_async_matches_sync(scorer, corpus_units):
    sync = scorer(QUERY, corpus_units)
    out = asyncio.run(scorer.acall(QUERY, corpus_units))
    assert [u.id for u in out] == [u.id for u in sync]


# -- monoT5 -----------------------------------------------------------------------------------
def test_monot5_scores_are_true_false_logit_differences(tiny_t5_path, corpus_units):
    import torch

    m = MonoT5Scorer(tiny_t5_path, device="cpu", max_length=64, batch_size=3,
                     dtype="float32")  # the reference below runs the model in fp32
    texts = [u.text for u in corpus_units[:4]]
    scores = m.score(QUERY, texts)
    fn = m._model.get()
    t_id, f_id = fn.token_ids
    assert fn.tokenizer.convert_ids_to_tokens([t_id, f_id]) == ["true", "false"]
    for text, s in zip(texts, scores):  # recompute one prompt at a time, no padding
        ids = torch.tensor([m.prompt_ids(QUERY, text)])
        start = torch.tensor([[fn.model.config.decoder_start_token_id]])
        logits = fn.model(input_ids=ids, decoder_input_ids=start).logits[0, 0]
        p_true = torch.softmax(logits[[t_id, f_id]], dim=0)[0].item()
        assert s == pytest.approx((logits[t_id] - logits[f_id]).item(), abs=1e-4)
        assert 1 / (1 + math.exp(-s)) == pytest.approx(p_true, abs=1e-5)
    ranked = m(QUERY, corpus_units[:4])
    assert [u.score for u in ranked] == sorted(scores, reverse=True)
    norm = MonoT5Scorer(tiny_t5_path, device="cpu", max_length=64, normalize=True, top_n=2)
    out = norm(QUERY, corpus_units[:4])
    assert len(out) == 2 and all(0 < u.score < 1 for u in out)


def test_monot5_truncates_the_document_only(tiny_t5_path):
    m = MonoT5Scorer(tiny_t5_path, device="cpu", max_length=40)
    fn_ids = m.prompt_ids(QUERY, "evidence " * 2000)
    assert len(fn_ids) == 40
    tok = m._model.get().tokenizer
    q_ids = tok.encode(QUERY, add_special_tokens=False)
    assert any(fn_ids[i:i + len(q_ids)] == q_ids for i in range(len(fn_ids)))
    assert len(m.score(QUERY, ["evidence " * 2000, "short"])) == 2


def test_monot5_bad_input(tiny_t5_path):
    with pytest.raises(ValueError, match="template"):
        MonoT5Scorer(tiny_t5_path, template="Document: {document} Query: {query}")
    with pytest.raises(ValueError, match="top_n"):
        MonoT5Scorer(tiny_t5_path, top_n=0)
    with pytest.raises(ModelLoadError, match="castorini/monot5-base-msmarco"):
        MonoT5Scorer().score(QUERY, ["x"])
    assert MonoT5Scorer(tiny_t5_path).score(QUERY, []) == []


@pytest.mark.parametrize("runtime", ["torch", "onnx", "openvino"])
def test_concurrent_scoring_matches_sequential(tiny_cross_encoder_path, runtime, tmp_path):
    """Fast tokenizers are not thread-safe, nor is an OpenVINO infer request ("Infer Request is
    busy"); scoring from many threads must still be exact, in every runtime."""
    from concurrent.futures import ThreadPoolExecutor

    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from funnel_core.rerank.runtimes import runtime_available

    if not runtime_available(runtime):
        pytest.skip(f"{runtime} is not installed")
    scorer = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", max_length=64, batch_size=4,
                                runtime=runtime, export_dir=tmp_path / "export")
    queries = [f"question number {i} about {'long ' * (i % 7)}topics" for i in range(24)]
    texts = ["short passage", "a much longer passage " * 30, "medium sized passage about topics " * 3]
    expected = [scorer.score(q, texts) for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda q: scorer.score(q, texts), queries))
    for e, g in zip(expected, got):
        assert g == pytest.approx(e, abs=1e-5)


def test_window_words_scores_a_long_text_by_its_best_window(tiny_cross_encoder_path):
    from funnel_core.text import word_windows

    long_text = " ".join(f"Sentence {i} talks about topic {i % 5} in some detail." for i in range(40))
    windows = word_windows(long_text, 30)
    assert len(windows) > 3
    plain = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", max_length=64)
    maxp = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", max_length=64,
                              window_words=30)
    short = "Paris is the capital of France."
    got = maxp.score_pairs([QUERY, QUERY], [long_text, short])
    assert got[0] == pytest.approx(max(plain.score(QUERY, windows)), abs=1e-5)
    # the cost counts every (query, window) pair the model scored, not the two texts
    before = maxp.pairs_scored
    maxp.score(QUERY, [long_text, short])
    assert maxp.pairs_scored - before == len(windows) + 1 and maxp.calls == 1
    assert got[1] == pytest.approx(plain.score(QUERY, [short])[0], abs=1e-5)  # short: one window
    with pytest.raises(ValueError, match="window_overlap"):
        CrossEncoderScorer(tiny_cross_encoder_path, window_words=30, window_overlap=30)
    with pytest.raises(ValueError, match="window_words"):
        CrossEncoderScorer(tiny_cross_encoder_path, window_words=0)


def test_bf16_autocast_keeps_the_order_of_clearly_different_scores(tiny_cross_encoder_path,
                                                                    corpus_units):
    texts = [u.text for u in corpus_units]
    fp32 = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers").score(QUERY, texts)
    bf16 = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers",
                              dtype="bfloat16").score(QUERY, texts)
    assert all(type(s) is float for s in bf16)
    assert bf16 == pytest.approx(fp32, abs=0.05)
    with pytest.raises(TypeError, match=r"'bf16'.*accepted.*'dtype'"):  # one precision setting
        CrossEncoderScorer(tiny_cross_encoder_path, bf16=True)
