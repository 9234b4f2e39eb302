"""Text utilities: token counting, sentence splitting, sentence-aware word windows, token
patterns and CJK splitting for the tokenizers."""

from __future__ import annotations

import re
import string
from typing import Iterable, Sequence

from funnel_core.errors import check_positive_int

__all__ = [
    "count_tokens",
    "split_sentences",
    "word_windows",
    "check_token_pattern",
    "clean_text",
    "split_cjk",
    "CJK_MODES",
    "normalize_answer",
    "has_answer",
]

# A sentence ends at . ! ? (optionally followed by quotes/brackets) and whitespace, unless the
# period follows a common abbreviation or a single capital letter (initials).
_SENT_END_RE = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "st", "vs", "etc", "e.g", "i.e", "fig", "al", "no",
           "jr", "sr", "inc", "co", "ltd", "u.s", "approx", "eq", "ref", "vol"}


_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# Han (with extensions and compatibility ideographs), Hiragana, Katakana, Hangul syllables.
_CJK_CLASS = ("\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
              "\U00020000-\U0002fa1f")
_CJK_RE = re.compile(f"[{_CJK_CLASS}]+")
_HAS_CJK_RE = re.compile(f"[{_CJK_CLASS}]")
CJK_MODES = (None, "bigram", "char")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (from broken decoding) replaced by U+FFFD.

    A lone surrogate cannot be encoded as UTF-8, so tokenizers and stemmers fail on it; replaced,
    it is a non-word character and the rest of the text stays searchable.
    """
    if text.isascii():
        return text
    return _SURROGATE_RE.sub("\ufffd", text)


def split_cjk(tokens: Sequence[str], mode: str | None) -> list[str]:
    """Split the CJK runs inside ``tokens`` into overlapping bigrams or single characters.

    Chinese and Japanese are written without spaces, so a regex tokenizer sees a whole run such
    as "東京は日本の首都です" as one token and "東京" never matches it. ``mode="bigram"`` (the
    usual choice for BM25 over CJK, as in Lucene's CJKBigramFilter) emits "東京", "京は", ...;
    ``mode="char"`` emits one token per character; ``None`` leaves tokens alone. A run of a single
    character is kept as that character in both modes; non-CJK parts of a token are kept whole.
    """
    if mode is None:
        return list(tokens)
    out: list[str] = []
    for tok in tokens:
        if not _HAS_CJK_RE.search(tok):
            out.append(tok)
            continue
        pos = 0
        for m in _CJK_RE.finditer(tok):
            if m.start() > pos:
                out.append(tok[pos:m.start()])
            run = m.group()
            if mode == "char" or len(run) == 1:
                out.extend(run)
            else:
                out.extend(run[i:i + 2] for i in range(len(run) - 1))
            pos = m.end()
        if pos < len(tok):
            out.append(tok[pos:])
    return out


def check_token_pattern(pattern: object) -> str:
    """Validate a token regular expression; return it, or raise ``ValueError`` naming it.

    Token patterns run over every document and query, and a saved index's pattern comes from a
    file that may have been tampered with, so a pattern must (1) compile, (2) not match the empty
    string, and (3) be free of catastrophic backtracking. (3) is checked conservatively on the
    parsed pattern: no backreferences or lookarounds; repeats with more than 64 repetitions
    ("unbounded") only over a single character or character class, at the top level of the
    pattern (or of a top-level alternative), and followed by nothing or, for ``\\w`` runs, a
    ``\\b``; no alternation or unbounded repeat inside a repeat. The default
    ``(?u)\\b\\w\\w+\\b``, ``\\w+``, ``\\S+`` and ``[^\\W\\d_]+`` pass; ``(?:\\w+)+!`` (exponential)
    and ``\\w+!`` (quadratic) do not.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"token_pattern must be a str (a regular expression), got "
                        f"{type(pattern).__name__} {pattern!r:.60}.")
    if len(pattern) > 1000:
        raise ValueError(f"token_pattern is {len(pattern)} characters long; keep it under 1000.")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"token_pattern {pattern!r} is not a valid regular expression ({exc}); "
                         r"use e.g. the default r'(?u)\b\w\w+\b'.") from exc
    space = compiled.match(" ")
    if compiled.search("") is not None or (space is not None and space.end() == 0):
        raise ValueError(f"token_pattern {pattern!r} matches the empty string, so it would yield "
                         r"empty tokens; make every token at least one character, e.g. r'\w+'.")
    try:
        from re import _parser as sre_parse  # type: ignore[attr-defined]  # Python >= 3.11
    except ImportError:  # pragma: no cover - Python 3.10
        import sre_parse  # type: ignore[no-redef]
    reason = _backtracking_risk(sre_parse, sre_parse.parse(pattern), top=True)
    if reason:
        raise ValueError(
            f"token_pattern {pattern!r} is prone to catastrophic backtracking ({reason}): a crafted "
            r"text could take seconds to minutes to tokenize. Use a pattern with one repeat over a "
            r"character class, e.g. r'(?u)\b\w\w+\b', r'\w+', r'[\w-]+' or r'\S+'.")
    return pattern


def _backtracking_risk(sp, seq, top: bool) -> str | None:
    c = sp  # constants live on the parser module (re._constants re-exported)
    single = {c.LITERAL, c.NOT_LITERAL, c.IN, c.ANY, c.CATEGORY}
    items = list(seq)
    for i, (op, av) in enumerate(items):
        last = i == len(items) - 1
        if op in single or op == c.AT:
            continue
        if op == c.SUBPATTERN:
            body = av[-1]
            r = _backtracking_risk(sp, body, top and last)
            if r:
                return r
        elif op == c.BRANCH:
            for alt in av[1]:
                r = _backtracking_risk(sp, alt, top and last)
                if r:
                    return r
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, getattr(c, "POSSESSIVE_REPEAT", None)):
            lo, hi, body = av
            body = list(body)
            unbounded = hi is c.MAXREPEAT or hi > 64
            if _contains(sp, body, {c.BRANCH}):
                return "alternation inside a repeat"
            if _contains(sp, body, {c.MAX_REPEAT, c.MIN_REPEAT}) and (unbounded or _has_unbounded(sp, body)):
                return "nested repeats"
            if not unbounded:
                r = _backtracking_risk(sp, body, False)
                if r:
                    return r
                continue
            if not (len(body) == 1 and body[0][0] in single):
                return "an unbounded repeat over more than one character"
            if not top:
                return "an unbounded repeat inside a group followed by more pattern"
            rest = items[i + 1:]
            is_word = body[0] == (c.IN, [(c.CATEGORY, c.CATEGORY_WORD)]) or body[0] == (c.CATEGORY, c.CATEGORY_WORD)
            for rop, rav in rest:
                if rop == c.AT and rav == c.AT_BOUNDARY and is_word:
                    continue
                return "an unbounded repeat followed by more pattern that can fail"
        else:
            return f"unsupported construct {str(op).lower()} (backreferences and lookarounds are not allowed)"
    return None


def _contains(sp, seq, ops) -> bool:
    for op, av in seq:
        if op in ops:
            return True
        if op == sp.SUBPATTERN and _contains(sp, av[-1], ops):
            return True
        if op == sp.BRANCH and any(_contains(sp, alt, ops) for alt in av[1]):
            return True
        if op in (sp.MAX_REPEAT, sp.MIN_REPEAT) and _contains(sp, av[2], ops):
            return True
    return False


def _has_unbounded(sp, seq) -> bool:
    for op, av in seq:
        if op in (sp.MAX_REPEAT, sp.MIN_REPEAT):
            if av[1] is sp.MAXREPEAT or av[1] > 64 or _has_unbounded(sp, av[2]):
                return True
        elif op == sp.SUBPATTERN and _has_unbounded(sp, av[-1]):
            return True
        elif op == sp.BRANCH and any(_has_unbounded(sp, alt) for alt in av[1]):
            return True
    return False


def count_tokens(text: str) -> int:
    """Whitespace token count; a fast, model-free proxy for the paper's token budgets.

    The number of ``\\S+`` runs; ``str.split`` splits on exactly the characters ``re``'s ``\\s``
    matches (both use ``str.isspace``), without building a match object per token.
    """
    return len(text.split())


def split_sentences(text: str) -> list[str]:
    """Split text into sentences with a rule-based splitter (no model, no download).

    Paragraph breaks always end a sentence; abbreviations such as "e.g." and initials such as
    "J. Smith" do not.
    """
    sentences: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        if not para:
            continue
        start = 0
        for m in _SENT_END_RE.finditer(para):
            candidate = para[start:m.start()].rstrip()
            last = candidate.rsplit(" ", 1)[-1].rstrip(".!?\"')]").lower()
            if last in _ABBREV or (len(last) == 1 and last.isalpha()):
                continue
            if candidate:
                sentences.append(candidate)
            start = m.end()
        tail = para[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences


def word_windows(text: str, words: int = 100, overlap: int = 0,
                 sentence_aware: bool = True) -> list[str]:
    """Cut ``text`` into windows of about ``words`` words.

    With ``sentence_aware`` (default) windows end at sentence boundaries: sentences are packed
    greedily until adding the next one would pass ``words``; a single sentence longer than
    ``words`` is cut by words. ``overlap`` repeats that many trailing words of a window at the
    start of the next one.
    """
    check_positive_int(words, "words")
    if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < words:
        raise ValueError(f"overlap must be an int in [0, words={words}), got {overlap!r}.")
    if sentence_aware:
        pieces: list[list[str]] = []
        for sent in split_sentences(text):
            toks = sent.split()
            for i in range(0, len(toks), words):
                pieces.append(toks[i:i + words])
    else:
        toks = text.split()
        pieces = [toks[i:i + words] for i in range(0, len(toks), words)]

    windows: list[list[str]] = []
    current: list[str] = []
    for piece in pieces:
        if current and len(current) + len(piece) > words:
            windows.append(current)
            current = current[len(current) - overlap:] if overlap else []
        current = current + piece
    if current and (not windows or len(current) > overlap):
        windows.append(current)
    return [" ".join(w) for w in windows]


# SQuAD's answer matching (the v1.1 evaluation script's normalisation); answer recall and the
# metrics of funnel_core.evaluation.metrics build on it.

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation and articles, squeeze whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def has_answer(text: str, answers: Iterable[str]) -> bool:
    """True when any normalised answer occurs in the normalised text, on word boundaries."""
    norm = f" {normalize_answer(text)} "
    return any(f" {a} " in norm for a in (normalize_answer(x) for x in answers) if a)
