"""The FiD model path on readers unlike the suite's tiny T5 (FunnelRAG eq. 3 on other checkpoints).

The shared tiny T5 starts its decoder at its pad token, never emits a special token in a short
answer, has a cross-attention without any bias and T5's unscaled ``Q K^T``, and its tokenizer
gives no zero-width token. Each test here builds, from a tiny random config, a reader that breaks
one of these habits, and checks the scorer against what transformers or the paper define:

* a checkpoint's decoder starts at ``config.decoder_start_token_id`` (``labels`` are shifted
  right onto it in training); one without it starts at the pad token (T5's convention);
* the reader's answer is text: the special tokens a checkpoint's generation config adds (BART's
  ``forced_eos_token_id``) are not part of it;
* ``alpha`` is ``Q K^T`` times the module's scaling (BERT scales by ``1/sqrt(d)``), and a
  cross-attention that adds a position bias cannot give ``alpha`` (its ``softmax`` is not the
  model's attention), in float32 even for a small bias and in bfloat16 for a large one;
* a token belongs to a field exactly when it shares a character with it.
"""

from __future__ import annotations

import shutil
import threading
import warnings

import pytest

from funnel_core import testing
from funnel_core.rerank.fid import DEFAULT_TEMPLATE, FiDAttentionScorer
from tests.rerank.fid_reference import padded_fid_forward

pytestmark = pytest.mark.models  # builds tiny models

QUERY = "who wrote the tragedy Hamlet?"
TEXTS = ["Hamlet is a tragedy written by William Shakespeare around 1600.",
         "Paris is the capital of France.",
         "Shakespeare was an English playwright."]


def _save_t5(path, *, decoder_start: str | None, forced_eos: bool = False) -> str:
    """A tiny random T5 (the suite's sizes) whose decoder starts at the token ``decoder_start``
    (``None``: the config names no start token, as ``T5Config()`` of transformers 5 leaves it)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(1)
    tok = testing.build_bpe_tokenizer(specials=("<pad>", "</s>", "<unk>"))
    tok.pad_token, tok.eos_token, tok.unk_token = "<pad>", "</s>", "<unk>"
    config = T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2,
                      num_decoder_layers=2, num_heads=4, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id)
    if decoder_start is not None:
        config.decoder_start_token_id = tok.convert_tokens_to_ids(decoder_start)
    model = T5ForConditionalGeneration(config)
    if forced_eos:
        model.generation_config.forced_eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def bart_style_t5(tmp_path_factory) -> str:
    """BART's conventions on a T5: the decoder starts at ``</s>`` (not at the pad token) and the
    generation config forces ``</s>`` as the answer's last token."""
    return _save_t5(tmp_path_factory.mktemp("bart_style_t5"), decoder_start="</s>", forced_eos=True)


def _first_position_attention_scores(model, tokenizer, inputs, **decoder_inputs):
    """Per passage: the mean over layers, heads and passage tokens of the first decoder
    position's cross-attention probabilities (``score_on="attention"``, ``lr=None``)."""
    import torch

    out, width = padded_fid_forward(model, tokenizer, inputs, **decoder_inputs)
    att = torch.stack([a[0, :, 0, :] for a in out.cross_attentions])          # [L, H, n*width]
    scores = []
    for k, n in enumerate(inputs.lengths):
        toks = [k * width + t for t in range(n) if inputs.passage_mask[k][t]]
        scores.append(float(att[:, :, toks].mean()))
    return scores


def _greedy_answer_ids(model, states, start: int, steps: int) -> list[int]:
    """Greedy decoding written out from ``start``: the argmax of the next-token logits, ``steps``
    times (stopping at the end token)."""
    import torch
    from transformers.modeling_outputs import BaseModelOutput

    ids = [start]
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(encoder_outputs=BaseModelOutput(last_hidden_state=states),
                           decoder_input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
            if ids[-1] == model.config.eos_token_id:
                break
    return ids[1:]


def test_the_decoder_starts_at_the_checkpoints_decoder_start_token(bart_style_t5):
    """The first decoder position is the one a trained reader saw first: ``labels`` shifted right
    onto ``config.decoder_start_token_id`` (here ``</s>``, not the pad token)."""
    import torch

    s = FiDAttentionScorer(model=bart_style_t5, score_on="attention", lr=None, dtype="float32")
    model, tok = s.model, s.tokenizer
    assert model.config.decoder_start_token_id == tok.eos_token_id != tok.pad_token_id
    inputs = s.build_inputs(QUERY, TEXTS)
    # any label: the decoder's first input is the start token whatever the answer is
    ref = _first_position_attention_scores(model, tok, inputs, labels=torch.tensor([[5, 6]]))
    from_pad = _first_position_attention_scores(model, tok, inputs,
                                                decoder_input_ids=torch.tensor([[tok.pad_token_id]]))
    assert ref != pytest.approx(from_pad, rel=1e-3)      # the start token matters on this model
    assert s.score(QUERY, TEXTS) == pytest.approx(ref, rel=1e-4, abs=1e-7)
    two = FiDAttentionScorer(model=bart_style_t5, decoder_steps=2, dtype="float32")
    two._model = s._model
    prefix, _ = two._decoder_prefix(two.encode(inputs))
    assert prefix[0, 0].item() == tok.eos_token_id and prefix.shape == (1, 2)
    assert all(isinstance(x, float) for x in two.score(QUERY, TEXTS))   # alpha path, no refusal


def test_a_checkpoint_without_a_decoder_start_token_starts_at_the_pad_token(tmp_path):
    """T5's convention (transformers: "In T5 it is usually set to the pad_token_id"): a config
    that names no decoder start token starts the decoder, and the answer, at the pad token."""
    import torch

    path = _save_t5(tmp_path / "t5", decoder_start=None)
    s = FiDAttentionScorer(model=path, score_on="attention", lr=None, return_answer=True,
                           max_answer_tokens=3, dtype="float32")
    model, tok = s.model, s.tokenizer
    assert getattr(model.config, "decoder_start_token_id", None) is None
    assert getattr(model.generation_config, "decoder_start_token_id", None) is None
    inputs = s.build_inputs(QUERY, TEXTS)
    pad = torch.tensor([[tok.pad_token_id]])
    ref = _first_position_attention_scores(model, tok, inputs, decoder_input_ids=pad)
    scores, answer = s.score_with_titles(QUERY, TEXTS)
    assert scores == pytest.approx(ref, rel=1e-4, abs=1e-7)
    ids = _greedy_answer_ids(model, s.encode(inputs), tok.pad_token_id, 3)
    assert answer == tok.decode(ids, skip_special_tokens=True).strip()


def test_the_answer_leaves_out_the_special_tokens_the_checkpoint_generates(bart_style_t5):
    """A checkpoint whose generation config forces ``</s>`` at the end of the answer (BART's
    ``forced_eos_token_id``): the answer is the greedy words before it, without ``</s>``."""
    s = FiDAttentionScorer(model=bart_style_t5, return_answer=True, max_answer_tokens=3,
                           dtype="float32")
    model, tok = s.model, s.tokenizer
    states = s.encode(s.build_inputs(QUERY, TEXTS))
    words = _greedy_answer_ids(model, states, model.config.decoder_start_token_id, 2)
    words = [i for i in words if i not in tok.all_special_ids]
    assert words                                          # the answer has text before </s>
    _, answer = s.score_with_titles(QUERY, TEXTS)
    assert answer == tok.decode(words).strip()
    assert "</s>" not in answer and "<pad>" not in answer


@pytest.mark.parametrize("settings,generated", [
    ({}, []),                                                   # the paper: no generation at all
    ({"decoder_steps": 3}, [2]),                                # the scored prefix only
    ({"decoder_steps": 3, "return_answer": True, "max_answer_tokens": 2}, [2]),
    ({"decoder_steps": 2, "return_answer": True, "max_answer_tokens": 4}, [4]),
])
def test_the_decoder_generates_only_the_tokens_it_scores_or_answers(tiny_t5_path, monkeypatch,
                                                                    settings, generated):
    """Eq. 3 reads the first decoder position, which needs no generation; ``decoder_steps`` positions
    need ``decoder_steps - 1`` generated tokens, an answer ``max_answer_tokens``, one generation
    serving both."""
    s = FiDAttentionScorer(model=tiny_t5_path, dtype="float32", **settings)
    model = s.model
    calls: list[int] = []
    generate = model.generate

    def counting(*args, **kwargs):
        calls.append(kwargs["max_new_tokens"])
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", counting)
    prefix, _ = s._decoder_prefix(s.encode(s.build_inputs(QUERY, TEXTS)))
    assert calls == generated
    assert prefix.shape == (1, settings.get("decoder_steps", 1))


def _bert2bert(path) -> str:
    """A tiny random BERT2BERT reader as :func:`funnel_core.train.fid.init_fid_from_encoder` lays
    it out (the decoder starts at ``[CLS]`` and stops at ``[SEP]``), with a WordPiece tokenizer."""
    import torch
    from transformers import BertConfig, BertTokenizerFast, EncoderDecoderConfig, EncoderDecoderModel

    words = sorted({w.strip(".?,").lower() for t in [QUERY, *TEXTS, DEFAULT_TEMPLATE] for w in t.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".?,:{}", *words]
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast(vocab_file=str(path / "vocab.txt"))
    torch.manual_seed(2)
    bert = dict(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=128)
    model = EncoderDecoderModel(config=EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(**bert), BertConfig(**bert, is_decoder=True, add_cross_attention=True)))
    for cfg in (model.config, model.generation_config):
        cfg.decoder_start_token_id = cfg.bos_token_id = tok.cls_token_id
        cfg.eos_token_id, cfg.pad_token_id = tok.sep_token_id, tok.pad_token_id
    tok.bos_token, tok.eos_token = tok.cls_token, tok.sep_token
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_alpha_of_a_scaled_cross_attention_is_the_log_attention_up_to_one_constant(tmp_path):
    """A BERT decoder scales ``Q K^T`` by ``1/sqrt(head size)``: alpha is the logit its softmax
    reads, so per (layer, head) ``log p = alpha - c`` with one constant shared by every
    passage, and eq. 3 over all tokens (``lr=None``) on alpha differs from the mean log-attention
    of the model's own forward (labels shifted right onto ``[CLS]``) by one constant."""
    import torch

    path = _bert2bert(tmp_path / "b2b")
    s = FiDAttentionScorer(model=path, lr=None, dtype="float32")
    model, tok = s.model, s.tokenizer
    assert model.decoder.bert.encoder.layer[0].crossattention.self.scaling == pytest.approx(8 ** -0.5)
    inputs = s.build_inputs(QUERY, TEXTS)
    out, width = padded_fid_forward(model, tok, inputs, labels=torch.tensor([[5, 6]]))
    logp = torch.stack([a[0, :, 0, :].log() for a in out.cross_attentions])
    ref = [float(logp[:, :, [k * width + t for t in range(n) if inputs.passage_mask[k][t]]].mean())
           for k, n in enumerate(inputs.lengths)]
    shift = [a - b for a, b in zip(s.score(QUERY, TEXTS), ref)]
    assert max(shift) - min(shift) < 1e-4
    # the check is not vacuous: the passages' log-attention scores differ by far more
    assert max(ref) - min(ref) > 1e-3


def _with_cross_attention_bias(scorer: FiDAttentionScorer, scale: float) -> float:
    """Give the loaded T5's cross-attention a relative position bias (T5's bucketed bias, as its
    encoder's self-attention has, shared by every decoder layer); return the largest change it
    makes to the model's cross-attention probabilities."""
    import torch

    model, tok = scorer.model, scorer.tokenizer
    attn = model.decoder.block[0].layer[1].EncDecAttention
    inputs = scorer.build_inputs(QUERY, TEXTS)

    def probs():
        out, _ = padded_fid_forward(model, tok, inputs,
                                     decoder_input_ids=torch.tensor([[tok.pad_token_id]]))
        return torch.stack([a[0, :, 0, :] for a in out.cross_attentions])

    before = probs()
    attn.is_decoder = False                # bidirectional buckets: the bias varies along the input
    attn.has_relative_attention_bias = True
    attn.relative_attention_bias = torch.nn.Embedding(model.config.relative_attention_num_buckets,
                                                      model.config.num_heads)
    torch.manual_seed(3)
    with torch.no_grad():
        attn.relative_attention_bias.weight.normal_(0.0, scale)
    return float((probs() - before).abs().max())


REFUSAL = (r"its cross-attention adds a bias or another scaling, so the raw score alpha cannot be "
           r"read here; use score_on='log_attention' \(rank-equivalent to alpha for eq\. 3, "
           r"\(iv\), \(v\) and Table 8\)\.$")


def test_a_cross_attention_with_a_position_bias_is_refused_for_alpha_even_when_small(tiny_t5_path):
    """softmax(Q K^T) is the model's attention only without a bias; in float32 it matches to
    rounding, so even a bias moving a probability by under 0.1 is refused with the fix, and
    log_attention (read from the model's probabilities) still scores."""
    s = FiDAttentionScorer(model=tiny_t5_path, dtype="float32")
    moved = _with_cross_attention_bias(s, scale=0.05)
    assert 1e-3 < moved < 1e-1
    with pytest.raises(RuntimeError, match=REFUSAL):
        s.score(QUERY, TEXTS)
    logp = FiDAttentionScorer(model=tiny_t5_path, dtype="float32", score_on="log_attention")
    logp._model = s._model
    assert len(logp.score(QUERY, TEXTS)) == 3


def test_in_bfloat16_a_large_position_bias_is_still_refused(tiny_t5_path):
    """bfloat16 rounding moves probabilities by up to ~0.1, so the check is looser there; a bias
    that moves them by far more is still refused (and the unbiased reader passes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # bf16 without native support: slow
        s = FiDAttentionScorer(model=tiny_t5_path, dtype="bfloat16")
        s.warm_up()
    assert s.active_dtype == "bfloat16"
    assert len(s.score(QUERY, TEXTS)) == 3
    assert _with_cross_attention_bias(s, scale=5.0) > 0.2
    with pytest.raises(RuntimeError, match=REFUSAL):
        s.score(QUERY, TEXTS)


def test_a_no_title_template_may_name_the_title_field_which_stays_empty(tiny_t5_path):
    """One template for titled and untitled passages: an untitled passage renders an empty title,
    so its passage tokens are its text alone."""
    s = FiDAttentionScorer(model=tiny_t5_path, template_no_title=DEFAULT_TEMPLATE, dtype="float32")
    inputs = s.build_inputs(QUERY, TEXTS[:2], [None, "Paris"])
    tok = s.tokenizer
    rendered = "".join(tok.decode(inputs.input_ids[0], skip_special_tokens=True).split())
    assert rendered == "".join(f"question: {QUERY} title: context: {TEXTS[0]}".split())
    assert tok.decode(inputs.input_ids[0][inputs.passage_mask[0]]).split() == TEXTS[0].split()
    assert tok.decode(inputs.input_ids[1][inputs.passage_mask[1]]).split() == ["Paris", *TEXTS[1].split()]


def test_build_inputs_tokenizes_under_the_tokenizers_own_lock(tiny_t5_path):
    """A fast tokenizer is shared state: every stage holding the tokenizer's lock
    (:func:`funnel_core.models.tokenizer_lock`) excludes the others, so build_inputs waits for a
    holder of that lock and proceeds once it is released."""
    from funnel_core.models import tokenizer_lock

    s = FiDAttentionScorer(model=tiny_t5_path, dtype="float32")
    lock = tokenizer_lock(s.tokenizer)
    done = []
    with lock:
        worker = threading.Thread(target=lambda: done.append(s.build_inputs(QUERY, TEXTS)))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not done          # waiting for the tokenizer's lock
    worker.join(10)
    assert len(done) == 1 and len(done[0].input_ids) == 3


def test_a_token_belongs_to_a_field_exactly_when_it_shares_a_character_with_it(tiny_t5_path,
                                                                              tmp_path):
    """Token roles from character sets: a token is a passage (query) token when its characters
    meet the text's (question's). The template glues punctuation to the fields (a token ends
    where the question starts, another starts where it ends) and the tokenizer trims offsets, so
    a whitespace token inside the passage covers no character and belongs to no field."""
    from tokenizers import processors
    from transformers import AutoTokenizer

    path = tmp_path / "t5_trimmed"
    shutil.copytree(tiny_t5_path, path)
    tok = AutoTokenizer.from_pretrained(tiny_t5_path)
    tok.backend_tokenizer.post_processor = processors.Sequence(
        [processors.ByteLevel(trim_offsets=True), tok.backend_tokenizer.post_processor])
    tok.save_pretrained(path)
    template = "Q:{question}|C:{text}|"
    s = FiDAttentionScorer(model=str(path), template_no_title=template, dtype="float32")
    texts = ["Hamlet  is a  tragedy", "Paris is in France"]
    question = "who wrote Hamlet"
    inputs = s.build_inputs(question, texts)
    enc = s.tokenizer([template.format(question=question, text=t) for t in texts],
                      return_offsets_mapping=True, return_special_tokens_mask=True)
    q_chars = set(range(2, 2 + len(question)))
    edges = {"ends_at_question": 0, "starts_after_question": 0, "zero_width_in_text": 0}
    for i, text in enumerate(texts):
        t_chars = set(range(len(question) + 5, len(question) + 5 + len(text)))
        for t, ((a, b), special) in enumerate(zip(enc["offset_mapping"][i],
                                                  enc["special_tokens_mask"][i])):
            chars = set(range(a, b))
            assert bool(inputs.passage_mask[i][t]) == (not special and bool(chars & t_chars))
            assert bool(inputs.query_mask[i][t]) == (not special and bool(chars & q_chars))
            edges["ends_at_question"] += b == 2 and a < b
            edges["starts_after_question"] += a == 2 + len(question) and a < b
            edges["zero_width_in_text"] += (a == b and not special
                                            and min(t_chars) < a < max(t_chars))
    assert all(edges.values()), edges                 # each edge case occurs in the inputs
