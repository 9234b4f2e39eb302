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
