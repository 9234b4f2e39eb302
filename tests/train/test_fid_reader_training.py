"""FiD on a BERT2BERT EncoderDecoderModel: warm start, training, scoring.

A tiny random BERT stands in for all-MiniLM-L6-v2. The checks would catch: a warm start that does
not copy the encoder's weights into both halves, answer labels that keep the tokenizer's
``[CLS]`` (the decoder would learn to emit it) or lack the ``[SEP]`` stop token, a trainer that
ignores the time cap, and a scorer that cannot read the BERT decoder's cross-attention (its
scores are compared with the model's own ``cross_attentions`` computed the textbook FiD way).
"""

from __future__ import annotations

import pytest

from funnel_core import testing
from tests.rerank.fid_reference import padded_fid_forward

QUERY = "who wrote Hamlet?"
TEXTS = ["Hamlet is a tragedy by Shakespeare.", "Paris is the capital of France.",
         "BM25 ranks documents by term frequency."]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """A tiny random BERT *encoder* folder (the MiniLM stand-in)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny_bert")
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(testing.minilm_path())
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=256)
    BertModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def b2b(tiny_bert, tmp_path_factory) -> str:
    from funnel_core.train.fid import init_fid_from_encoder

    return init_fid_from_encoder(tiny_bert, tmp_path_factory.mktemp("b2b") / "init")


def test_warm_start_copies_the_encoder_into_both_halves(tiny_bert, b2b):
    import torch
    from transformers import AutoModelForSeq2SeqLM, BertModel

    src = BertModel.from_pretrained(tiny_bert)
    model = AutoModelForSeq2SeqLM.from_pretrained(b2b)
    assert type(model).__name__ == "EncoderDecoderModel"
    q = src.encoder.layer[1].attention.self.query.weight
    assert torch.equal(model.encoder.encoder.layer[1].attention.self.query.weight, q)
    assert torch.equal(model.decoder.bert.encoder.layer[1].attention.self.query.weight, q)
    assert model.config.decoder.is_decoder and model.config.decoder.add_cross_attention
    assert hasattr(model.decoder.bert.encoder.layer[0], "crossattention")
    tok_cls, tok_sep = 101, 102
    assert model.config.decoder_start_token_id == tok_cls
    assert model.generation_config.eos_token_id == tok_sep


def test_answer_labels_have_no_cls_and_end_with_sep(b2b):
    from transformers import AutoTokenizer

    from funnel_core.train.fid import FiDExample, fid_collate

    tok = AutoTokenizer.from_pretrained(b2b)
    batch = fid_collate(tok, [FiDExample(QUERY, ["William Shakespeare"], TEXTS)], n_passages=3)
    labels = [t for t in batch["labels"][0].tolist() if t != -100]
    words = tok("William Shakespeare", add_special_tokens=False)["input_ids"]
    assert labels == words + [tok.sep_token_id]
    assert batch["input_ids"].shape[:2] == (1, 3)


def test_train_b2b_fid_learns_and_scorer_reads_bert_cross_attention(b2b, tmp_path):
    import torch

    from funnel_core.rerank.fid import FiDAttentionScorer
    from funnel_core.train.fid import FiDExample, evaluate_fid_loss, train_fid

    examples = [FiDExample(QUERY, ["Shakespeare"], [("Hamlet", TEXTS[0]), TEXTS[1]]),
                FiDExample("capital of France?", ["Paris"], [TEXTS[1], TEXTS[2]])]
    before = evaluate_fid_loss(b2b, examples, n_passages=2)
    res = train_fid(b2b, examples, tmp_path / "fid", n_passages=2, epochs=40, batch_size=2,
                    learning_rate=5e-3, warmup_ratio=0.0, progress=False, device="cpu")
    after = evaluate_fid_loss(res.output_dir, examples, n_passages=2)
    assert after < 0.5 * before, (before, after, res.step_losses[-5:])
    scorer = FiDAttentionScorer(model=res.output_dir, lr=None, return_answer=True,
                                max_answer_tokens=4, device="cpu", score_on="attention",
                                dtype="float32")  # the reference below runs in fp32
    scores = scorer.score(QUERY, TEXTS)
    assert scorer.last_answer is not None and "shakespeare" in scorer.last_answer.lower()
    # eq. 3 on alpha reads the BERT decoder's crossattention.self.query/.key (softmax(alpha) is
    # checked against the model's attention inside raw_scores) and, all tokens averaged, differs
    # from the mean log-attention by one constant shared by the passages
    alpha = FiDAttentionScorer(model=res.output_dir, lr=None, device="cpu", dtype="float32")
    alpha._model = scorer._model
    logp = FiDAttentionScorer(model=res.output_dir, lr=None, device="cpu", dtype="float32",
                              score_on="log_attention")
    logp._model = scorer._model
    shift = [a - b for a, b in zip(alpha.score(QUERY, TEXTS), logp.score(QUERY, TEXTS))]
    assert max(shift) - min(shift) < 1e-4 * max(1.0, abs(shift[0]))
    # reference: the model's own cross-attention of the first decoder step, computed with all
    # passages padded into one batch; the score of a passage = mean over layers, heads and its
    # passage tokens (lr=None)
    model, tok = scorer.model, scorer.tokenizer
    inputs = scorer.build_inputs(QUERY, TEXTS)
    n = len(TEXTS)
    out, width = padded_fid_forward(model, tok, inputs,
                                    decoder_input_ids=torch.tensor([[model.config.decoder_start_token_id]]))
    att = torch.stack([a[0, :, 0, :] for a in out.cross_attentions])   # [L, H, n*width]
    for k in range(n):
        toks = [k * width + t for t in range(inputs.lengths[k]) if inputs.passage_mask[k][t]]
        ref = float(att[:, :, toks].mean())
        assert scores[k] == pytest.approx(ref, rel=1e-4, abs=1e-7)
    assert res.seconds > 0 and not res.stopped_early


def test_time_cap_stops_training(b2b, tmp_path):
    from funnel_core.train.fid import FiDExample, train_fid

    examples = [FiDExample(QUERY, ["Shakespeare"], TEXTS)] * 6
    res = train_fid(b2b, examples, tmp_path / "cap", n_passages=3, epochs=5, batch_size=1,
                    progress=False, device="cpu", max_seconds=0.0)
    assert res.stopped_early and res.steps == 1 and len(res.step_losses) == 1
