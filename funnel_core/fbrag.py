"""FB-RAG: forward and backward lookup for retrieval over a long context (Chawla et al., 2025).

The long context is cut into chunks (300 words by default). Then:

* **Stage I** (recall): BM25 with the question keeps the ``recall_k`` best chunks.
* **Stage II** (forward lookup): a light LLM reads those chunks (in their original order) and
  samples ``K`` outputs (K = 5, top-p 0.9, top-k 50), each a ``Rationale: ... Answer: ...``.
  Every chunk ``C_i`` of the full context is then scored

  ``S_FB(C_i) = eta_B * S(C_i; Q) + eta_F * max_k S(C_i; [R_k, A_k])``

  with BM25 as ``S``: the backward part looks at the question, the forward part at what the
  answer seems to be. Presets: ``Ours-F`` (eta_B = 0, eta_F = 1) and ``Ours-FB`` (0.5 / 0.5).
* **Stage III**: the best chunks under a budget (by default the ``k = 3`` best chunks, about
  900 words; or a word / token budget) go to the final generator, in their original order
  (order-preserving RAG) by default.

Each returned unit carries why it won, in its bookkeeping (:attr:`Unit.funnel`):
``funnel["backward_score"]`` (S_B), ``funnel["forward_scores"]`` (one S per sample),
``funnel["samples"]`` (the K rationales and answers), ``funnel["position"]`` (chunk index in the
context), and ``score`` = S_FB.

The default Stage II prompt (:data:`FORWARD_PROMPT`) and :data:`ANSWER_PROMPT` are rewrites of
the paper's prompts, not verbatim copies (the paper's own per-dataset prompts, Tables 4-6, are
not shipped). :data:`PAPER_FORWARD_PROMPTS` (EN.QA, EN.MC, QMSum) keep some of their parts (a
rationale of "2-3 sentences" starting with "Rationale:", then the answer; QMSum asks for the
answer without a rationale) around wording of ours, and end with the question where the paper's
end with "Rationale:". :data:`FORWARD_PROMPT_QUOTE` (a rationale that quotes
the context) is this package's variant, kept as an option.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from funnel_core.bm25 import BM25Index
from funnel_core.errors import check_positive_int, check_query
from funnel_core.funnel import Stage
from funnel_core.llm import LLM, as_llm, check_prompt_template
from funnel_core.settings import Settings
from funnel_core.text import count_tokens, word_windows
from funnel_core.units import Unit

__all__ = ["ForwardLookup", "ForwardSample", "ForwardLookupResult", "chunk_context",
           "parse_rationale_answer", "FORWARD_PROMPT", "FORWARD_PROMPT_MULTIPLE_CHOICE",
           "FORWARD_PROMPT_QUOTE", "FORWARD_PROMPT_MULTIPLE_CHOICE_QUOTE", "FORWARD_PROMPTS",
           "PAPER_FORWARD_PROMPTS", "ANSWER_PROMPT", "PRESETS", "DEFAULT_K", "variant_weights"]

#: Stage II prompt for free-form questions (FB-RAG Table 4, rewritten): the model reasons
#: briefly, then answers. The default (``FORWARD_PROMPTS["paper"]``).
FORWARD_PROMPT = (
    "You are given a long context and a question. Read the context and answer the question.\n"
    "First explain your reasoning briefly, in one or two sentences. Then give the answer in a "
    "few words.\n\n"
    "Context:\n{context}\n\n"
    "Question: {question}\n\n"
    "Use exactly this format:\n"
    "Rationale: <brief reasoning>\n"
    "Answer: <the answer>"
)

#: Stage II prompt for multiple-choice questions (rewritten from FB-RAG's EN.MC prompt, Table 6);
#: the options are part of ``{question}``.
FORWARD_PROMPT_MULTIPLE_CHOICE = (
    "You are given a long context and a multiple-choice question. Read the context and pick the "
    "correct option.\n"
    "First explain your reasoning briefly, in one or two sentences. Then give the letter and "
    "text of the option.\n\n"
    "Context:\n{context}\n\n"
    "Question and options: {question}\n\n"
    "Use exactly this format:\n"
    "Rationale: <brief reasoning>\n"
    "Answer: <letter and option>"
)

#: A variant that is not the paper's: the rationale quotes (or closely paraphrases) the
#: supporting sentences of the context, so the forward lookup has the context's own words to
#: match with BM25. This package's earlier default (used by ``benchmarks/bench_fbrag.py``
#: before the paper's prompt became the default).
FORWARD_PROMPT_QUOTE = (
    "You are given a long context and a question. Read the context and answer the question.\n"
    "First give a short rationale: the sentences of the context that support your answer, "
    "quoted or closely paraphrased. Then give the answer in a few words.\n\n"
    "Context:\n{context}\n\n"
    "Question: {question}\n\n"
    "Use exactly this format:\n"
    "Rationale: <the supporting text from the context>\n"
    "Answer: <the answer>"
)

#: The quoting variant for multiple-choice questions.
FORWARD_PROMPT_MULTIPLE_CHOICE_QUOTE = (
    "You are given a long context and a multiple-choice question. Read the context and pick the "
    "correct option.\n"
    "First give a short rationale: the sentences of the context that decide between the "
    "options, quoted or closely paraphrased. Then give the letter and text of the option.\n\n"
    "Context:\n{context}\n\n"
    "Question and options: {question}\n\n"
    "Use exactly this format:\n"
    "Rationale: <the deciding text from the context>\n"
    "Answer: <letter and option>"
)

#: Per-dataset Stage II prompts after FB-RAG's (Tables 4-6), not verbatim: the rationale of "2-3
#: sentences" starting with "Rationale:" followed by the answer, and QMSum's answer without a
#: rationale, are the paper's; the surrounding wording is ours, and they end with the question
#: where the paper's prompts end with "Rationale:". ``{question}`` holds the options for EN.MC and the query for QMSum.
PAPER_FORWARD_PROMPTS = {
    "en_qa": (
        "You are given a long context and a question. Read the context and answer the question.\n"
        "First write a rationale of 2-3 sentences, starting with 'Rationale:'. Then write the "
        "answer, starting with 'Answer:'.\n\n"
        "Context:\n{context}\n\n"
        "Question: {question}"
    ),
    "en_mc": (
        "You are given a long context and a multiple-choice question. Read the context and pick "
        "the correct option.\n"
        "First write a rationale of 2-3 sentences, starting with 'Rationale:'. Then write the "
        "correct option, starting with 'Answer:'.\n\n"
        "Context:\n{context}\n\n"
        "Question and options: {question}"
    ),
    "qmsum": (
        "You are given a long meeting transcript and a query. Read the transcript and answer the "
        "query.\n"
        "Write the answer, starting with 'Answer:'.\n\n"
        "Transcript:\n{context}\n\n"
        "Query: {question}"
    ),
}

#: Named Stage II prompts: ``"paper"`` (this package's rewrite asking for brief reasoning, the
#: default), ``"quote"`` (quoting rationale), their multiple-choice forms, and the per-dataset
#: reconstructions ``"paper_en_qa"``, ``"paper_en_mc"``, ``"paper_qmsum"``.
FORWARD_PROMPTS = {
    "paper": FORWARD_PROMPT,
    "quote": FORWARD_PROMPT_QUOTE,
    "paper_multiple_choice": FORWARD_PROMPT_MULTIPLE_CHOICE,
    "quote_multiple_choice": FORWARD_PROMPT_MULTIPLE_CHOICE_QUOTE,
    **{f"paper_{name}": text for name, text in PAPER_FORWARD_PROMPTS.items()},
}

#: Chunks Stage III keeps by default: 3 chunks of 300 words (about 900 words), the LlamaIndex
#: and LangChain adapters' default too.
DEFAULT_K = 3

#: Stage III prompt for the final generator over the selected chunks (rewritten; not the paper's
#: wording).
ANSWER_PROMPT = (
    "Answer the question using the context below. The context is a set of excerpts from a long "
    "document, in their original order. Answer in as few words as possible.\n\n"
    "Context:\n{context}\n\n"
    "Question: {question}\n"
    "Answer:"
)

#: eta_B / eta_F of the paper's two variants.
PRESETS = {"F": (0.0, 1.0), "FB": (0.5, 0.5), "B": (1.0, 0.0)}


def variant_weights(variant: str = "FB", eta_backward: float | None = None,
                    eta_forward: float | None = None) -> tuple[float, float]:
    """``(eta_backward, eta_forward)`` of an FB-RAG variant (``"FB"``, ``"F"`` or ``"B"``), each
    overridden by the argument of its name when that is not ``None``."""
    if variant not in PRESETS:
        raise ValueError(f"unknown FB-RAG variant {variant!r}; choose one of {sorted(PRESETS)}.")
    eta_b, eta_f = PRESETS[variant]
    return (eta_b if eta_backward is None else eta_backward,
            eta_f if eta_forward is None else eta_forward)

_RATIONALE = re.compile(r"rationale\s*[:\-]\s*", re.IGNORECASE)
_ANSWER = re.compile(r"(?:final\s+)?answer\s*[:\-]\s*", re.IGNORECASE)


@dataclass
class ForwardSample:
    """One Stage II output: the rationale ``R_k`` and answer ``A_k`` parsed from ``text``."""

    text: str
    rationale: str
    answer: str

    @property
    def lookup_text(self) -> str:
        """``[R_k, A_k]``: what the chunks are scored against."""
        return f"{self.rationale} {self.answer}".strip()

    def to_dict(self) -> dict[str, str]:
        return {"rationale": self.rationale, "answer": self.answer, "text": self.text}


def parse_rationale_answer(text: str) -> ForwardSample:
    """Split a ``Rationale: ... Answer: ...`` output; tolerant of missing or reordered parts.

    Without an ``Answer:`` marker the whole text counts as the rationale (it still carries the
    forward signal); without a ``Rationale:`` marker, the text before ``Answer:`` does.
    """
    text = text if isinstance(text, str) else str(text)
    answers = list(_ANSWER.finditer(text))
    if answers:
        last = answers[-1]
        head, answer = text[: last.start()], text[last.end():]
    else:
        head, answer = text, ""
    m = _RATIONALE.search(head)
    rationale = head[m.end():] if m else head
    return ForwardSample(text=text, rationale=" ".join(rationale.split()),
                         answer=" ".join(answer.split()))


def chunk_context(context: str | Sequence[str], chunk_words: int = 300,
                  sentence_aware: bool = True, id_prefix: str = "chunk") -> list[Unit]:
    """Cut a long context into ~``chunk_words``-word units (``funnel["position"]`` = index).

    ``context`` may be one string or a list of documents (each chunked separately, positions
    running on). Raises ``ValueError`` for an empty context.
    """
    check_positive_int(chunk_words, "chunk_words")
    docs = [context] if isinstance(context, str) else list(context)
    for d in docs:
        if not isinstance(d, str):
            raise TypeError(f"context must be a str or a list of str, got an item of type "
                            f"{type(d).__name__}.")
    units: list[Unit] = []
    for d in docs:
        for text in word_windows(d, chunk_words, 0, sentence_aware):
            pos = len(units)
            units.append(Unit(id=f"{id_prefix}-{pos}", text=text, funnel={"position": pos}))
    if not units:
        raise ValueError("the context is empty (no words); pass the long document text to "
                         "retrieve from.")
    return units


@dataclass
class ForwardLookupResult:
    """Selected chunks (best by S_FB, or in original order), plus everything that led there."""

    units: list[Unit]
    samples: list[ForwardSample]
    stage1: list[Unit]
    scored: list[Unit]
    seconds: dict[str, float] = field(default_factory=dict)


class ForwardLookup(Settings, Stage):
    """FB-RAG Stages I-III as one stage: ``(question, chunks) -> selected chunks``.

    Args:
        llm: The light LLM of Stage II (a provider, or a hub name / folder for
            :class:`~funnel_core.llm.TransformersLLM`).
        eta_backward: Weight of S(C; Q); see :meth:`preset` for Ours-F and Ours-FB.
        eta_forward: Weight of max_k S(C; [R_k, A_k]).
        samples: K, outputs sampled in Stage II (>= 1).
        temperature: Stage II sampling temperature (ours; the paper gives none).
        top_p: Nucleus sampling threshold (paper: 0.9).
        top_k: Top-k sampling cut (paper: 50).
        max_new_tokens: Tokens generated per sample.
        prompt: Stage II template with ``{context}`` and ``{question}`` (default: the paper's
            brief-reasoning prompt; ``FORWARD_PROMPTS["quote"]`` asks for quoted support).
        recall_k: Chunks kept by Stage I (BM25 with the question) for the LLM to read.
        reader_words: Cap on the words the LLM reads (Stage I chunks are added best first until
            the cap, then put back in original order); ``None`` reads all ``recall_k`` chunks.
        k: Keep at most this many chunks in Stage III (default 3, :data:`DEFAULT_K`; ``None``
            lets ``budget_words`` / ``budget_tokens`` alone decide, or keeps every chunk when
            there is no budget either).
        budget_words: Word budget of Stage III (must hold at least one chunk).
        budget_tokens: Token budget of Stage III, counted by ``token_counter``.
        token_counter: ``f(text) -> int``; default whitespace tokens. Pass a tokenizer's length
            function to budget in model tokens.
        order_preserving: Return the selected chunks in their original order (default) instead
            of best first.
        normalize: Divide each BM25 score vector by its maximum (max-normalisation) before
            mixing, so that the question (short) and the rationales (long) weigh as eta says.
            Not in the paper's formula; turn off for raw BM25 sums.
        chunk_words: Chunk size used by :meth:`search_context` (paper: 300 words).
        bm25: Keyword arguments for :class:`~funnel_core.bm25.BM25Index`.
        gguf_file: GGUF file inside the model repository, when ``llm`` is a name of a
            quantised model (see :class:`~funnel_core.llm.TransformersLLM`, as for the next three).
        device: Device of the local model when ``llm`` is a name.
        timeout: Seconds one generation may take when ``llm`` is a name.
        dtype: Compute dtype of the local model when ``llm`` is a name.

    ``llm`` and ``token_counter`` objects are not serialised: :meth:`to_dict` writes ``None``
    for them and :meth:`from_dict` takes them again (``from_dict(data, llm=my_llm)``).
    """

    name = "fb_rag"
    load_settings = frozenset({"llm", "gguf_file", "device", "timeout", "dtype"})
    model_attrs = ()
    unserialised = ("llm", "token_counter")
    setting_attrs = {"llm": "_llm_spec", "token_counter": "_token_counter"}

    def __init__(self, *, llm: LLM | str, eta_backward: float = 0.5, eta_forward: float = 0.5,
                 samples: int = 5, temperature: float = 1.0, top_p: float = 0.9, top_k: int = 50,
                 max_new_tokens: int = 128, prompt: str | None = FORWARD_PROMPT, recall_k: int = 20,
                 reader_words: int | None = None, k: int | None = DEFAULT_K,
                 budget_words: int | None = None, budget_tokens: int | None = None,
                 token_counter: Callable[[str], int] | None = None,
                 order_preserving: bool = True, normalize: bool = True, chunk_words: int = 300,
                 bm25: dict[str, Any] | None = None, name: str | None = None,
                 gguf_file: str | None = None, device: str | None = None,
                 timeout: float | None = None, dtype: str = "auto") -> None:
        for value, what in ((eta_backward, "eta_backward"), (eta_forward, "eta_forward")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{what} must be a number >= 0, got {value!r}.")
        if eta_backward == 0 and eta_forward == 0:
            raise ValueError("eta_backward and eta_forward are both 0: every chunk would score 0; "
                             "use preset('F') (0, 1) or preset('FB') (0.5, 0.5).")
        if llm is None or isinstance(llm, dict):
            raise TypeError("ForwardLookup needs llm= (an LLM object or a local causal-LM "
                            "folder); a saved stage asks for it again: "
                            "ForwardLookup.from_dict(data, llm=my_llm).")
        self._llm_spec = llm
        self.gguf_file, self.device, self.timeout, self.dtype = gguf_file, device, timeout, dtype
        self.llm = self._provider()
        self.eta_backward, self.eta_forward = float(eta_backward), float(eta_forward)
        self.samples = check_positive_int(samples, "samples (K, outputs sampled per question)")
        LLM._check_params(self.samples, temperature, top_p, top_k, max_new_tokens)
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.max_new_tokens = max_new_tokens
        self.prompt = check_prompt_template(FORWARD_PROMPT if prompt is None else prompt,
                                            ("context", "question"), "FB-RAG prompt")
        self.recall_k = check_positive_int(recall_k, "recall_k")
        self.reader_words = check_positive_int(reader_words, "reader_words", allow_none=True)
        self.k = check_positive_int(k, "k", allow_none=True)
        self.chunk_words = check_positive_int(chunk_words, "chunk_words")
        self.budget_words = check_positive_int(budget_words, "budget_words", allow_none=True)
        self.budget_tokens = check_positive_int(budget_tokens, "budget_tokens", allow_none=True)
        if self.budget_words is not None and self.budget_words < self.chunk_words:
            raise ValueError(
                f"budget_words={self.budget_words} is smaller than one chunk "
                f"(chunk_words={self.chunk_words}): nothing could be selected. Raise the budget "
                f"to at least {self.chunk_words} or lower chunk_words.")
        if token_counter is not None and not callable(token_counter):
            raise TypeError("token_counter must be a callable text -> int.")
        self._token_counter = token_counter
        self.token_counter = token_counter or count_tokens
        self.order_preserving = order_preserving
        self.normalize = normalize
        self.bm25 = dict(bm25 or {})
        if name:
            self.name = name

    def _provider(self) -> LLM:
        if not isinstance(self._llm_spec, str):
            return as_llm(self._llm_spec)
        extra = {k: v for k, v in (("gguf_file", self.gguf_file), ("device", self.device),
                                   ("timeout", self.timeout)) if v is not None}
        return as_llm(self._llm_spec, dtype=self.dtype, **extra)

    def drop_model(self) -> None:
        object.__setattr__(self, "llm", self._provider())

    @classmethod
    def preset(cls, variant: str, **kwargs: Any) -> "ForwardLookup":
        """``"F"`` (Ours-F: forward only), ``"FB"`` (Ours-FB) or ``"B"`` (backward-only BM25)."""
        if variant not in PRESETS:
            raise ValueError(f"unknown FB-RAG preset {variant!r}; choose one of {sorted(PRESETS)}.")
        eta_b, eta_f = PRESETS[variant]
        kwargs.setdefault("name", f"fb_rag[{variant}]")
        return cls(eta_backward=eta_b, eta_forward=eta_f, **kwargs)

    # -- Stage I ---------------------------------------------------------------------------
    def _index(self, units: list[Unit]) -> BM25Index:
        return BM25Index(**self.bm25).index(units)

    @staticmethod
    def _scores(index: BM25Index, text: str) -> list[float]:
        if not text.strip():
            return [0.0] * len(index)
        return [float(s) for s in index.get_scores(text)]

    def _scale(self, scores: list[float]) -> list[float]:
        if not self.normalize:
            return scores
        top = max(scores, default=0.0)
        return [s / top for s in scores] if top > 0 else [0.0] * len(scores)

    def recall(self, query: str, units: list[Unit], index: BM25Index | None = None,
               ) -> tuple[list[Unit], list[float]]:
        """Stage I: the ``recall_k`` best chunks for the question (best first) and all scores."""
        index = index or self._index(units)
        backward = self._scores(index, query)
        order = sorted(range(len(units)), key=lambda i: -backward[i])[: self.recall_k]
        out = []
        for i in order:
            unit = units[i].rescored(backward[i], "fb_rag_stage1")
            unit.funnel["fb_rag_order"] = i
            out.append(unit)
        return out, backward

    def reader_context(self, stage1: Sequence[Unit]) -> str:
        """The text the light LLM reads: Stage I chunks (capped by ``reader_words``) in order."""
        chosen: list[Unit] = []
        words = 0
        for u in stage1:
            n = len(u.text.split())
            if self.reader_words is not None and chosen and words + n > self.reader_words:
                continue
            chosen.append(u)
            words += n
        chosen.sort(key=_order)
        text = "\n\n".join(u.text for u in chosen)
        if self.reader_words is not None:  # a first chunk longer than the cap is cut
            text = " ".join(text.split(" ")[: self.reader_words]) if words > self.reader_words else text
        return text

    # -- Stage II --------------------------------------------------------------------------
    def sample(self, query: str, context: str) -> list[ForwardSample]:
        """Sample K ``Rationale/Answer`` outputs of the light LLM for (context, question)."""
        prompt = self.prompt.format(context=context, question=query)
        texts = self.llm.generate([prompt], n=self.samples, temperature=self.temperature,
                                  top_p=self.top_p, top_k=self.top_k,
                                  max_new_tokens=self.max_new_tokens)[0]
        return [parse_rationale_answer(t) for t in texts]

    async def asample(self, query: str, context: str) -> list[ForwardSample]:
        """Async twin of :meth:`sample`."""
        prompt = self.prompt.format(context=context, question=query)
        texts = (await self.llm.agenerate([prompt], n=self.samples, temperature=self.temperature,
                                          top_p=self.top_p, top_k=self.top_k,
                                          max_new_tokens=self.max_new_tokens))[0]
        return [parse_rationale_answer(t) for t in texts]

    def score(self, query: str, units: Sequence[Unit], samples: Sequence[ForwardSample],
              index: BM25Index | None = None, backward: list[float] | None = None) -> list[Unit]:
        """S_FB for every unit (returned in input order, rescored, with the evidence in metadata)."""
        units = list(units)
        index = index or self._index(units)
        raw_b = backward if backward is not None else self._scores(index, query)
        b = self._scale(raw_b)
        forward_rows = [self._scale(self._scores(index, s.lookup_text)) for s in samples]
        sample_dicts = [s.to_dict() for s in samples]
        out = []
        for i, unit in enumerate(units):
            per_sample = [row[i] for row in forward_rows]
            f = max(per_sample, default=0.0)
            s_fb = self.eta_backward * b[i] + self.eta_forward * f
            new = unit.rescored(s_fb, self.name)
            new.funnel["backward_score"] = b[i]
            new.funnel["forward_scores"] = per_sample
            new.funnel["samples"] = sample_dicts
            new.funnel.setdefault("position", i)
            new.funnel["fb_rag_order"] = i
            out.append(new)
        return out

    # -- Stage III -------------------------------------------------------------------------
    def select(self, scored: Sequence[Unit], k: int | None = None) -> list[Unit]:
        """Best chunks under ``k`` / ``budget_words`` / ``budget_tokens``; original order if
        ``order_preserving``. ``k`` overrides the constructor's. Raises ``ValueError`` when a
        budget cannot hold any chunk."""
        k = self.k if k is None else check_positive_int(k, "k")
        ranked = sorted(scored, key=lambda u: (-(u.score or 0.0), _order(u)))
        chosen: list[Unit] = []
        words = tokens = 0
        for u in ranked:
            if k is not None and len(chosen) >= k:
                break
            w = len(u.text.split())
            t = self.token_counter(u.text) if self.budget_tokens is not None else 0
            if self.budget_words is not None and words + w > self.budget_words:
                continue
            if self.budget_tokens is not None and tokens + t > self.budget_tokens:
                continue
            chosen.append(u)
            words, tokens = words + w, tokens + t
        if ranked and not chosen:
            smallest = min(ranked, key=lambda u: self.token_counter(u.text))
            raise ValueError(
                f"budget_tokens={self.budget_tokens} is smaller than every chunk (the smallest "
                f"has {self.token_counter(smallest.text)} tokens); raise the budget or lower "
                "chunk_words.")
        if self.order_preserving:
            chosen.sort(key=_order)
        for u in chosen:
            u.funnel.pop("fb_rag_order", None)
        return chosen

    # -- all stages ------------------------------------------------------------------------
    def search(self, query: str, units: Sequence[Unit],
               samples: Sequence[ForwardSample] | None = None,
               k: int | None = None) -> ForwardLookupResult:
        """Run Stages I-III over ``units`` (the chunks of a long context, in original order).

        ``samples`` skips Stage II (for example samples a query transform already drew);
        ``k`` overrides the constructor's chunk count for this call.
        """
        query = check_query(query)
        units = list(units)
        if not query or not units:
            return ForwardLookupResult([], [], [], [])
        stage1, index, backward, seconds = self._stage1(query, units)
        t = time.perf_counter()
        if samples is None:
            samples = self.sample(query, self.reader_context(stage1)) if self.eta_forward > 0 else []
        seconds["stage2_sampling"] = time.perf_counter() - t
        return self._finish(query, units, list(samples), stage1, index, backward, k, seconds)

    async def asearch(self, query: str, units: Sequence[Unit],
                      samples: Sequence[ForwardSample] | None = None,
                      k: int | None = None) -> ForwardLookupResult:
        """Async twin of :meth:`search`: Stage II awaits the provider's async path."""
        query = check_query(query)
        units = list(units)
        if not query or not units:
            return ForwardLookupResult([], [], [], [])
        stage1, index, backward, seconds = self._stage1(query, units)
        t = time.perf_counter()
        if samples is None:
            samples = (await self.asample(query, self.reader_context(stage1))
                       if self.eta_forward > 0 else [])
        seconds["stage2_sampling"] = time.perf_counter() - t
        return self._finish(query, units, list(samples), stage1, index, backward, k, seconds)

    def _stage1(self, query: str, units: list[Unit]
                ) -> tuple[list[Unit], BM25Index, list[float], dict[str, float]]:
        """Stage I of :meth:`search` and :meth:`asearch`: index the chunks, recall with BM25."""
        t = time.perf_counter()
        index = self._index(units)
        stage1, backward = self.recall(query, units, index)
        return stage1, index, backward, {"stage1": time.perf_counter() - t}

    def _finish(self, query: str, units: list[Unit], samples: list[ForwardSample],
                stage1: list[Unit], index: BM25Index, backward: list[float], k: int | None,
                seconds: dict[str, float]) -> ForwardLookupResult:
        t = time.perf_counter()
        scored = self.score(query, units, samples, index, backward)
        selected = self.select(scored, k)
        seconds["stage2_scoring_and_selection"] = time.perf_counter() - t
        return ForwardLookupResult(selected, samples, stage1, scored, seconds)

    def search_context(self, query: str, context: str | Sequence[str],
                       samples: Sequence[ForwardSample] | None = None) -> ForwardLookupResult:
        """Chunk ``context`` (``chunk_words`` per chunk) and run :meth:`search`."""
        t = time.perf_counter()
        units = chunk_context(context, self.chunk_words)
        chunk_s = time.perf_counter() - t
        res = self.search(query, units, samples)
        res.seconds["chunking"] = chunk_s
        return res

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.search(query, units).units

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return (await self.asearch(query, units)).units

    def __repr__(self) -> str:
        return (f"ForwardLookup(llm={self.llm!r}, eta_backward={self.eta_backward}, "
                f"eta_forward={self.eta_forward}, samples={self.samples})")


def _order(unit: Unit) -> int:
    """Index of the unit in the input (the context's original order)."""
    return int(unit.funnel.get("fb_rag_order", 0))
