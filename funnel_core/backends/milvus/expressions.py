"""Milvus boolean expressions: safe tokens for BM25 text, metadata filters, comparisons."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from funnel_core.backends.milvus.client import ESCAPE, SAFE_TOKEN, UnsupportedFilterError
from funnel_core.filters import AllOf, Comparison, Condition

if TYPE_CHECKING:  # pragma: no cover
    pass  # typing.Self from Python 3.11

import numpy as np


# -- tokens and filters ---------------------------------------------------------------------------
def safe_token(tok: str) -> str:
    if SAFE_TOKEN.match(tok) and not tok.startswith(ESCAPE):
        return tok
    return ESCAPE + tok.encode("utf-8").hex()


def milvus_tokens(tokens: Sequence[str]) -> str:
    """Our tokens as one string that Milvus's ``standard`` tokenizer splits back into exactly
    the same (one-to-one escaped) terms."""
    return " ".join(safe_token(t) for t in tokens)


def string_literal(value: str, what: str) -> str:
    """A Milvus string literal that means exactly ``value``.

    Milvus's expression parser knows only a few escapes (``\\"``, ``\\\\``, ``\\n``,
    ``\\r``, ``\\t``; ``\\uXXXX``, ``\\xXX``, ``\\a``, ``\\b``, ``\\f``, ``\\v`` are
    "unknown escape sequence", which ``json.dumps`` would produce for control characters), and
    refuses a raw newline or carriage return, while other raw control characters, NUL
    included, are taken literally (all measured on Milvus Lite). So: escape the quote, the
    backslash, newline, carriage return and tab, keep every other character raw. A lone surrogate cannot be sent at all (gRPC needs
    valid UTF-8): refused with the fix."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UnsupportedFilterError(
            f"{what} {value!r:.60} holds a lone surrogate ({exc.reason} at position {exc.start}), "
            "which Milvus (UTF-8 over gRPC) cannot receive; such text cannot have been stored in "
            "Milvus either. Clean the value (e.g. value.encode('utf-8', 'replace').decode()).") from None
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + out.replace("\r", "\\r") + '"'


#: The integers Milvus stores in a JSON field (64-bit signed); an insert of a larger one fails.
_INT64 = (-(1 << 63), (1 << 63) - 1)


def literal(value: Any, key: str) -> str:
    """``value`` (a JSON scalar: bool, int, float, str) as a Milvus literal with Python's meaning.

    Measured on Milvus Lite: numbers compare as Python compares them (``1 == 1.0 == true``,
    ``-0.0 == 0``); a negative number is a literal in a comparison and a list (``x == -1``,
    ``[-1, 2]``) but not as a function's argument (``json_contains(x, -1)`` is a syntax error:
    :func:`arg` parenthesises it); an integer outside 64 bits cannot be stored, nor written."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        if not _INT64[0] <= int(value) <= _INT64[1]:
            raise UnsupportedFilterError(
                f"filter value {int(value)} for key {key!r} is outside the 64-bit integers that "
                "Milvus stores (no stored value can equal it, and Milvus cannot parse it); use a "
                "float (e.g. float(value)) or a value within +-9223372036854775807.")
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise UnsupportedFilterError(f"filter value {value!r} for key {key!r} is not finite; "
                                         "Milvus expressions need finite numbers.")
        return repr(float(value))
    if isinstance(value, str):
        return string_literal(value, f"the filter value for key {key!r}")
    if value is None:
        raise UnsupportedFilterError(
            f"filter value None for key {key!r} cannot be compared on Milvus, which does not tell "
            f"a stored null from a missing key; filter with the dict {{{key!r}: None}} (the key is "
            "missing or null), or compare with a value.")
    raise UnsupportedFilterError(
        f"filter value {value!r:.60} ({type(value).__name__}) for key {key!r} cannot be pushed "
        "down to Milvus; use str, int, float or bool values (or a list of them), or pass a raw "
        "Milvus expression string such as 'metadata[\"year\"] >= 2015'.")


def arg(lit: str) -> str:
    """A literal as a function's argument: Milvus's parser takes ``-1`` after ``==`` and inside
    ``[...]`` but not as an argument (``json_contains(x, -1)``: "unexpected token '-'"), so a
    negative number is parenthesised there (``json_contains(x, (-1))``, measured to match)."""
    return f"({lit})" if lit.startswith("-") else lit


def json_path(field: str, key: str) -> str:
    return f"{field}[{string_literal(key, 'the metadata key')}]"


def check_grouped(expr: str) -> str:
    """``expr`` if its parentheses balance outside string literals (and its literals end), so
    that ``(floor) and (expr)`` keeps ``expr`` inside its own parentheses; else
    :class:`UnsupportedFilterError`. Such an expression is malformed on its own; wrapped, one like
    ``'x) or (true'`` would escape the AND with a retriever's filter and widen it."""
    depth, quote, escaped = 0, "", False
    for ch in expr:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                break
    if depth or quote:
        raise UnsupportedFilterError(
            f"the Milvus filter expression {expr!r:.120} has unbalanced parentheses or an "
            "unterminated string literal; it is refused rather than combined with the "
            "retriever's filter, which it could escape.")
    return expr


def filter_expression(filter: Any, field: str = "metadata") -> str | None:
    """Translate a funnel-rag metadata filter into a Milvus boolean expression.

    ``None`` -> ``None``; a ``str`` is returned as is (a raw Milvus expression); a dict of
    ``key: value`` / ``key: [values]`` becomes ANDed equality / membership tests on the JSON
    ``metadata`` field, a list-valued metadata field matching when it contains the value (the
    same semantics as :func:`funnel_core.bm25.metadata_mask`). An empty list matches nothing
    (``"false"``). ``None`` matches a missing key or a null value (``is null``), as
    ``metadata.get(key) is None`` does in memory; a null inside a list-valued field is not seen
    (Milvus has no test for it: narrower than memory, never wider). An :class:`~funnel_core.filters.AllOf` (a retriever's floor and a per-call
    filter, :func:`funnel_core.filters.combine_filters`) becomes ``(floor) and (call)``, each
    part compiled by these rules; a blank part adds nothing. A
    :class:`~funnel_core.filters.Comparison` compiles with :func:`comparison_expression` and a
    :class:`~funnel_core.filters.Condition` joins its parts with :func:`combine_expressions`
    (what the adapters turn LlamaIndex ``MetadataFilters`` and LangChain structured-query
    objects into), so one tree means the same here and in memory. Callables and boolean arrays raise
    :class:`UnsupportedFilterError`.
    """
    if filter is None:
        return None
    if isinstance(filter, AllOf):
        return combine_expressions([filter_expression(part, field) for part in filter.parts], "and")
    if isinstance(filter, Comparison):
        return comparison_expression(filter.key, filter.op, filter.value, field)
    if isinstance(filter, Condition):
        return combine_expressions([filter_expression(part, field) for part in filter.parts],
                                   filter.condition)
    if isinstance(filter, str):
        if not filter.strip():
            return None
        return check_grouped(filter)
    if isinstance(filter, np.ndarray):
        raise UnsupportedFilterError(
            "a boolean-mask filter is aligned with an in-memory index and cannot be pushed down "
            "to Milvus; pass a dict such as {'source': 'a.md'} / {'year': [2020, 2021]} or a "
            "Milvus expression string such as 'metadata[\"year\"] >= 2015'.")
    if callable(filter):
        raise UnsupportedFilterError(
            f"a callable filter ({getattr(filter, '__name__', type(filter).__name__)}) cannot be "
            "pushed down to Milvus, which filters on the server; pass a dict such as "
            "{'source': 'a.md'} / {'year': [2020, 2021]} or a Milvus expression string such as "
            "'metadata[\"year\"] >= 2015 and metadata[\"lang\"] == \"en\"'. (LlamaIndex "
            "MetadataFilters: use llama_index_funnel.milvus.to_milvus_filter.)")
    if not isinstance(filter, Mapping):
        raise TypeError(f"filter must be a dict of metadata values or a Milvus expression "
                        f"string, got {type(filter).__name__}.")
    parts = []
    for key, wanted in filter.items():
        if not isinstance(key, str):
            raise TypeError(f"filter keys must be str, got {key!r}.")
        path = json_path(field, key)
        values = list(wanted) if isinstance(wanted, (list, tuple, set, frozenset)) else [wanted]
        if not values:
            return "false"
        # None: the key is missing or null (in memory, metadata.get(key) is None); a null
        # inside a list-valued field cannot be tested on Milvus (json_contains takes no null)
        tests = [f"{path} is null"] if any(v is None for v in values) else []
        lits = [literal(v, key) for v in values if v is not None]
        if len(lits) == 1:
            tests += [f"{path} == {lits[0]}", f"json_contains({path}, {arg(lits[0])})"]
        elif lits:
            tests += [f"{path} == {lit}" for lit in lits] + [f"json_contains_any({path}, [{', '.join(lits)}])"]
        parts.append(f"({' or '.join(tests)})")
    return " and ".join(parts) if parts else None


#: Comparison operators of :func:`comparison_expression` (the frameworks' filter objects map
#: onto these: LlamaIndex ``FilterOperator``, LangChain ``structured_query.Comparator``).
COMPARISONS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "any", "all", "like")
CMP_OPS = {"eq": "==", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def _same_type(path: str, value: Any) -> str:
    """A two-valued test that the stored value at ``path`` has ``value``'s kind, so an order
    comparison between kinds is false, as in memory, and not null.

    Measured on Milvus Lite: ``x <= "z"`` on a list, a number or a dict is null, not false, and
    ``not`` keeps null: ``not (x <= "z")`` dropped the units memory keeps (memory: the comparison
    raises ``TypeError``, so it is false and its negation true). ``x like "%"`` is true for every
    string and false for every other stored value; ``x * 0 == 0`` true for numbers and bools, false
    for strings and lists. A dict value stays null under ``x * 0 == 0`` (no two-valued test tells a
    dict from a number), so ``not (x < 3)`` leaves out a dict-valued ``x`` that memory keeps:
    narrower, never wider."""
    if isinstance(value, str):
        return f'{path} like "%"'
    return f"{path} * 0 == 0"


def comparison_expression(key: str, op: str, value: Any, field: str = "metadata") -> str | None:
    """One metadata comparison as a Milvus boolean expression, with the semantics of a Python
    predicate on the metadata dict: a unit whose metadata lacks ``key`` fails ``eq``/``gt``/...
    and passes ``ne``/``nin`` (Milvus alone would make both false), values of another type fail.

    ``op`` is one of :data:`COMPARISONS`: ``in``/``nin`` take a list of values; ``contains``
    (a list-valued field holds ``value``), ``any``/``all`` (holds any / all of a list);
    ``like`` (a string field contains ``value`` as a substring). Returns ``None`` for a
    comparison every unit passes (``nin []``) and ``"false"`` for one none passes (``in []``).
    """
    if not isinstance(key, str) or not key:
        raise TypeError(f"a metadata filter key must be a non-empty str, got {key!r}.")
    path = json_path(field, key)
    guarded = f"exists {path} and "
    if op == "eq":
        return f"({guarded}{path} == {literal(value, key)})"
    if op in CMP_OPS:
        return f"({guarded}{_same_type(path, value)} and {path} {CMP_OPS[op]} {literal(value, key)})"
    if op == "ne":
        return f"not ({guarded}{path} == {literal(value, key)})"
    if op in ("in", "nin", "any", "all"):
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise TypeError(f"the {op!r} filter on {key!r} takes a list of values, got "
                            f"{type(value).__name__} {value!r:.60}.")
        lits = [literal(v, key) for v in value]
        if not lits:
            return {"in": "false", "any": "false", "nin": None, "all": None}[op]
        if op == "any":
            return f"({guarded}json_contains_any({path}, [{', '.join(lits)}]))"
        if op == "all":
            return f"({guarded}json_contains_all({path}, [{', '.join(lits)}]))"
        eqs = " or ".join(f"{path} == {lit}" for lit in lits)
        return f"({guarded}({eqs}))" if op == "in" else f"not ({guarded}({eqs}))"
    if op == "contains":
        return f"({guarded}json_contains({path}, {arg(literal(value, key))}))"
    if op == "like":
        text = str(value)
        if any(c in text for c in "%_\\"):
            raise UnsupportedFilterError(
                f"the substring filter {text!r} on {key!r} holds '%', '_' or a backslash, which "
                "Milvus LIKE patterns cannot escape; write the expression yourself (a Milvus "
                "expression string) or filter on another field.")
        return f"({guarded}{path} like {string_literal('%' + text + '%', f'the substring filter on {key!r}')})"
    raise UnsupportedFilterError(
        f"the filter operator {op!r} (key {key!r}) has no Milvus expression; use one of "
        f"{COMPARISONS}, or write the expression yourself as a Milvus expression string, e.g. "
        "'metadata[\"year\"] >= 2015'.")


def combine_expressions(parts: Sequence[str | None], condition: str = "and") -> str | None:
    """Join expressions with ``and`` / ``or`` / ``not`` (= not any); a ``None`` part is one that
    every unit passes, ``"false"`` one that none passes."""
    if condition not in ("and", "or", "not"):
        raise ValueError(f"condition must be 'and', 'or' or 'not', got {condition!r}.")
    if condition == "and":
        live: list[str] = [p for p in parts if p is not None]
        if "false" in live:
            return "false"
        return " and ".join(f"({p})" for p in live) if live else None
    if any(p is None for p in parts):  # one part always true
        return None if condition == "or" else "false"
    live = [p for p in parts if p is not None and p != "false"]
    if not live:
        return "false" if condition == "or" else None
    joined = " or ".join(f"({p})" for p in live)
    return joined if condition == "or" else f"not ({joined})"


def in_expr(field: str, values: Iterable[str]) -> str:
    return f"{field} in [{', '.join(string_literal(v, field) for v in values)}]"


def and_expr(*exprs: str | None) -> str:
    return " and ".join(f"({e})" for e in exprs if e)
