"""FB-RAG forward lookup: chunking, Stage I recall, Stage II sampling, S_FB, budgets, order."""

import pytest

from funnel_core.bm25 import bm25_scores
from funnel_core.fbrag import (
    FORWARD_PROMPT,
    FORWARD_PROMPTS,
    PAPER_FORWARD_PROMPTS,
    ForwardLookup,
    ForwardSample,
    chunk_context,
    parse_rationale_answer,
)
from funnel_core.llm import LLM, LLMError, LLMTimeoutError, TransformersLLM

# Ten ~20-word paragraphs; the answer ("Marlowe") sits in a chunk that shares no word with the
# question except "play", while a decoy chunk repeats the question's words.
PARAS = [
    "The castle of Elsinore stands on the coast of Denmark near the sound, guarded by soldiers.",
    "Who wrote the famous play about the prince? Many readers ask who wrote the play and when.",
    "Christopher Marlowe was an Elizabethan playwright who wrote Doctor Faustus and Tamburlaine.",
    "The weather in Denmark is mild in summer and cold in winter with frequent rain showers.",
    "Rivers in Europe carry goods between cities and have done so since the Roman empire ended.",
    "Bread is baked from flour, water and yeast, then left to rise before it goes into the oven.",
]
CONTEXT = "\n\n".join(PARAS)
QUESTION = "Who wrote the play Doctor Faustus?"


class Reader(LLM):
    """A scripted light LLM that 'reads' the context and answers with a rationale."""

    def __init__(self, reply="Rationale: Christopher Marlowe was an Elizabethan playwright. "
                             "Answer: Christopher Marlowe", fail=None, delay=0.0, **kw):
        super().__init__(**kw)
        self.reply, self.fail, self.delay, self.calls = reply, fail, delay, []

    def _generate(self, prompts, *, n, **params):
        import time

        self.calls.append(dict(prompts=prompts, n=n, **params))
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise self.fail
        return [[self.reply] * n for _ in prompts]


def units():
    return chunk_context(CONTEXT, chunk_words=20)


def test_parse_rationale_answer_variants():
    s = parse_rationale_answer("Rationale: the text says X.\nAnswer: X")
    assert (s.rationale, s.answer) == ("the text says X.", "X")
    s = parse_rationale_answer("Sure! Here it is. rationale - because Y. FINAL ANSWER: Y")
    assert (s.rationale, s.answer) == ("because Y.", "Y")
    s = parse_rationale_answer("Just some chatter without markers")
    assert (s.rationale, s.answer) == ("Just some chatter without markers", "")
    assert parse_rationale_answer("Answer: Z").lookup_text == "Z"


def test_chunk_context_default_300_words_and_positions():
    long_text = " ".join(f"Sentence {i} is here." for i in range(200))  # 800 words
    chunks = chunk_context(long_text)
    assert all(len(c.text.split()) <= 300 for c in chunks) and len(chunks) == 3
    assert [c.funnel["position"] for c in chunks] == [0, 1, 2]
    assert " ".join(c.text for c in chunks).split() == long_text.split()
    assert len(chunk_context(["doc one.", "doc two."], 300)) == 2
    with pytest.raises(ValueError, match="context is empty"):
        chunk_context("   ")
    with pytest.raises(TypeError, match="context must be a str"):
        chunk_context([1, 2])


def test_bad_configuration_is_rejected():
    with pytest.raises(ValueError, match="samples \\(K"):
        ForwardLookup(llm=Reader(), samples=0)
    with pytest.raises(ValueError, match=r"missing \{context\}"):
        ForwardLookup(llm=Reader(), prompt="Question: {question}")
    with pytest.raises(ValueError, match="smaller than one chunk"):
        ForwardLookup(llm=Reader(), budget_words=100, chunk_words=300)
    with pytest.raises(ValueError, match="both 0"):
        ForwardLookup(llm=Reader(), eta_backward=0, eta_forward=0)
    with pytest.raises(ValueError, match="unknown FB-RAG preset"):
        ForwardLookup.preset("X", llm=Reader())
    with pytest.raises(ValueError, match="top_p"):
        ForwardLookup(llm=Reader(), top_p=2)


def test_stage2_samples_with_paper_settings_and_reads_stage1_in_order():
    reader = Reader()
    fb = ForwardLookup.preset("F", llm=reader, recall_k=3, k=1, chunk_words=20)
    res = fb.search_context(QUESTION, CONTEXT)
    call = reader.calls[0]
    assert (call["n"], call["top_p"], call["top_k"]) == (5, 0.9, 50) and call["temperature"] > 0
    prompt = call["prompts"][0]
    assert prompt.startswith(FORWARD_PROMPT.split("{context}")[0]) and f"Question: {QUESTION}" in prompt
    positions = [u.funnel["fb_rag_order"] for u in res.stage1]
    stage1_texts = sorted(zip(positions, (u.text for u in res.stage1)))
    seen = [prompt.index(t) for _, t in stage1_texts]
    assert seen == sorted(seen)               # the LLM reads Stage I chunks in original order
    assert len(res.samples) == 5 and res.samples[0].answer == "Christopher Marlowe"
    assert set(res.seconds) == {"chunking", "stage1", "stage2_sampling", "stage2_scoring_and_selection"}


def test_s_fb_formula_and_metadata():
    fb = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20, normalize=True)
    res = fb.search(QUESTION, units())
    texts = [u.text for u in units()]
    b = bm25_scores(QUESTION, texts)
    f = bm25_scores(res.samples[0].lookup_text, texts)
    for u in res.scored:
        i = u.funnel["position"]
        assert u.funnel["backward_score"] == pytest.approx(b[i] / max(b))
        assert max(u.funnel["forward_scores"]) == pytest.approx(f[i] / max(f))
        assert u.score == pytest.approx(0.5 * b[i] / max(b) + 0.5 * f[i] / max(f))
        assert len(u.funnel["samples"]) == 5 and u.scores["fb_rag[FB]"] == u.score


def test_forward_lookup_finds_what_backward_bm25_misses():
    chunks = units()
    marlowe = next(u.id for u in chunks if "Marlowe" in u.text)
    backward = ForwardLookup.preset("B", llm=Reader(), k=1, chunk_words=20)("who wrote the play", chunks)
    forward = ForwardLookup.preset("F", llm=Reader(), k=1, chunk_words=20)("who wrote the play", chunks)
    assert backward[0].id != marlowe and forward[0].id == marlowe


def test_order_preserving_and_budgets():
    chunks = units()
    fb = ForwardLookup.preset("FB", llm=Reader(), k=3, chunk_words=20)
    kept = fb(QUESTION, chunks)
    assert [u.funnel["position"] for u in kept] == sorted(u.funnel["position"] for u in kept)
    ranked = ForwardLookup.preset("FB", llm=Reader(), k=3, chunk_words=20, order_preserving=False)
    best = ranked(QUESTION, chunks)
    assert [u.score for u in best] == sorted((u.score for u in best), reverse=True)
    assert {u.id for u in best} == {u.id for u in kept}
    words = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20, budget_words=45)(QUESTION, chunks)
    assert sum(len(u.text.split()) for u in words) <= 45 and best[0].id in {u.id for u in words}
    tiny = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20, budget_tokens=3)
    with pytest.raises(ValueError, match="budget_tokens=3 is smaller than every chunk"):
        tiny(QUESTION, chunks)
    assert fb.search(QUESTION, chunks, k=1).units[0].id == best[0].id


def test_empty_inputs_and_provider_failures():
    fb = ForwardLookup.preset("F", llm=Reader(), chunk_words=20)
    assert fb(QUESTION, []) == []
    # an empty query scores nothing: the chunks keep their order, as in every stage
    assert [u.id for u in fb("  ", units())] == [u.id for u in units()]
    with pytest.raises(ValueError, match="context is empty"):
        fb.search_context(QUESTION, "")
    broken = ForwardLookup.preset("F", llm=Reader(fail=ConnectionError("down")), chunk_words=20)
    chunks = units()
    with pytest.raises(LLMError, match="ConnectionError: down"):
        broken(QUESTION, chunks)
    assert not any("scores" in u.metadata for u in chunks)
    slow = ForwardLookup.preset("F", llm=Reader(delay=1.0, timeout=0.1), chunk_words=20)
    with pytest.raises(LLMTimeoutError):
        slow(QUESTION, chunks)
    # backward-only never calls the LLM
    reader = Reader(fail=RuntimeError("must not be called"))
    assert len(ForwardLookup.preset("B", llm=reader, k=2, chunk_words=20)(QUESTION, chunks)) == 2


def test_chatty_output_without_markers_still_scores():
    fb = ForwardLookup.preset("F", llm=Reader(reply="I think Marlowe, the Elizabethan playwright."),
                              k=1, chunk_words=20)
    assert "Marlowe" in fb(QUESTION, units())[0].text


async def test_async_search():
    fb = ForwardLookup.preset("F", llm=Reader(), k=1, chunk_words=20)
    out = await fb.acall("who wrote the play", units())
    assert "Marlowe" in out[0].text


def test_with_a_real_local_causal_lm(tiny_llama_path):
    llm = TransformersLLM(tiny_llama_path, seed=0)
    fb = ForwardLookup.preset("FB", llm=llm, samples=2, max_new_tokens=6, k=2, chunk_words=20,
                              reader_words=40)
    res = fb.search_context(QUESTION, CONTEXT)
    assert len(res.samples) == 2 and all(isinstance(s.text, str) for s in res.samples)
    assert len(res.units) == 2 and all(len(u.funnel["forward_scores"]) == 2 for u in res.units)


def test_default_stage2_prompt_asks_for_brief_reasoning_and_quote_is_an_option():
    """FB-RAG Table 4: a brief reasoning, then the answer (the default); quoting is an option."""
    assert FORWARD_PROMPTS["paper"] == FORWARD_PROMPT
    assert "reasoning briefly" in FORWARD_PROMPT and "quoted" not in FORWARD_PROMPT
    assert "Rationale: <brief reasoning>" in FORWARD_PROMPTS["paper_multiple_choice"]
    assert "quoted or closely paraphrased" in FORWARD_PROMPTS["quote"]
    assert "quoted or closely paraphrased" in FORWARD_PROMPTS["quote_multiple_choice"]
    for name, template in FORWARD_PROMPTS.items():
        assert "{context}" in template and "{question}" in template, name
        if not name.startswith("paper_") or name == "paper_multiple_choice":
            assert template.rstrip().endswith(">"), name
    reader = Reader()
    ForwardLookup.preset("F", llm=reader, recall_k=3, k=1, chunk_words=20).search_context(QUESTION, CONTEXT)
    assert "explain your reasoning briefly" in reader.calls[0]["prompts"][0]
    quoting = Reader()
    ForwardLookup.preset("F", llm=quoting, recall_k=3, k=1, chunk_words=20,
                         prompt=FORWARD_PROMPTS["quote"]).search_context(QUESTION, CONTEXT)
    assert "quoted or closely paraphrased" in quoting.calls[0]["prompts"][0]


# -- Eq. 5 and the lookup, against references written from the paper ------------------------
class ScriptedReader(LLM):
    """A light LLM (a real :class:`LLM` subclass) whose K samples differ: it returns the scripted
    outputs in turn, so the test controls what each sample says."""

    def __init__(self, outputs, **kw):
        super().__init__(**kw)
        self.outputs, self.calls = list(outputs), []

    def _generate(self, prompts, *, n, **params):
        self.calls.append(dict(prompts=prompts, n=n, **params))
        return [[self.outputs[i % len(self.outputs)] for i in range(n)] for _ in prompts]


def _argmax(xs):
    return max(range(len(xs)), key=lambda i: xs[i])


def test_eq5_takes_the_max_over_the_k_samples_not_the_mean():
    """S_F(C_i) = max_k S(C_i; [R_k, A_k]) (Eq. 5). One sample points hard at the Marlowe chunk;
    two others share words with the weather chunk. Max: Marlowe wins; mean: weather wins."""
    outputs = ["Rationale: Christopher Marlowe Elizabethan playwright Tamburlaine Faustus. "
               "Answer: Marlowe",
               "Rationale: Denmark summer winter rain. Answer: mild weather",
               "Rationale: Denmark cold winter showers. Answer: mild weather"]
    chunks = units()
    texts = [u.text for u in chunks]
    rows = [bm25_scores(parse_rationale_answer(o).lookup_text, texts) for o in outputs]
    by_max = [max(r[i] for r in rows) for i in range(len(texts))]
    by_mean = [sum(r[i] for r in rows) / len(rows) for i in range(len(texts))]
    assert _argmax(by_max) != _argmax(by_mean)                     # the test can tell them apart
    fb = ForwardLookup.preset("F", llm=ScriptedReader(outputs), samples=3, k=None,
                              normalize=False, chunk_words=20)
    res = fb.search(QUESTION, chunks)
    assert len({s.text for s in res.samples}) == 3                 # K different samples
    got = {u.funnel["position"]: u.score for u in res.scored}
    assert [got[i] for i in range(len(texts))] == pytest.approx(by_max)
    best = max(res.scored, key=lambda u: u.score)
    assert "Marlowe" in best.text and best.funnel["position"] == _argmax(by_max)


def test_every_chunk_of_the_full_context_is_scored_not_only_stage1():
    """Stage I only chooses what the light LLM reads; S_FB scores every chunk of C. With
    recall_k=1 the Marlowe chunk is not in Stage I, and the forward lookup must still find it."""
    chunks = units()
    fb = ForwardLookup.preset("F", llm=Reader(), recall_k=1, k=1, chunk_words=20, normalize=False)
    res = fb.search("who wrote the play", chunks)
    assert len(res.stage1) == 1 and "Marlowe" not in res.stage1[0].text
    assert len(res.scored) == len(chunks)
    texts = [u.text for u in chunks]
    want = bm25_scores(res.samples[0].lookup_text, texts)          # BM25 over all of C
    got = {u.funnel["position"]: u.score for u in res.scored}
    assert [got[i] for i in range(len(texts))] == pytest.approx(want)
    assert "Marlowe" in res.units[0].text


def test_lookup_text_is_rationale_and_answer_not_the_answer_alone():
    """S(C_i; [R_k, A_k]): the rationale counts. Here the rationale points at the castle chunk and
    the answer alone at the weather chunk; with [R, A] the castle chunk wins."""
    sample = ("Rationale: The castle of Elsinore stands on the coast guarded by soldiers near "
              "the sound. Answer: rain showers")
    chunks = units()
    texts = [u.text for u in chunks]
    parsed = parse_rationale_answer(sample)
    both = bm25_scores(f"{parsed.rationale} {parsed.answer}", texts)
    answer_only = bm25_scores(parsed.answer, texts)
    assert _argmax(both) != _argmax(answer_only)
    fb = ForwardLookup.preset("F", llm=ScriptedReader([sample]), samples=1, k=1,
                              normalize=False, chunk_words=20)
    res = fb.search(QUESTION, chunks)
    assert res.units[0].funnel["position"] == _argmax(both)
    assert "Elsinore" in res.units[0].text
    got = {u.funnel["position"]: u.score for u in res.scored}
    assert [got[i] for i in range(len(texts))] == pytest.approx(both)
    assert ForwardSample("t", "R words", "A").lookup_text == "R words A"


def test_stage3_reduces_the_context_by_default():
    """C^II is a reduction of C: by default the 3 best chunks (k=3), not all of them."""
    chunks = units()
    fb = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20)
    assert fb.k == 3
    out = fb(QUESTION, chunks)
    assert len(out) == 3 < len(chunks)
    ranked = sorted(fb.search(QUESTION, chunks).scored, key=lambda u: -u.score)
    assert {u.id for u in out} == {u.id for u in ranked[:3]}
    everything = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20, k=None)
    assert len(everything(QUESTION, chunks)) == len(chunks)
    budget = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20, k=None, budget_words=45)
    assert sum(len(u.text.split()) for u in budget(QUESTION, chunks)) <= 45


def test_paper_stage2_prompts_per_dataset():
    """The reconstructed per-dataset prompts: a 2-3 sentence rationale starting with
    'Rationale:' then the answer (EN.QA, EN.MC); QMSum asks for the answer without a rationale."""
    assert set(PAPER_FORWARD_PROMPTS) == {"en_qa", "en_mc", "qmsum"}
    for name in ("en_qa", "en_mc"):
        text = PAPER_FORWARD_PROMPTS[name]
        assert "2-3 sentences" in text and "'Rationale:'" in text and "'Answer:'" in text
        assert FORWARD_PROMPTS[f"paper_{name}"] == text
    assert "Rationale" not in PAPER_FORWARD_PROMPTS["qmsum"] and "'Answer:'" in PAPER_FORWARD_PROMPTS["qmsum"]
    reader = ScriptedReader(["Answer: the team agreed on the budget"])
    fb = ForwardLookup.preset("F", llm=reader, prompt=FORWARD_PROMPTS["paper_qmsum"], samples=1,
                              chunk_words=20)
    res = fb.search_context("What did the team decide?", CONTEXT)
    assert reader.calls[0]["prompts"][0].endswith("Query: What did the team decide?")
    assert res.samples[0].rationale == "" and res.samples[0].lookup_text == "the team agreed on the budget"


def test_recall_is_stage1_bm25_best_first():
    """Stage I: the recall_k chunks with the highest S(C; Q), best first, each rescored under
    "fb_rag_stage1" with its input position."""
    chunks = units()
    texts = [u.text for u in chunks]
    b = bm25_scores(QUESTION, texts)
    fb = ForwardLookup.preset("FB", llm=Reader(), recall_k=3, chunk_words=20)
    top, backward = fb.recall(QUESTION, chunks)
    want = sorted(range(len(texts)), key=lambda i: -b[i])[:3]
    assert [u.funnel["fb_rag_order"] for u in top] == want
    assert backward == pytest.approx(b)
    assert [u.scores["fb_rag_stage1"] for u in top] == pytest.approx([b[i] for i in want])


def test_score_called_alone_builds_its_own_index_and_positions():
    """score() without an index or backward scores: BM25 over the given units; units without a
    position get their input index."""
    from funnel_core.units import Unit

    texts = [u.text for u in units()]
    bare = [Unit(id=f"u{i}", text=t) for i, t in enumerate(texts)]
    sample = parse_rationale_answer(Reader().reply)
    fb = ForwardLookup.preset("FB", llm=Reader(), normalize=False, chunk_words=20)
    out = fb.score(QUESTION, bare, [sample])
    b, f = bm25_scores(QUESTION, texts), bm25_scores(sample.lookup_text, texts)
    assert [u.score for u in out] == pytest.approx([0.5 * x + 0.5 * y for x, y in zip(b, f)])
    assert [u.funnel["position"] for u in out] == list(range(len(texts)))
    # no samples: the forward part is 0, not 1
    alone = fb.search(QUESTION, units(), samples=[])
    assert sorted(u.score for u in alone.scored) == pytest.approx(sorted(0.5 * x for x in b))


def test_max_normalisation_divides_by_the_maximum():
    fb = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20)
    assert fb._scale([0.5, 0.25, 0.0]) == pytest.approx([1.0, 0.5, 0.0])
    assert fb._scale([0.0, 0.0]) == [0.0, 0.0] and fb._scale([]) == []


def test_budgets_are_inclusive_skip_too_long_chunks_and_clean_up():
    from funnel_core.units import Unit

    # three chunks of 5, 8 and 3 words; scores make the 8-word chunk second best
    chunks = [Unit(id="a", text="one two three four five", score=3.0, funnel={"fb_rag_order": 0}),
              Unit(id="b", text="a b c d e f g h", score=2.0, funnel={"fb_rag_order": 1}),
              Unit(id="c", text="x y z", score=1.0, funnel={"fb_rag_order": 2})]
    words = ForwardLookup.preset("FB", llm=Reader(), chunk_words=5, k=None, budget_words=8)
    # 5 fits, 5 + 8 does not (skipped, not the end), 5 + 3 = 8 fits exactly
    assert [u.id for u in words.select(chunks)] == ["a", "c"]
    tokens = ForwardLookup.preset("FB", llm=Reader(), chunk_words=5, k=None, budget_tokens=13)
    assert [u.id for u in tokens.select(chunks)] == ["a", "b"]           # 5 + 8 = 13 exactly
    tight = ForwardLookup.preset("FB", llm=Reader(), chunk_words=5, k=None, budget_tokens=9)
    assert [u.id for u in tight.select(chunks)] == ["a", "c"]            # 5 + 3; 5 + 8 > 9
    assert all("fb_rag_order" not in u.funnel for u in tight.select(chunks))
    with pytest.raises(ValueError, match=r"^k must be >= 1"):
        words.select(chunks, k=0)
    with pytest.raises(ValueError, match="raise the budget or lower chunk_words."):
        ForwardLookup.preset("FB", llm=Reader(), chunk_words=5, budget_tokens=2).select(chunks)


def test_parse_rationale_answer_reads_non_text_output():
    s = parse_rationale_answer(42)
    assert (s.text, s.rationale, s.answer) == ("42", "42", "")


# Four chunks that all contain "play": BM25 with the question scores every chunk above 0, so
# dividing by the maximum and min-max scaling give different numbers.
PLAY_PARAS = [
    "The play was staged in London in the spring and the play ran for a month.",
    "Christopher Marlowe wrote the play Doctor Faustus about a scholar who sells his soul.",
    "Critics still argue which play came first and who wrote it, Marlowe or another author.",
    "A play needs actors, a stage and an audience; this one had all three that night.",
]


def test_normalisation_divides_each_score_vector_by_its_maximum_not_min_max():
    """normalize=True: S(C_i; .) / max_j S(C_j; .), for the question and for each sample; the
    lowest chunk keeps a positive share instead of dropping to 0 as min-max scaling would do."""
    sample = "Rationale: Marlowe wrote Doctor Faustus, a play about a scholar. Answer: Marlowe"
    chunks = chunk_context(PLAY_PARAS, chunk_words=40)
    texts = [u.text for u in chunks]
    b = bm25_scores(QUESTION, texts)
    f = bm25_scores(parse_rationale_answer(sample).lookup_text, texts)
    assert min(b) > 0 and min(f) > 0                   # the two scalings disagree here
    fb = ForwardLookup.preset("FB", llm=ScriptedReader([sample]), samples=1, k=None,
                              chunk_words=40, normalize=True)
    res = fb.search(QUESTION, chunks)
    got = {u.funnel["position"]: u for u in res.scored}
    for i in range(len(texts)):
        assert got[i].funnel["backward_score"] == pytest.approx(b[i] / max(b))
        assert got[i].funnel["forward_scores"] == pytest.approx([f[i] / max(f)])
        assert got[i].score == pytest.approx(0.5 * b[i] / max(b) + 0.5 * f[i] / max(f))
    assert min(u.score for u in res.scored) > 0
    assert fb._scale([4.0, 2.0, 1.0]) == pytest.approx([1.0, 0.5, 0.25])


def test_the_answer_is_what_follows_the_last_answer_marker():
    """The Stage II output is "Rationale: <R> Answer: <A>": A is the text after the final
    "Answer:" marker, so a rationale that itself says "answer:" stays whole in R."""
    text = ("Rationale: The question asks for the answer: who wrote Doctor Faustus. Marlowe "
            "did. Answer: Christopher Marlowe")
    s = parse_rationale_answer(text)
    assert s.rationale == "The question asks for the answer: who wrote Doctor Faustus. Marlowe did."
    assert s.answer == "Christopher Marlowe"
    fb = ForwardLookup.preset("F", llm=ScriptedReader([text]), samples=1, chunk_words=20)
    res = fb.search(QUESTION, units())
    assert (res.samples[0].rationale, res.samples[0].answer) == (s.rationale, "Christopher Marlowe")
    assert all(u.funnel["samples"][0]["answer"] == "Christopher Marlowe" for u in res.scored)


def test_the_usage_snippet_of_the_docs_runs():
    """docs/llm_retrieval.md, "FB-RAG forward lookup": the first snippet runs as written, with a
    scripted light LLM as ``llm`` and a long text, and reads the bookkeeping the stage writes."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "llm_retrieval.md").read_text("utf-8")
    section = page.split("## FB-RAG forward lookup", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope = {"llm": Reader(), "long_text": "\n\n".join([CONTEXT] * 10)}
    exec(compile(code, "docs/llm_retrieval.md", "exec"), scope)
    res = scope["res"]
    assert len(res.units) == 3 and len(res.samples) == 5
    assert isinstance(res.units[0].funnel["backward_score"], float)
    assert len(res.units[0].funnel["forward_scores"]) == 5


def test_score_mixes_the_backward_scores_it_is_given():
    """S_B(C_i) = S(C_i; Q) is computed once, in Stage I, and ``score(backward=...)`` mixes those
    numbers instead of running BM25 with the question again: a vector that is not the question's
    BM25 shows up unchanged as each unit's S_B."""
    chunks = units()
    given = [float(i) for i in range(len(chunks))]              # not BM25 with the question
    assert given != pytest.approx(bm25_scores(QUESTION, [u.text for u in chunks]))
    fb = ForwardLookup.preset("FB", llm=Reader(), normalize=False, chunk_words=20)
    sample = parse_rationale_answer(Reader().reply)
    f = bm25_scores(sample.lookup_text, [u.text for u in chunks])
    out = fb.score(QUESTION, chunks, [sample], backward=given)
    assert [u.funnel["backward_score"] for u in out] == pytest.approx(given)
    assert [u.score for u in out] == pytest.approx([0.5 * b + 0.5 * x for b, x in zip(given, f)])


def test_chunks_are_not_token_counted_without_a_token_budget():
    """Stage III counts a chunk's tokens only to fit ``budget_tokens``; with ``k`` alone no chunk
    goes through the (possibly slow, model tokenizer) counter."""
    counted = []

    def counter(text):
        counted.append(text)
        return len(text.split())

    chunks = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20).score(
        QUESTION, units(), [parse_rationale_answer(Reader().reply)])
    by_k = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20, k=2, token_counter=counter)
    assert len(by_k.select(chunks)) == 2 and counted == []
    by_tokens = ForwardLookup.preset("FB", llm=Reader(), chunk_words=20, k=None,
                                     budget_tokens=1000, token_counter=counter)
    assert len(by_tokens.select(chunks)) == len(chunks) and len(counted) == len(chunks)
