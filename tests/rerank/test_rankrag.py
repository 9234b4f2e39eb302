"""RankRAG: the True-probability path (one forward pass, no generation) and the tolerant parser."""

import math

import pytest

from funnel_core.llm import LLM, LLMError, TransformersLLM
from funnel_core.rerank.rankrag import (
    DEFAULT_RANKRAG_PROMPT,
    RANKRAG_INSTRUCTION,
    RANKRAG_PROMPTS,
    RankRAGScorer,
    check_prompt_template,
    conversation_query,
    parse_true_false,
    split_conversation,
)


class Judge(LLM):
    """A text-only provider: chatty 'True' when the passage mentions Paris, else chatty 'False'."""

    def __init__(self, fail=False, **kw):
        super().__init__(**kw)
        self.fail, self.prompts = fail, []

    def _generate(self, prompts, *, n, **kw):
        if self.fail:
            raise RuntimeError("rate limited")
        self.prompts += prompts
        out = []
        for p in prompts:
            passage = p.split("For the question")[0]
            if "Paris" in passage:
                out.append(["Sure! After reading carefully: **True** - it is relevant."] * n)
            elif "Berlin" in passage:
                out.append(["I'm sorry, I cannot tell."] * n)  # no judgement word
            else:
                out.append(["Hmm. The passage is not relevant, so: false."] * n)
        return out


@pytest.mark.parametrize("text,expected", [
    ("True", True), ("false", False), ("  **TRUE**.", True), ("Answer: False\nbecause", False),
    ("Yes, it is.", True), ("No.", False), ("The passage is not relevant.", False),
    ("It is relevant to the question", True), ("It isn't relevant", False),
    ("I cannot say", None), ("", None), (None, None), ("42 :) ???", None),
    ("Not relevant.", False), ("Relevant, or not?", True), ("it isn relevant", False),
])
def test_parse_true_false_is_tolerant(text, expected):
    assert parse_true_false(text) is expected


def test_prompt_validation_names_missing_and_unknown_placeholders():
    assert "{question}" in RANKRAG_INSTRUCTION and "access whether" in RANKRAG_INSTRUCTION
    check_prompt_template(DEFAULT_RANKRAG_PROMPT, ("question", "passage"))
    with pytest.raises(ValueError, match=r"missing \{passage\}"):
        RankRAGScorer(llm=Judge(), prompt="For the question {question}, relevant?")
    with pytest.raises(ValueError, match=r"unknown \{doc\}"):
        RankRAGScorer(llm=Judge(), prompt="{question} {passage} {doc}")
    with pytest.raises(ValueError, match="not a valid str.format"):
        RankRAGScorer(llm=Judge(), prompt="{question} {passage} {")
    with pytest.raises(ValueError, match="mode must be"):
        RankRAGScorer(llm=Judge(), mode="magic")
    with pytest.raises(ValueError, match="exposes text only"):
        RankRAGScorer(llm=Judge(), mode="logprobs")


def test_generate_and_parse_fallback_never_crashes(corpus_units):
    judge = Judge()
    scorer = RankRAGScorer(llm=judge, batch_size=3)
    out = scorer("What is the capital of France?", corpus_units)
    by_id = {u.id: u.score for u in out}
    assert by_id["d0"] == 1.0 and by_id["d2"] == 1.0      # mention Paris -> True
    assert by_id["d1"] == 0.5                              # unparseable -> neutral
    assert by_id["d5"] == 0.0                              # "not relevant ... false"
    assert [u.id for u in out[:2]] == ["d0", "d2"] and scorer.unparsed == 1
    assert out[0].scores == {"rankrag": 1.0} and type(out[0].score) is float
    assert "For the question What is the capital of France?, access whether" in judge.prompts[0]
    assert not any("scores" in u.metadata for u in corpus_units)   # inputs untouched


def test_provider_failure_raises_and_leaves_nothing_half_scored(corpus_units):
    scorer = RankRAGScorer(llm=Judge(fail=True))
    before = [u.to_dict() for u in corpus_units]
    with pytest.raises(LLMError, match="rate limited.*Nothing was scored"):
        scorer("capital of France", corpus_units)
    assert [u.to_dict() for u in corpus_units] == before


async def test_async_generate_path(corpus_units):
    scorer = RankRAGScorer(llm=Judge(), top_n=2)
    out = await scorer.acall("capital of France?", corpus_units)
    assert [u.id for u in out] == ["d0", "d2"]


def test_logprob_path_is_one_forward_pass_per_batch_without_generation(tiny_llama_path, corpus_units):
    # float32: the batches of 3 are compared with one batch of 8 (bf16 depends on the padding)
    llm = TransformersLLM(tiny_llama_path, dtype="float32")
    scorer = RankRAGScorer(llm=llm, batch_size=3)
    assert scorer.uses_logprobs
    model = llm._model.get()[0]
    calls = []
    original_forward = model.forward

    def counting_forward(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return original_forward(*args, **kwargs)

    def no_generate(*a, **k):
        raise AssertionError("the True-probability path must not generate")

    model.forward, model.generate = counting_forward, no_generate
    try:
        out = scorer("Who wrote Hamlet?", corpus_units)
    finally:
        del model.forward, model.generate
    assert calls == [3, 3, 2]                       # 8 pairs, batch_size 3
    rows = llm.next_token_logprobs([scorer.build_prompt("Who wrote Hamlet?", u.text)
                                    for u in corpus_units], ["True", "False"])
    expect = {u.id: math.exp(t) / (math.exp(t) + math.exp(f)) for u, (t, f) in zip(corpus_units, rows)}
    assert {u.id: u.score for u in out} == pytest.approx(expect, abs=1e-6)
    assert [u.score for u in out] == sorted((u.score for u in out), reverse=True)
    assert all(0.0 < u.score < 1.0 for u in out)


def test_top_n_threshold_and_passage_truncation(tiny_llama_path, corpus_units):
    scorer = RankRAGScorer(llm=tiny_llama_path, top_n=3, max_passage_words=3)
    assert "\n\nPassage: one two three\n\nUser: For the question q," in scorer.build_prompt("q", "one two three four five")
    assert len(scorer("Who wrote Hamlet?", corpus_units)) == 3
    assert len((scorer % 1)("Who wrote Hamlet?", corpus_units)) == 1
    assert scorer("   ", corpus_units) == list(corpus_units)[:3]  # order kept, top_n caps
    everything = RankRAGScorer(llm=tiny_llama_path, score_threshold=1.01)
    assert everything("Who wrote Hamlet?", corpus_units) == []


def test_default_prompt_is_appendix_d1():
    """RankRAG Appendix D.1: "System: ... Passage: {Passage} User: {For the question <question>,
    access whether ...}": the system prompt, the passage under its ``Passage:`` label, the
    instruction with its answer sentence."""
    text = DEFAULT_RANKRAG_PROMPT.format(question="Who wrote Hamlet?", passage="Hamlet is a play.")
    assert text == (
        "System: This is a chat between a user and an artificial intelligence assistant. The "
        "assistant gives helpful, detailed, and polite answers to the user's questions based on "
        "the context. The assistant should also indicate when the answer cannot be found in the "
        "context.\n\n"
        "Passage: Hamlet is a play.\n\n"
        "User: For the question Who wrote Hamlet?, access whether the passage is relevant to the "
        "question. Return True if relevant, otherwise False.\n\n"
        "Assistant:")
    assert RANKRAG_PROMPTS["paper"] == DEFAULT_RANKRAG_PROMPT
    small = RANKRAG_PROMPTS["smollm2"].format(question="q?", passage="p")
    assert small == "Passage: p\n\nFor the question q?, access whether the passage is relevant to the question. Answer True or False."


#: RankRAG (arXiv 2407.02485), Appendix D.1 "Context Ranking", the FEVER prompt, character for
#: character as the paper prints it ("{...}" marks what is filled in; the apostrophe is the
#: paper's typographic one).
PAPER_D1_FEVER = (
    "System: This is a chat between a user and an artificial intelligence assistant. The "
    "assistant gives helpful, detailed, and polite answers to the user\u2019s questions based on "
    "the context. The assistant should also indicate when the answer cannot be found in the "
    "context.\n"
    "Passage: {Passage}\n"
    "User: {For the claim <claim>, access whether the passage is relevant to the claim. Return "
    "True if relevant, otherwise False. }\n"
    "Assistant:")

#: The same appendix, the prompt for Doc2dial, Inscit, TopiocQA (conversational QA), character for
#: character (the "..." is the paper's: more earlier turns).
PAPER_D1_CONVERSATIONAL = (
    "System: This is a chat between a user and an artificial intelligence assistant. The "
    "assistant gives helpful, detailed, and polite answers to the user\u2019s questions based on "
    "the context. The assistant should also indicate when the answer cannot be found in the "
    "context.\n"
    "Passage: {Passage}\n"
    "User: {Question 1}\n"
    "Assistant: {Answer 1}\n"
    "...\n"
    "User: {For the question <latest question>, access whether the passage is relevant to the "
    "question. Return True if relevant, otherwise False. }\n"
    "Assistant:")


def _fill_paper(text, fills):
    """The paper's notation filled in: each ``{...}`` replaced by ``fills`` (an instruction keeps
    its own words, ``<...>`` filled), the typographic apostrophe straight, the lines of the turns
    separated by a blank line (the layout of every prompt of this module)."""
    for old, new in fills.items():
        text = text.replace(old, new)
    return text.replace("\u2019", "'").replace("\n", "\n\n")


def test_fever_prompt_is_appendix_d1_fever():
    """RankRAG Appendix D.1, FEVER: "For the claim <claim>, access whether the passage is relevant
    to the claim." in place of the question instruction; the query is the claim."""
    claim, passage = "Nikolaj Coster-Waldau worked with the Fox Broadcasting Company.", "He acted."
    want = _fill_paper(PAPER_D1_FEVER, {
        "{Passage}": passage,
        "{For the claim <claim>, access whether the passage is relevant to the claim. Return True "
        "if relevant, otherwise False. }":
            f"For the claim {claim}, access whether the passage is relevant to the claim. Return "
            "True if relevant, otherwise False."})
    assert RANKRAG_PROMPTS["fever"].format(question=claim, passage=passage) == want
    scorer = RankRAGScorer(llm=Judge(), prompt=RANKRAG_PROMPTS["fever"])
    assert scorer.build_prompt(claim, passage) == want


def test_conversational_prompt_is_appendix_d1_dialogue():
    """RankRAG Appendix D.1, Doc2dial / Inscit / TopiocQA: the earlier turns of the dialogue after
    the passage, then the instruction on the latest question only."""
    q1, a1 = "Who wrote Hamlet?", "William Shakespeare."
    q2, a2 = "When was it written?", "Around 1600."
    latest, passage = "Where was its author born?", "Shakespeare was born in Stratford."
    scorer = RankRAGScorer(llm=Judge(), prompt=RANKRAG_PROMPTS["conversational"])

    def paper(turns):
        return _fill_paper(PAPER_D1_CONVERSATIONAL, {
            "{Passage}": passage,
            "User: {Question 1}\nAssistant: {Answer 1}\n...\n": turns,
            "{For the question <latest question>, access whether the passage is relevant to the "
            "question. Return True if relevant, otherwise False. }":
                f"For the question {latest}, access whether the passage is relevant to the "
                "question. Return True if relevant, otherwise False."})

    one = paper(f"User: {q1}\nAssistant: {a1}\n")
    assert scorer.build_prompt(conversation_query([(q1, a1)], latest), passage) == one
    two = paper(f"User: {q1}\nAssistant: {a1}\nUser: {q2}\nAssistant: {a2}\n")
    assert scorer.build_prompt(conversation_query([(q1, a1), (q2, a2)], latest), passage) == two
    # a single question (no earlier turn) gives the paper's question-answering prompt
    single = DEFAULT_RANKRAG_PROMPT.format(question=latest, passage=passage)
    assert scorer.build_prompt(latest, passage) == single
    assert scorer.build_prompt(conversation_query([], latest), passage) == single


def test_conversation_query_round_trip_and_bad_dialogues():
    history = [("Who wrote Hamlet?", "Shakespeare."), ("When?", "Around 1600.")]
    query = conversation_query(history, "Where was he born?")
    turns, latest = split_conversation(query)
    assert latest == "Where was he born?"
    assert turns == ("User: Who wrote Hamlet?\n\nAssistant: Shakespeare.\n\n"
                     "User: When?\n\nAssistant: Around 1600.\n\n")
    # single newlines and a first question without its "User:" label read the same
    assert split_conversation("Who wrote Hamlet?\nAssistant: Shakespeare.\nUser: When?") == (
        "User: Who wrote Hamlet?\n\nAssistant: Shakespeare.\n\n", "When?")
    assert split_conversation("  plain question? ") == ("", "plain question?")
    with pytest.raises(ValueError, match=r"^a conversational RankRAG query must end with the latest "
                       r"question as a 'User: \.\.\.' turn; it ends with an Assistant turn: "
                       r"'User: Who wrote Hamlet\?\\nAssistant: Shakespeare\.'\. Build it with "
                       r"conversation_query\(history, question\)\.$"):
        split_conversation("User: Who wrote Hamlet?\nAssistant: Shakespeare.")
    long_tail = "User: q\nAssistant: " + "x" * 200
    with pytest.raises(ValueError, match=r"ends with an Assistant turn: 'x{120}'\. Build"):
        split_conversation(long_tail)   # the error quotes the last 120 characters, no more
    with pytest.raises(ValueError, match=r"history\[0\] must be a \(question, answer\) pair"):
        conversation_query(["Who wrote Hamlet?"], "When?")
    with pytest.raises(ValueError, match=r"history\[1\] must be a \(question, answer\) pair"):
        conversation_query([("q", "a"), ("q", "a", "extra")], "When?")
    # {history} is the one optional field; others are still refused, naming it
    with pytest.raises(ValueError, match=r"optional: \{history\}.*unknown \{turns\}"):
        RankRAGScorer(llm=Judge(), prompt="{question} {passage} {turns}")


def test_conversational_scorer_judges_against_the_latest_question():
    """Through the whole scorer: the provider receives each passage with the earlier turns and
    the instruction on the latest question; the ranking follows the judge's replies."""
    from funnel_core.units import Unit

    judge = Judge()
    scorer = RankRAGScorer(llm=judge, prompt=RANKRAG_PROMPTS["conversational"])
    units = [Unit(id="a", text="Rivers flow."), Unit(id="b", text="Paris is in France.")]
    query = conversation_query([("Which country?", "France.")], "What is its capital?")
    out = scorer(query, units)
    assert [u.id for u in out] == ["b", "a"] and [u.score for u in out] == [1.0, 0.0]
    assert len(judge.prompts) == 2 and all(
        "Passage: " in p and "User: Which country?\n\nAssistant: France.\n\nUser: For the question "
        "What is its capital?, access whether" in p for p in judge.prompts)


# -- a model whose next-token logits are set by hand ----------------------------------------
#: next-token logits (the same for every prompt): True 2, False 0, zebra 4, the bare space 3,
#: every other token -1
BIASES = {"True": 2.0, "False": 0.0, "zebra": 4.0, "\u0120": 3.0}
OTHER = -1.0


def set_logit_llm(tiny_llama_path, biases=BIASES, other=OTHER):
    """A TransformersLLM over the tiny Llama whose output layer ignores its input: logit(token) =
    ``biases[token]`` (``other`` for every other token). "zebra" is added to the vocabulary so
    that it is one token with a known id. Returns the LLM and ``{token: id}``."""
    import torch

    llm = TransformersLLM(tiny_llama_path, batch_size=4, dtype="float32")  # head set in fp32
    model, tok, _ = llm._model.get()
    tok.add_tokens(["zebra"])
    model.resize_token_embeddings(len(tok))
    ids = {t: tok.convert_tokens_to_ids(t) for t in biases}
    assert len(set(ids.values())) == len(ids) and tok.unk_token_id not in ids.values()
    head = torch.nn.Linear(model.config.hidden_size, len(tok), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(other)
        for t, i in ids.items():
            head.bias[i] = biases[t]
    model.lm_head = head
    return llm, ids


def test_scores_are_p_true_of_the_answer_word(tiny_llama_path, corpus_units):
    llm, _ = set_logit_llm(tiny_llama_path)
    # P(True) over {True, False} from the logits: e^2 / (e^2 + e^0); neither "zebra" (4) nor the
    # bare space that starts " True" and " False" alike (3) may enter it.
    want = math.exp(2.0) / (math.exp(2.0) + math.exp(0.0))
    for prompt in ("paper", "fever", "conversational", "smollm2"):
        scorer = RankRAGScorer(llm=llm, prompt=RANKRAG_PROMPTS[prompt], batch_size=3)
        out = scorer("Who wrote Hamlet?", corpus_units)
        assert [u.score for u in out] == pytest.approx([want] * len(corpus_units), abs=1e-6)
    # swap the logits of True and False: the score must follow the answer word
    llm2, _ = set_logit_llm(tiny_llama_path, {"True": -1.0, "False": 1.0, "zebra": 4.0, "\u0120": 3.0})
    out = RankRAGScorer(llm=llm2)("Who wrote Hamlet?", corpus_units[:2])
    assert [u.score for u in out] == pytest.approx([1 / (1 + math.exp(2.0))] * 2, abs=1e-6)


def test_raw_p_true_is_the_whole_vocabulary_probability(tiny_llama_path, corpus_units):
    """p_true="raw": P(True) = e^2 / Z over every token of the vocabulary (written from the set
    logits: True 2, False 0, zebra 4, the bare space 3, every other token -1); the default
    renormalises over {True, False}. The two rank differently when P(False) varies, so both are
    checked against their definitions."""
    llm, ids = set_logit_llm(tiny_llama_path)
    vocab = len(llm._model.get()[1])
    z = sum(math.exp(v) for v in BIASES.values()) + (vocab - len(BIASES)) * math.exp(OTHER)
    raw = RankRAGScorer(llm=llm, p_true="raw")("Who wrote Hamlet?", corpus_units[:3])
    assert [u.score for u in raw] == pytest.approx([math.exp(2.0) / z] * 3, rel=1e-5)
    default = RankRAGScorer(llm=llm)("Who wrote Hamlet?", corpus_units[:3])
    assert [u.score for u in default] == pytest.approx([math.exp(2) / (math.exp(2) + 1)] * 3)
    with pytest.raises(ValueError, match="p_true must be one of"):
        RankRAGScorer(llm=llm, p_true="softmax")


def test_p_true_is_the_answer_word_even_when_the_tokenizer_adds_a_bos_token(tiny_llama_path,
                                                                             corpus_units):
    """RankRAG's base models (Llama 3) prepend a begin-of-text token to every text they encode
    with special tokens. P(True) is still the probability of the token that starts the answer,
    "True" (set logits: True 2, False 0, zebra 4, the bare space 3, every other token -1), never
    that of the BOS token, which would give True and False the same score (0.5)."""
    from tokenizers import processors

    llm, ids = set_logit_llm(tiny_llama_path)
    tok = llm.tokenizer
    bos = tok.bos_token_id
    assert bos is not None and bos not in ids.values()
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, bos)])
    assert tok.encode("True")[:1] == [bos]                  # the tokenizer now prepends BOS
    assert llm.candidate_token_ids("True") == [ids["True"]]
    assert llm.candidate_token_ids("False") == [ids["False"]]
    out = RankRAGScorer(llm=llm)("Who wrote Hamlet?", corpus_units[:2])
    assert [u.score for u in out] == pytest.approx([math.exp(2.0) / (math.exp(2.0) + 1.0)] * 2,
                                                   abs=1e-6)


def test_p_true_of_a_model_that_names_no_output_layer(tiny_llama_path):
    """transformers' get_output_embeddings() is None for a causal LM without an ``lm_head``
    attribute (custom code). Its P(True) is read from its own next-token logits all the same:
    log P(word) = logit(word) - logsumexp(all logits), with the logits set by hand."""
    llm, _ = set_logit_llm(tiny_llama_path)
    model = llm._model.get()[0]
    model.get_output_embeddings = lambda: None
    vocab = len(llm.tokenizer)
    log_z = math.log(sum(math.exp(v) for v in BIASES.values())
                     + (vocab - len(BIASES)) * math.exp(OTHER))
    rows = llm.next_token_logprobs(["Who wrote Hamlet?"], ["True", "False"])
    assert rows == [pytest.approx([BIASES["True"] - log_z, BIASES["False"] - log_z], abs=1e-5)]


def test_renormalized_and_raw_p_true_rank_differently():
    """Two passages: A with P(True)=0.30, P(False)=0.60; B with P(True)=0.20, P(False)=0.05.
    Raw ranks A first (0.30 > 0.20); renormalised ranks B first (0.8 > 0.33)."""

    class Fixed(LLM):
        supports_logprobs = True

        def _generate(self, prompts, *, n, **kw):
            raise AssertionError("not used")

        def _next_token_logprobs(self, prompts, candidates):
            table = {"A": (0.30, 0.60), "B": (0.20, 0.05)}
            return [[math.log(table[p.split("Passage: ")[1][0]][0]),
                     math.log(table[p.split("Passage: ")[1][0]][1])] for p in prompts]

    from funnel_core.units import Unit

    units = [Unit(id="a", text="A passage"), Unit(id="b", text="B passage")]
    assert [u.id for u in RankRAGScorer(llm=Fixed(), p_true="raw")("q", units)] == ["a", "b"]
    assert [u.id for u in RankRAGScorer(llm=Fixed())("q", units)] == ["b", "a"]


class Voter(LLM):
    """A text provider that replays a fixed list of replies per prompt and records its calls."""

    def __init__(self, replies):
        super().__init__()
        self.replies, self.calls = replies, []

    def _generate(self, prompts, *, n, **params):
        self.calls.append({"n": n, **params})
        return [[self.replies[i % len(self.replies)] for i in range(n)] for _ in prompts]


def test_sampled_judgements_vote_with_the_generation_settings(corpus_units):
    voter = Voter(["True", "False", "True"])
    scorer = RankRAGScorer(llm=voter, samples=3, max_new_tokens=5)
    out = scorer("q?", corpus_units[:2])
    assert [u.score for u in out] == pytest.approx([2 / 3, 2 / 3])        # share of True votes
    assert voter.calls[0] == {"n": 3, "temperature": 0.7, "top_p": 1.0, "top_k": 0,
                              "max_new_tokens": 5}
    greedy = Voter(["False"])
    RankRAGScorer(llm=greedy)("q?", corpus_units[:1])
    assert greedy.calls[0]["n"] == 1 and greedy.calls[0]["temperature"] == 0.0


async def test_async_generate_path_threshold_top_n_and_stage_name(corpus_units):
    # Judge: Paris -> 1.0, Berlin -> 0.5 (unparsed), everything else -> 0.0
    keep_half = RankRAGScorer(llm=Judge(), score_threshold=0.5)
    out = await keep_half.acall("capital?", corpus_units)
    assert [u.id for u in out] == ["d0", "d2", "d1"]                      # >= threshold kept
    assert out[-1].score == 0.5 and out[0].scores == {"rankrag": 1.0}
    everything = await RankRAGScorer(llm=Judge(), name="judge").acall("capital?", corpus_units)
    assert len(everything) == len(corpus_units) and everything[0].scores == {"judge": 1.0}
    voted = await RankRAGScorer(llm=Voter(["yes", "no"]), samples=2).acall("q?", corpus_units[:1])
    assert voted[0].score == 0.5


def test_passages_at_the_word_limit_are_kept_verbatim(tiny_llama_path):
    scorer = RankRAGScorer(llm=tiny_llama_path, max_passage_words=3, prompt=RANKRAG_PROMPTS["smollm2"])
    assert scorer.build_prompt("q", "one  two three").startswith("Passage: one  two three\n")
    assert scorer.build_prompt("q", "one  two three four").startswith("Passage: one two three\n")
    with pytest.raises(ValueError, match="turns candidate '' into no tokens"):
        scorer.llm.candidate_token_ids("")


def test_half_precision_head_scores_in_float32(tiny_llama_path):
    """P(True) from a bfloat16 model: the output layer is recomputed in float32 from its bf16
    weights, so the log-probabilities match a float64 computation from the same weights and
    hidden state; bf16 logits (8 bits of mantissa) would be off by ~0.1 at these magnitudes."""
    import torch

    llm = TransformersLLM(tiny_llama_path, dtype="bfloat16")
    model, _, _ = llm._model.get()
    head = model.get_output_embeddings()
    assert head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        head.weight.mul_(64.0)                     # logits of tens: bf16 rounding shows
    prompts = ["Passage: Paris is in France. Relevant?", "Passage: Rivers flow. Relevant?"]
    got = llm.next_token_logprobs(prompts, ["True", "False"])
    enc = llm._encode(prompts)
    with torch.no_grad():
        hidden = model.model(**enc).last_hidden_state[:, -1, :]
        logits = hidden.double() @ head.weight.double().T
    logp = torch.log_softmax(logits, dim=-1)
    ids = [llm.candidate_token_ids(w) for w in ("True", "False")]
    want = [[math.log(sum(math.exp(float(row[i])) for i in c)) for c in ids] for row in logp]
    assert float(logits.abs().max()) > 10
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=2e-3)
