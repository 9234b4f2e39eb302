"""funnel_core.llm: the provider interface, its failure policy, and the local transformers LLM."""

import math
import os
import time

import pytest

from funnel_core.errors import ModelLoadError
from funnel_core.llm import LLM, LLMError, LLMTimeoutError, TransformersLLM, as_llm, logsumexp

pytestmark = pytest.mark.models  # builds or loads a model in most tests


class Scripted(LLM):
    """A text-only provider with scripted replies (stands in for a remote API)."""

    def __init__(self, reply="ok", delay=0.0, fail=None, bad_shape=False, **kw):
        super().__init__(**kw)
        self.reply, self.delay, self.fail, self.bad_shape = reply, delay, fail, bad_shape
        self.calls = []

    def _generate(self, prompts, *, n, temperature, top_p, top_k, max_new_tokens):
        self.calls.append(dict(prompts=prompts, n=n, temperature=temperature, top_p=top_p,
                               top_k=top_k, max_new_tokens=max_new_tokens))
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise self.fail
        if self.bad_shape:
            return [[self.reply]]
        return [[self.reply] * n for _ in prompts]


def test_generate_checks_arguments():
    llm = Scripted()
    with pytest.raises(TypeError, match="wrap it in a list"):
        llm.generate("one prompt")
    with pytest.raises(ValueError, match="n \\(completions per prompt\\) must be >= 1"):
        llm.generate(["p"], n=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        llm.generate(["p"], top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(["p"], temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        llm.generate(["p"], top_k=-3)
    with pytest.raises(ValueError, match="timeout"):
        Scripted(timeout=0)
    assert llm.generate([]) == [] and llm.calls == []


def test_generate_passes_sampling_params_and_shapes():
    llm = Scripted("hello")
    out = llm.generate(["a", "b"], n=3, temperature=0.7, top_p=0.9, top_k=50, max_new_tokens=5)
    assert out == [["hello"] * 3, ["hello"] * 3]
    assert llm.calls[0] == dict(prompts=["a", "b"], n=3, temperature=0.7, top_p=0.9, top_k=50,
                                max_new_tokens=5)


def test_failure_and_timeout_policy():
    boom = Scripted(fail=ConnectionError("503 upstream"))
    with pytest.raises(LLMError, match="Scripted.*failed during generate.*ConnectionError: 503"):
        boom.generate(["p"])
    slow = Scripted(delay=2.0, timeout=0.2)
    t = time.perf_counter()
    with pytest.raises(LLMTimeoutError, match="within timeout=0.2s"):
        slow.generate(["p"])
    assert time.perf_counter() - t < 1.5
    with pytest.raises(LLMError, match="returned 1 outputs for 2 prompts"):
        Scripted(bad_shape=True).generate(["p", "q"])
    with pytest.raises(NotImplementedError, match="^Scripted exposes generated text only"):
        Scripted().next_token_logprobs(["p"], ["True"])


async def test_async_generate_and_timeout():
    assert await Scripted("x").agenerate(["a"], n=2) == [["x", "x"]]
    with pytest.raises(LLMTimeoutError):
        await Scripted(delay=1.0, timeout=0.1).agenerate(["p"])
    with pytest.raises(LLMError, match="ValueError: bad"):
        await Scripted(fail=ValueError("bad")).agenerate(["p"])


def test_logsumexp_and_as_llm():
    assert logsumexp([math.log(0.25), math.log(0.5)]) == pytest.approx(math.log(0.75))
    assert logsumexp([]) == -math.inf
    llm = Scripted()
    assert as_llm(llm) is llm
    assert isinstance(as_llm("some/folder"), TransformersLLM)
    with pytest.raises(TypeError, match="LlamaIndexLLM"):
        as_llm(42)


def test_unloadable_model_raises_model_load_error(tmp_path):
    llm = TransformersLLM(str(tmp_path / "missing"))  # lazy: nothing loads yet
    with pytest.raises(LLMError) as err:
        llm.generate(["hi"])
    assert isinstance(err.value.__cause__, ModelLoadError)
    assert "missing" in str(err.value)


def test_transformers_llm_generates_with_chat_template(tiny_llama_path):
    llm = TransformersLLM(tiny_llama_path, batch_size=2, seed=0)
    assert "<|im_start|>user\nWho wrote Hamlet?<|im_end|>" in llm.format_prompt("Who wrote Hamlet?")
    out = llm.generate(["a", "b c d e f", "g"], n=1, max_new_tokens=4)
    assert len(out) == 3 and all(len(r) == 1 and isinstance(r[0], str) for r in out)
    greedy = llm.generate(["a"], n=2, max_new_tokens=4)
    assert greedy[0][0] == greedy[0][1]
    sampled = llm.generate(["a", "b"], n=3, temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=6)
    assert [len(r) for r in sampled] == [3, 3]
    raw = TransformersLLM(tiny_llama_path, use_chat_template=False)
    assert raw.format_prompt("plain") == "plain"


def test_next_token_logprobs_match_a_manual_forward_pass(tiny_llama_path):
    import torch

    # float32: the manual pass below reads the model's own logits (bf16 ones are coarser)
    llm = TransformersLLM(tiny_llama_path, batch_size=4, dtype="float32")
    prompts = ["Is Paris in France?", "A much longer prompt about BM25 ranking and documents here."]
    rows = llm.next_token_logprobs(prompts, ["True", "False"])
    model, tok, _ = llm._model.get()
    for prompt, row in zip(prompts, rows):
        ids = tok(llm.format_prompt(prompt), return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            logp = torch.log_softmax(model(**ids).logits[0, -1].float(), -1)
        expect = [logsumexp([float(logp[i]) for i in llm.candidate_token_ids(c)])
                  for c in ("True", "False")]
        assert row == pytest.approx(expect, abs=1e-4)  # left padding does not change the answer
        assert all(v <= 0 for v in row)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FUNNEL_SLOW"), reason="set FUNNEL_SLOW=1 (loads SmolLM2, ~1 min)")
def test_smollm2_gguf_loads_and_answers(capfd):
    import torch

    from funnel_core.testing import SMOLLM2_GGUF, smollm2_path

    llm = TransformersLLM(smollm2_path(), gguf_file=SMOLLM2_GGUF, dtype="bfloat16")
    out = llm.generate(["What is the capital of France? One word."], max_new_tokens=12)  # it may restate the question first
    assert "Paris" in out[0][0]
    # dense bf16 weights after the load, and no warning that they were left packed in float32
    assert llm.active_dtype == "bfloat16" and next(llm._model.get()[0].parameters()).dtype == torch.bfloat16
    assert "fastest in float32" not in capfd.readouterr().err  # transformers logs to stderr itself


def test_shared_prefill_sampling_matches_greedy_when_top_k_is_1(tiny_llama_path):
    # n samples read the prompt once (KV cache copied n times); with top_k=1 sampling is greedy,
    # so every sample must equal the plain greedy continuation, padding included.
    llm = TransformersLLM(tiny_llama_path, batch_size=4)
    prompts = ["Paris is the capital of", "A cross-encoder reads the query and the passage together and"]
    greedy = llm.generate(prompts, n=1, max_new_tokens=6)
    sampled = llm.generate(prompts, n=3, temperature=1.0, top_k=1, max_new_tokens=6)
    assert sampled == [[g[0]] * 3 for g in greedy]


def test_next_token_logprobs_read_the_candidate_tokens(tiny_llama_path):
    """With logits set by hand, log P(word) = logit(word) - logsumexp(all logits), for the word's
    own token: not "zebra", not the bare space that starts " True" and " False" in this vocab."""
    from tests.rerank.test_rankrag import BIASES, OTHER, set_logit_llm

    llm, ids = set_logit_llm(tiny_llama_path)
    vocab = len(llm.tokenizer)
    log_z = logsumexp(list(BIASES.values()) + [OTHER] * (vocab - len(BIASES)))
    rows = llm.next_token_logprobs(["Is Paris in France?", "a longer prompt about BM25 ranking"],
                                   ["True", "False", "zebra"])
    want = [BIASES["True"] - log_z, BIASES["False"] - log_z, BIASES["zebra"] - log_z]
    assert rows == [pytest.approx(want, abs=1e-4)] * 2
    assert llm.candidate_token_ids("True") == [ids["True"]]
    assert llm.candidate_token_ids("zebra") == [ids["zebra"]]


# -- a vocabulary where " True" is one token --------------------------------------------------
#: next-token logits set by hand: both spellings of each answer word are single tokens
SPACED_LOGITS = {"True": 1.0, "\u0120True": 2.0, "False": 0.5, "\u0120False": 1.5}
SPACED_OTHER = -1.0


@pytest.fixture(scope="module")
def spaced_true_llm(tmp_path_factory):
    """A TransformersLLM over a tiny random Llama whose byte-level BPE keeps a word's leading
    space (no prefix space added), so "True" and " True" are two different single tokens (the
    package's test tokenizer splits " True" into a space and "True"). The output layer ignores
    its input: logit(token) = ``SPACED_LOGITS[token]``, ``SPACED_OTHER`` for every other token."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("spaced_true_llama")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(["True False Is Paris in France? Answer True or False. " * 20,
                             "True", "False"] * 10, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe)
    tok.pad_token = tok.eos_token = "<|im_end|>"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    llm = TransformersLLM(str(path), batch_size=4, dtype="float32", use_chat_template=False)
    model, tok, _ = llm._model.get()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPACED_LOGITS}
    head = torch.nn.Linear(config.hidden_size, len(tok), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(SPACED_OTHER)
        for t, i in ids.items():
            head.bias[i] = SPACED_LOGITS[t]
    model.lm_head = head
    return llm, ids


def test_both_spellings_of_the_answer_word_count_when_the_space_is_part_of_the_token(
        spaced_true_llm):
    """RankRAG scores "the probability of generating True": the answer may start with "True" or
    with " True", so P(True) = p("True") + p(" True") (probabilities add; neither spelling alone,
    nor the larger of the two). Written from the set logits: True 1, " True" 2, False 0.5,
    " False" 1.5, every other token -1."""
    from funnel_core.rerank.rankrag import RankRAGScorer
    from funnel_core.units import Unit

    llm, ids = spaced_true_llm
    tok = llm.tokenizer
    assert tok.encode(" True", add_special_tokens=False) == [ids["\u0120True"]]    # one token
    assert tok.encode("True", add_special_tokens=False) == [ids["True"]]
    assert sorted(llm.candidate_token_ids("True")) == sorted([ids["True"], ids["\u0120True"]])
    z = sum(math.exp(v) for v in SPACED_LOGITS.values()) + \
        (len(tok) - len(SPACED_LOGITS)) * math.exp(SPACED_OTHER)
    p_true = (math.exp(1.0) + math.exp(2.0)) / z
    p_false = (math.exp(0.5) + math.exp(1.5)) / z
    rows = llm.next_token_logprobs(["Is Paris in France?", "A longer prompt: is Paris in France?"],
                                   ["True", "False"])
    assert rows == [pytest.approx([math.log(p_true), math.log(p_false)], abs=1e-5)] * 2
    # the scorer's default: P(True) renormalised over the two answer words
    units = [Unit(id="a", text="Paris is in France.")]
    out = RankRAGScorer(llm=llm, prompt="{passage} {question}")("Is Paris in France?", units)
    assert out[0].score == pytest.approx(p_true / (p_true + p_false), abs=1e-6)


def test_a_candidate_with_leading_whitespace_names_the_word_after_a_space(spaced_true_llm):
    """The answer word's spellings are the bare word and the word after a space. A candidate
    written with whitespace of its own ("  True", "\\tTrue", "\\n True") names the word after a
    space: as written, it starts with a whitespace-only token (which starts any answer and says
    nothing), so only " True" counts. Set logits: True 1, " True" 2, False 0.5, " False" 1.5,
    every other token -1."""
    llm, ids = spaced_true_llm
    for candidate in ("  True", "\tTrue", "\n True"):
        assert llm.candidate_token_ids(candidate) == [ids["\u0120True"]], candidate
    z = sum(math.exp(v) for v in SPACED_LOGITS.values()) + \
        (len(llm.tokenizer) - len(SPACED_LOGITS)) * math.exp(SPACED_OTHER)
    rows = llm.next_token_logprobs(["Is Paris in France?"], ["\tTrue", "True"])
    assert rows == [pytest.approx([2.0 - math.log(z), math.log(math.exp(1.0) + math.exp(2.0))
                                   - math.log(z)], abs=1e-5)]


class _Logprobs(LLM):
    """A provider with token log-probabilities that returns the rows it is given."""

    supports_logprobs = True

    def __init__(self, rows=None, fail=None, **kw):
        super().__init__(**kw)
        self.rows, self.fail = rows, fail

    def _generate(self, prompts, **kw):
        raise AssertionError("not used")

    def _next_token_logprobs(self, prompts, candidates):
        if self.fail:
            raise self.fail
        return self.rows if self.rows is not None else [[-0.5] * len(candidates) for _ in prompts]


def test_next_token_logprobs_contract_and_errors():
    """The log-probability path RankRAG scores with: one row per prompt, one value per
    candidate, as Python floats; a provider that breaks that is refused, naming what it did."""
    assert _Logprobs().next_token_logprobs(["p", "q"], ["True", "False"]) == [[-0.5, -0.5]] * 2
    assert _Logprobs().next_token_logprobs([], ["True"]) == []
    with pytest.raises(NotImplementedError, match=r"^Scripted exposes generated text only, not token "
                       r"log-probabilities; use generate\(\) and parse the answer "
                       r"\(RankRAGScorer\(mode='generate'\) does this\)\.$"):
        Scripted().next_token_logprobs(["p"], ["True"])
    with pytest.raises(ValueError, match=r"^candidates must name at least one answer word, e\.g\. "
                       r"\['True', 'False'\]\.$"):
        _Logprobs().next_token_logprobs(["p"], [])
    for rows in ([[-0.1, -0.2]], [[-0.1], [-0.2]]):   # one row short; rows one value short
        llm = _Logprobs(rows=rows)
        with pytest.raises(LLMError, match=r"returned log-probabilities of the wrong shape for 2 "
                           r"prompts x 2 candidates\.$"):
            llm.next_token_logprobs(["p", "q"], ["True", "False"])
    with pytest.raises(LLMError, match=r"failed during next_token_logprobs for a batch of 3 "
                       r"prompt\(s\): RuntimeError: boom\. Nothing was scored\.$"):
        _Logprobs(fail=RuntimeError("boom")).next_token_logprobs(["a", "b", "c"], ["True"])
