"""RankRAG reranking (Yu et al., 2024, section 4.3): an LLM judges each (question, passage) pair.

The score of a passage is the probability that the LLM answers ``True`` to the paper's
context-ranking instruction (Table 1, in the prompt format of Appendix D.1)::

    System: <ChatQA system prompt>

    Passage: <passage>

    User: For the question {question}, access whether the passage is relevant to the question.
    Return True if relevant, otherwise False.

    Assistant:

(:data:`PAPER_RANKRAG_PROMPT`, the default, Appendix D.1's prompt for NQ / TriviaQA / HotpotQA /
PopQA). :data:`RANKRAG_PROMPTS` names the others: ``"fever"`` (Appendix D.1's FEVER prompt, "For
the claim <claim>, ..."; the query is the claim) and ``"conversational"`` (Appendix D.1's prompt
for Doc2dial / INSCIT / TopiOCQA: the earlier turns of the dialogue before the instruction on the
latest question; the query is the dialogue, see :func:`conversation_query`), both from Appendix
D.1; ``"smollm2"`` is a shorter variant of ours for small chat models. For a local model (:class:`~funnel_core.llm.TransformersLLM`)
the probability is read from ONE forward pass per batch, no generation. The paper says only
"the probability of generating True"; the default score (``p_true="renormalized"``) is
``sigmoid(l_T - l_F) = P(True) / (P(True) + P(False))``, where ``l_T`` / ``l_F`` are the
next-token log-probabilities of the *first tokens* of ``True`` and ``False``, each summed over its
spellings with and without a leading space. Renormalising over the two answers removes the mass
a model spends on other first tokens ("The", "Yes", a bare space), which varies with the passage's
length and wording rather than with its relevance, and keeps the score in [0, 1] with 0.5 as "no
preference"; it is not rank-equivalent to the raw ``P(True) = exp(l_T)``, which
``p_true="raw"`` returns. Providers that expose only text (remote chat models through the
LlamaIndex / LangChain adapters) get a tolerant generate-and-parse fallback: the first
True/False (or yes/no, relevant/not relevant) word in the reply decides; a reply with none scores
0.5, so chatty output never crashes a ranking.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.llm import LLM, as_llm, check_prompt_template
from funnel_core.rerank.base import Reranker
from funnel_core.scoring import sigmoid
from funnel_core.settings import Settings

__all__ = ["RankRAGScorer", "RANKRAG_INSTRUCTION", "RANKRAG_CLAIM_INSTRUCTION",
           "RANKRAG_ANSWER_INSTRUCTION", "RANKRAG_SYSTEM_PROMPT", "PAPER_RANKRAG_PROMPT",
           "FEVER_RANKRAG_PROMPT", "CONVERSATIONAL_RANKRAG_PROMPT", "SMOLLM2_RANKRAG_PROMPT",
           "RANKRAG_PROMPTS", "DEFAULT_RANKRAG_PROMPT", "ANSWER_WORDS", "P_TRUE_MODES",
           "parse_true_false", "conversation_query", "split_conversation"]

#: The paper's context-ranking instruction (RankRAG, Table 1), verbatim (including "access").
RANKRAG_INSTRUCTION = ("For the question {question}, access whether the passage is relevant to "
                       "the question.")

#: The FEVER instruction of Appendix D.1 (the claim in place of the question), verbatim; the
#: scorer fills the claim from its query, so the placeholder is ``{question}``.
RANKRAG_CLAIM_INSTRUCTION = ("For the claim {question}, access whether the passage is relevant "
                             "to the claim.")

#: The answer sentence that Appendix D.1 appends to the instruction.
RANKRAG_ANSWER_INSTRUCTION = "Return True if relevant, otherwise False."

#: The system prompt of RankRAG's prompt format (Appendix D.1; the ChatQA system message).
RANKRAG_SYSTEM_PROMPT = ("This is a chat between a user and an artificial intelligence "
                         "assistant. The assistant gives helpful, detailed, and polite answers to "
                         "the user's questions based on the context. The assistant should also "
                         "indicate when the answer cannot be found in the context.")

#: RankRAG's context-ranking prompt as Appendix D.1 gives it: system prompt, the passage under
#: its ``Passage:`` label, the user turn with the instruction and "Return True if relevant, otherwise False.",
#: and the assistant turn to be completed. The turns are written as plain text ("System:",
#: "User:", "Assistant:"), the format of the RankRAG / ChatQA models; with a chat-template model
#: the whole text becomes one user message (pass ``use_chat_template=False`` to the
#: :class:`~funnel_core.llm.TransformersLLM` to feed it raw).
PAPER_RANKRAG_PROMPT = ("System: " + RANKRAG_SYSTEM_PROMPT + "\n\n"
                        "Passage: {passage}\n\n"
                        "User: " + RANKRAG_INSTRUCTION + " " + RANKRAG_ANSWER_INSTRUCTION + "\n\n"
                        "Assistant:")

#: Appendix D.1's context-ranking prompt for FEVER: as :data:`PAPER_RANKRAG_PROMPT` with the
#: claim instruction ("For the claim <claim>, access whether the passage is relevant to the
#: claim."). The query is the claim.
FEVER_RANKRAG_PROMPT = ("System: " + RANKRAG_SYSTEM_PROMPT + "\n\n"
                        "Passage: {passage}\n\n"
                        "User: " + RANKRAG_CLAIM_INSTRUCTION + " " + RANKRAG_ANSWER_INSTRUCTION
                        + "\n\n"
                        "Assistant:")

#: Appendix D.1's context-ranking prompt for conversational QA (Doc2dial, INSCIT, TopiOCQA): the
#: earlier turns of the dialogue ("User: {Question 1}", "Assistant: {Answer 1}", ...) come after
#: the passage, then the instruction on the latest question. ``{history}`` is those turns, each
#: followed by a blank line (empty for a single question: the prompt is then
#: :data:`PAPER_RANKRAG_PROMPT`); the scorer cuts them from the query with
#: :func:`split_conversation`.
CONVERSATIONAL_RANKRAG_PROMPT = ("System: " + RANKRAG_SYSTEM_PROMPT + "\n\n"
                                 "Passage: {passage}\n\n"
                                 "{history}"
                                 "User: " + RANKRAG_INSTRUCTION + " " + RANKRAG_ANSWER_INSTRUCTION
                                 + "\n\n"
                                 "Assistant:")

#: A shorter prompt for small instruction-tuned models that were not trained on RankRAG data
#: (e.g. SmolLM2-135M-Instruct through its chat template): no system text, the passage labelled,
#: and "Answer True or False." in place of the paper's answer sentence. Not the paper's prompt.
SMOLLM2_RANKRAG_PROMPT = ("Passage: {passage}\n\n" + RANKRAG_INSTRUCTION
                          + " Answer True or False.")

#: Named prompts: ``"paper"`` (Appendix D.1, question answering; the default), ``"fever"``
#: (Appendix D.1, claims), ``"conversational"`` (Appendix D.1, dialogues) and ``"smollm2"`` (ours).
RANKRAG_PROMPTS = {"paper": PAPER_RANKRAG_PROMPT, "fever": FEVER_RANKRAG_PROMPT,
                   "conversational": CONVERSATIONAL_RANKRAG_PROMPT,
                   "smollm2": SMOLLM2_RANKRAG_PROMPT}

#: The default prompt: the paper's (Appendix D.1).
DEFAULT_RANKRAG_PROMPT = PAPER_RANKRAG_PROMPT

#: The two answer words whose next-token probabilities are compared (P(True) is the score).
ANSWER_WORDS = ("True", "False")

#: How the log-probability path turns ``l_True`` / ``l_False`` into a score: ``"renormalized"``
#: (default) ``sigmoid(l_True - l_False)``; ``"raw"`` ``exp(l_True)``.
P_TRUE_MODES = ("renormalized", "raw")

_TURN = re.compile(r"^(User|Assistant):[ \t]*", re.MULTILINE)


def _fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}


def conversation_query(history: Sequence[tuple[str, str]], question: str) -> str:
    """A dialogue as one query string for :data:`CONVERSATIONAL_RANKRAG_PROMPT`: the earlier
    ``(question, answer)`` turns written ``User: ...`` / ``Assistant: ...`` (the turn format of
    Appendix D.1), then ``User: <question>``, the latest question. Works through any adapter,
    whose query is a string."""
    turns = []
    for i, pair in enumerate(history):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"history[{i}] must be a (question, answer) pair, got {pair!r:.80}.")
        turns += [f"User: {pair[0]}", f"Assistant: {pair[1]}"]
    return "\n\n".join([*turns, f"User: {question}"])


def split_conversation(query: str) -> tuple[str, str]:
    """``(history, latest question)`` of a dialogue written as :func:`conversation_query` writes
    it. ``history`` is the earlier turns, each ending in a blank line (the ``{history}`` of
    :data:`CONVERSATIONAL_RANKRAG_PROMPT`); a query with no ``User:`` turn is a single question
    (``("", query)``)."""
    marks = list(_TURN.finditer(query))
    if not marks:
        return "", query.strip()
    last = marks[-1]
    if last.group(1) != "User":
        raise ValueError("a conversational RankRAG query must end with the latest question as a "
                         f"'User: ...' turn; it ends with an Assistant turn: {query[-120:]!r}. "
                         "Build it with conversation_query(history, question).")
    turns = [f"{m.group(1)}: {query[m.end():nxt.start()].strip()}"
             for m, nxt in zip(marks[:-1], marks[1:])]
    head = query[:marks[0].start()].strip()
    if head:  # text before the first turn marker: the user's first turn
        turns.insert(0, f"User: {head}")
    history = "".join(t + "\n\n" for t in turns)
    return history, query[last.end():].strip()


_TRUE = {"true", "yes", "relevant"}
_FALSE = {"false", "no", "irrelevant"}
_WORD = re.compile(r"[A-Za-z]+")


def parse_true_false(text: str) -> bool | None:
    """Read a True/False judgement from free text; ``None`` when the text has none.

    The first judgement word decides: ``true``/``yes``/``relevant`` -> ``True``;
    ``false``/``no``/``irrelevant`` and "not relevant" -> ``False``. Case, punctuation,
    markdown and surrounding chatter are ignored.
    """
    if not isinstance(text, str):
        return None
    words = [w.lower() for w in _WORD.findall(text)]
    for i, w in enumerate(words):
        if w in _TRUE:
            if w == "relevant" and i > 0 and words[i - 1] in ("not", "isn", "t"):
                return False
            return True
        if w in _FALSE:
            return False
    return None


class RankRAGScorer(Settings, Reranker):
    """RankRAG's LLM relevance judge as a reranking stage.

    Args:
        llm: A :class:`~funnel_core.llm.LLM` provider, or a hub name / folder for a local
            :class:`~funnel_core.llm.TransformersLLM`.
        prompt: ``str.format`` template with ``{question}`` and ``{passage}``, and optionally
            ``{history}`` (default: the paper's, :data:`PAPER_RANKRAG_PROMPT`;
            ``RANKRAG_PROMPTS["fever"]`` and ``["conversational"]`` are Appendix D.1's claim and
            dialogue prompts, ``["smollm2"]`` the short variant for small chat models). With
            ``{history}`` the query is a dialogue (:func:`conversation_query`), cut by
            :func:`split_conversation` into the earlier turns and the latest question.
        mode: ``"auto"`` (log-probabilities when the provider has them, else generate-and-parse),
            ``"logprobs"`` or ``"generate"``.
        max_passage_words: Passages are cut to this many words before prompting.
        max_new_tokens: Tokens generated per judgement in generate mode.
        samples: Judgements sampled per pair in generate mode (score = share of ``True``;
            1 = one greedy judgement).
        p_true: Log-probability path only: ``"renormalized"`` (default)
            ``P(True) / (P(True) + P(False))`` over the first tokens of both answer words, or
            ``"raw"`` ``P(True)`` over the whole vocabulary (see the module docstring).
        top_n: Keep at most this many units (see :class:`~funnel_core.rerank.base.Reranker`).
        score_threshold: Drop units whose P(True) is below this (scores are already
            probabilities in [0, 1]; ``normalize`` is off).
        batch_size: Prompts per forward pass.
        name: Stage name in traces and in the score history (``Unit.funnel["score_<name>"]``).
        gguf_file: GGUF file inside the folder, when ``llm`` is a name.
        device: Torch device of the local model, when ``llm`` is a name (``None``: best).
        timeout: Seconds per call of the local model, when ``llm`` is a name.
        dtype: Weights of the local model, when ``llm`` is a name: ``"auto"`` (default: bf16
            only where the hardware runs bf16 natively; see :attr:`active_dtype`),
            ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    An ``llm`` object is not serialised: :meth:`to_dict` writes ``None`` for it and
    :meth:`from_dict` asks for it again (``from_dict(data, llm=my_llm)``).

    In generate mode a reply with no judgement word scores 0.5 and is counted in
    :attr:`unparsed` (a running total, for monitoring).
    """

    name = "rankrag"
    #: Settings whose edit builds the local model again (when ``llm`` is a name).
    load_settings = frozenset({"llm", "gguf_file", "device", "timeout", "dtype"})
    model_attrs = ()
    unserialised = ("llm",)
    setting_attrs = {"llm": "_llm_spec"}  # ``self.llm`` is the provider built from it

    def __init__(self, *, llm: LLM | str, prompt: str = DEFAULT_RANKRAG_PROMPT,
                 mode: str = "auto", max_passage_words: int = 300, max_new_tokens: int = 8,
                 samples: int = 1, p_true: str = "renormalized", top_n: int | None = None,
                 score_threshold: float | None = None, batch_size: int = 8,
                 name: str | None = None, gguf_file: str | None = None,
                 device: str | None = None, timeout: float | None = None,
                 dtype: str = "auto") -> None:
        super().__init__(top_n=top_n, score_threshold=score_threshold, normalize=False,
                         batch_size=batch_size, name=name)
        if mode not in ("auto", "logprobs", "generate"):
            raise ValueError(f"mode must be 'auto', 'logprobs' or 'generate', got {mode!r}.")
        if p_true not in P_TRUE_MODES:
            raise ValueError(f"p_true must be one of {list(P_TRUE_MODES)}, got {p_true!r}.")
        self.p_true = p_true
        if isinstance(llm, dict):
            raise TypeError("RankRAG llm came back as a dict: LLM objects are not serialisable; "
                            "pass the LLM again, e.g. RankRAGScorer.from_dict(data, llm=my_llm).")
        if llm is None:
            raise TypeError("RankRAG needs llm= (an LLM object or a local causal-LM folder).")
        self._llm_spec = llm
        self.gguf_file, self.device, self.timeout, self.dtype = gguf_file, device, timeout, dtype
        self.llm = self._provider()
        if mode == "logprobs" and not self.llm.supports_logprobs:
            raise ValueError(f"mode='logprobs' needs a provider with token log-probabilities; "
                             f"{self.llm!r} exposes text only. Use mode='auto' or 'generate'.")
        self.prompt = check_prompt_template(prompt, ("question", "passage"), "RankRAG prompt",
                                            optional=("history",))
        self.mode = mode
        self.max_passage_words = check_positive_int(max_passage_words, "max_passage_words")
        self.max_new_tokens = check_positive_int(max_new_tokens, "max_new_tokens")
        self.samples = check_positive_int(samples, "samples")
        self.unparsed = 0

    def _provider(self) -> LLM:
        if not isinstance(self._llm_spec, str):
            return as_llm(self._llm_spec)
        extra = {k: v for k, v in (("gguf_file", self.gguf_file), ("device", self.device),
                                   ("timeout", self.timeout)) if v is not None}
        return as_llm(self._llm_spec, batch_size=self.batch_size, dtype=self.dtype, **extra)

    def drop_model(self) -> None:
        object.__setattr__(self, "llm", self._provider())

    @property
    def active_dtype(self) -> str | None:
        """The dtype of a local model's loaded weights (``None`` until loaded, or for a provider
        that does not say)."""
        return getattr(self.llm, "active_dtype", None)

    @property
    def uses_logprobs(self) -> bool:
        return self.mode == "logprobs" or (self.mode == "auto" and self.llm.supports_logprobs)

    def build_prompt(self, query: str, text: str) -> str:
        words = text.split()
        if len(words) > self.max_passage_words:
            text = " ".join(words[: self.max_passage_words])
        if "history" not in _fields(self.prompt):
            return self.prompt.format(question=query, passage=text)
        history, question = split_conversation(query)
        return self.prompt.format(question=question, passage=text, history=history)

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """P(True) for each passage (floats in [0, 1])."""
        prompts = [self.build_prompt(query, t) for t in texts]
        if self.uses_logprobs:
            return self.score_logprobs(prompts)
        return self.score_generate(prompts)

    def score_logprobs(self, prompts: Sequence[str]) -> list[float]:
        """One forward pass per batch: P(True) renormalised over {True, False}, or raw."""
        scores: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            rows = self.llm.next_token_logprobs(prompts[start:start + self.batch_size],
                                                list(ANSWER_WORDS))
            if self.p_true == "raw":
                scores.extend(math.exp(lt) for lt, _ in rows)
            else:
                scores.extend(sigmoid(lt - lf) for lt, lf in rows)
        return scores

    def score_generate(self, prompts: Sequence[str]) -> list[float]:
        """Generate a short reply per pair and parse it (tolerant; never raises on chatter)."""
        scores: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            replies = self.llm.generate(prompts[start:start + self.batch_size],
                                        **self._generate_params())
            scores.extend(self._votes(replies))
        return scores

    def _generate_params(self) -> dict[str, Any]:
        return dict(n=self.samples, temperature=0.0 if self.samples == 1 else 0.7, top_p=1.0,
                    top_k=0, max_new_tokens=self.max_new_tokens)

    def _votes(self, replies: list[list[str]]) -> list[float]:
        """Share of ``True`` among the parsed replies of each pair (0.5 when none parsed)."""
        scores = []
        for texts in replies:
            known = [v for v in (parse_true_false(t) for t in texts) if v is not None]
            self.unparsed += len(texts) - len(known)
            scores.append(sum(known) / len(known) if known else 0.5)
        return scores

    async def arun(self, query: str, units: list) -> list:
        if self.uses_logprobs:
            return await super().arun(query, units)
        # text providers: await the provider's own async path instead of a blocking thread
        prompts = [self.build_prompt(query, u.text) for u in units]
        scores: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            replies = await self.llm.agenerate(prompts[start:start + self.batch_size],
                                               **self._generate_params())
            scores.extend(self._votes(replies))
        return self._ranked(units, scores)

    def _ranked(self, units: list, scores: list[float]) -> list:
        order = sorted(range(len(units)), key=lambda i: -scores[i])
        out = [units[i].rescored(scores[i], self.name) for i in order]
        if self.score_threshold is not None:
            out = [u for u in out if u.score >= self.score_threshold]
        return out[: self.top_n] if self.top_n is not None else out

    def __repr__(self) -> str:
        return f"RankRAGScorer(llm={self.llm!r}, mode={self.mode!r})"
