"""funnel_core.filters: a construction filter is a floor that a per-call filter narrows, never
widens (combine_filters, AllOf in metadata_mask), and a filter that cannot be saved is refused
(persistable_filter). DESIGN.md "Filters narrow, never widen"."""

from __future__ import annotations

import numpy as np
import pytest

from funnel_core.filters import AllOf, combine_filters, is_empty_filter, metadata_mask, persistable_filter
from funnel_core.units import Unit

UNITS = [Unit(id=f"{t}-{i}", text="x", metadata={"tenant": t, "n": i, "tags": tags})
         for t in ("acme", "globex") for i, tags in enumerate((["a", "b"], ["a"], ["b"]))]
FLOOR = {"tenant": "acme"}


def _kept(flt) -> set[str]:
    mask = metadata_mask(UNITS, flt)
    return {u.id for u, keep in zip(UNITS, mask if mask is not None else [True] * len(UNITS)) if keep}


ACME = {"acme-0", "acme-1", "acme-2"}


@pytest.mark.parametrize("call", [None, {}, "", "   ", "\n\t"], ids=repr)
def test_an_empty_or_blank_call_adds_nothing(call):
    assert is_empty_filter(call)
    assert combine_filters(FLOOR, call) == FLOOR
    assert combine_filters(None, call) is None
    assert combine_filters({}, call) is None
    assert _kept(combine_filters(FLOOR, call)) == ACME


def test_an_all_true_mask_is_not_empty():
    assert not is_empty_filter(np.ones(len(UNITS), dtype=bool))


@pytest.mark.parametrize(("call", "want"), [
    ({"tenant": "globex"}, set()),                      # another tenant: nothing, not globex
    ({"tenant": ["acme", "globex"]}, ACME),             # both tenants named: the floor's only
    ({"n": [0, 1]}, {"acme-0", "acme-1"}),              # another key: both hold
    ({"tenant": "acme", "n": 2}, {"acme-2"}),
    (lambda m: m["tenant"] == "globex", set()),         # a predicate is ANDed too
    (lambda m: True, ACME),
    (np.array([u.metadata["n"] == 0 for u in UNITS]), {"acme-0"}),   # a mask too
], ids=["other-tenant", "both-tenants", "other-key", "same-and-other-key", "pred-other", "pred-all", "mask"])
def test_a_call_filter_is_anded_with_the_floor(call, want):
    assert _kept(combine_filters(FLOOR, call)) == want
    assert _kept(combine_filters(call, FLOOR)) == want  # AND is symmetric


def test_dicts_merge_when_they_agree_and_stay_exact_when_they_do_not():
    assert combine_filters(FLOOR, {"n": 1}) == {"tenant": "acme", "n": 1}
    assert combine_filters(FLOOR, {"tenant": "acme"}) == FLOOR
    both = combine_filters({"tags": "a"}, {"tags": "b"})
    assert isinstance(both, AllOf)  # not a value intersection ({"tags": []} would keep nothing)
    assert _kept(both) == {"acme-0", "globex-0"}
    assert FLOOR == {"tenant": "acme"}  # the floor is never edited in place


def test_a_mask_part_is_not_edited_in_place():
    mask = np.ones(len(UNITS), dtype=bool)
    metadata_mask(UNITS, combine_filters(mask, FLOOR))
    assert mask.all()


@pytest.mark.parametrize("flt", [None, FLOOR, {"n": [0, 1]}, {}, 'metadata["tenant"] == "acme"', ""], ids=repr)
def test_what_is_saved(flt):
    assert persistable_filter(flt, "R.save") == flt


@pytest.mark.parametrize(("flt", "what"), [
    (lambda m: True, r"predicate filter \(<lambda>\)"),
    (np.ones(3, dtype=bool), "boolean-mask filter"),
    (AllOf((FLOOR, lambda m: True)), "combined filter"),
    ({"tenant": {"acme"}}, "cannot be saved.*set"),
    ({1: "acme"}, "keys must be str"),
    ({"n": float("nan")}, "cannot be saved"),
], ids=["predicate", "mask", "allof", "set-value", "int-key", "nan"])
def test_what_is_refused_names_the_filter_and_the_fix(flt, what):
    with pytest.raises(ValueError, match=what) as err:
        persistable_filter(flt, "R.save")
    assert "R.save" in str(err.value)
    if callable(flt) or isinstance(flt, (np.ndarray, AllOf)):
        assert "dict filter" in str(err.value) and "per call" in str(err.value)


# -- the framework-free filter tree (what LlamaIndex MetadataFilters / LangChain Comparison map to)
def _reference(op: str, key: str, value, metadata: dict) -> bool:
    """A comparison written out case by case: a missing key passes only ne/nin, a comparison
    between kinds ("a" > 3) is false, contains/any/all need a list, like/ilike a string."""
    if op == "is_empty":
        return metadata.get(key) in (None, [], "", ())
    if key not in metadata:
        return op in ("ne", "nin")
    v = metadata[key]
    if op in ("gt", "gte", "lt", "lte"):
        if isinstance(v, str) != isinstance(value, str) or isinstance(v, list):
            return False
        return {"gt": v > value, "gte": v >= value, "lt": v < value, "lte": v <= value}[op]
    if op in ("contains", "any", "all"):
        if not isinstance(v, list):
            return False
        wanted = [value] if op == "contains" else value
        return (all if op == "all" else any)(w in v for w in wanted)
    if op in ("like", "ilike"):
        return isinstance(v, str) and (str(value) in v if op == "like" else str(value).lower() in v.lower())
    if op in ("in", "nin"):
        return (v in value) == (op == "in")
    return (v == value) == (op == "eq")


TREE_UNITS = [Unit(id=str(i), text="x", metadata=m) for i, m in enumerate([
    {"n": 1, "s": "Alpha", "tags": ["a", "b"]}, {"n": 5, "s": "beta"}, {"s": "gamma", "tags": []},
    {"n": "7", "tags": ["b"]}, {}, {"n": 3, "s": None}])]
COMPARISONS_CASES = [("eq", "n", 5), ("ne", "n", 5), ("gt", "n", 2), ("gte", "n", 3), ("lt", "n", 4),
                     ("lte", "s", "beta"), ("in", "n", [1, 3]), ("nin", "n", [1, 3]),
                     ("contains", "tags", "b"), ("any", "tags", ["a", "z"]), ("all", "tags", ["a", "b"]),
                     ("like", "s", "amm"), ("ilike", "s", "ALP"), ("is_empty", "tags", None)]


@pytest.mark.parametrize("op,key,value", COMPARISONS_CASES, ids=[c[0] for c in COMPARISONS_CASES])
def test_a_comparison_means_what_the_reference_says_in_memory(op, key, value):
    """Catches a comparison that fails a missing key under ne/nin (or passes it under eq), that
    raises on values of another type instead of failing them, or that swaps an operator."""
    from funnel_core.filters import Comparison, filter_predicate

    want = {u.id for u in TREE_UNITS if _reference(op, key, value, u.metadata)}
    assert {u.id for u in TREE_UNITS if filter_predicate(Comparison(key, op, value))(u.metadata)} == want
    mask = metadata_mask(TREE_UNITS, Comparison(key, op, value))
    assert {u.id for u, keep in zip(TREE_UNITS, mask) if keep} == want


def test_conditions_join_their_parts_and_an_empty_and_adds_nothing():
    """and/or/not over parts (dicts too); an empty and/not constrains nothing and an empty or
    matches nothing (what LlamaIndex's empty MetadataFilters mean). Catches a NOT applied to
    each part instead of to their OR, and an empty OR treated as no filter (it would widen)."""
    from funnel_core.filters import Comparison, Condition

    gt2, tag_b = Comparison("n", "gt", 2), Comparison("tags", "contains", "b")
    kept = lambda flt: {u.id for u, k in zip(TREE_UNITS, metadata_mask(TREE_UNITS, flt)) if k}  # noqa: E731
    assert kept(Condition("and", (gt2, tag_b))) == set()
    assert kept(Condition("or", (gt2, tag_b))) == {"0", "1", "3", "5"}
    assert kept(Condition("not", (gt2, tag_b))) == {"2", "4"}
    assert kept(Condition("and", ({"s": "beta"}, gt2))) == {"1"}
    assert kept(Condition("or", ())) == set()
    assert is_empty_filter(Condition("and", ())) and is_empty_filter(Condition("not", ()))
    assert not is_empty_filter(Condition("or", ()))
    assert combine_filters(FLOOR, Condition("and", ())) == FLOOR
    with pytest.raises(ValueError, match="'between'.*use one of"):
        Comparison("n", "between", (1, 2))
    with pytest.raises(ValueError, match="'xor'"):
        Condition("xor", (gt2,))
