"""Every JSON scalar a filter may hold means on Milvus what it means in memory.

Reference: the in-memory index with the same filter (a dict: :func:`funnel_core.filters.
metadata_mask`; LlamaIndex ``MetadataFilters``: :func:`llama_index_funnel.filters.to_predicate`,
whose semantics LangChain's ``Comparison`` shares on Milvus). Values: negative ints and floats,
``0`` and ``-0.0``, 64-bit extremes, bools, strings with quotes, backslashes and non-ASCII
letters, a string that reads like a number, the empty string, ``None``.

Wrong implementations caught: a negative number written bare as a function's argument
(``json_contains(x, -1)``: Milvus's parser refuses it, a raw ``MilvusException`` and an ERROR
traceback in the log, while memory answers); ``None`` with no Milvus form (a dict ``{"k": None}``
refused or matching nothing instead of "missing or null"); an integer beyond 64 bits sent to the
server instead of refused with the fix; an error logged by pymilvus for any value here.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from funnel_core.backends.milvus import MilvusBM25Index, UnsupportedFilterError  # noqa: E402
from funnel_core.bm25 import BM25Index  # noqa: E402
from funnel_core.units import Unit  # noqa: E402

VALUES = [-1, -3.5, 0, -0.0, 1, 1.0, 1.5e-7, -1e300, 2 ** 40, -(2 ** 40), 2 ** 63 - 1, -(2 ** 63),
          True, False, 'q"x', "b\\s", "é中文", "-1", ""]
OTHER = -7  # a second value for the list forms (itself negative)


def _units() -> list[Unit]:
    units = [Unit(id=f"u{i}", text="alpha beta", metadata={"num": v, "tags": [v, "x"]})
             for i, v in enumerate(VALUES)]
    units += [Unit(id="null", text="alpha beta", metadata={"num": None, "tags": ["x"]}),
              Unit(id="missing", text="alpha beta", metadata={}),
              Unit(id="seven", text="alpha beta", metadata={"num": OTHER, "tags": [OTHER, 2]})]
    return units


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    units = _units()
    db = str(tmp_path_factory.mktemp("milvus_values") / "v.db")
    return BM25Index().index(units), MilvusBM25Index(db, "values").index(units)


def _ids(index, flt) -> list[str]:
    return sorted(u.id for u in index.search("alpha", k=100, filter=flt))


@pytest.fixture
def no_milvus_errors(caplog):
    caplog.set_level(logging.ERROR)
    yield
    logged = [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.ERROR]
    assert logged == []  # pymilvus logs an ERROR traceback for every expression it refuses


@pytest.mark.parametrize("value", VALUES + [None], ids=repr)
def test_dict_filters_match_memory_for_every_scalar(pair, value, no_milvus_errors):
    memory, milvus = pair
    for flt in ({"num": value}, {"tags": value}, {"num": [value, OTHER]}, {"tags": [value, OTHER]},
                {"num": value, "tags": "x"}):
        want = _ids(memory, flt)
        if value is None and "tags" in flt:
            # a null inside a list-valued field cannot be tested on Milvus: narrower, never wider
            assert set(_ids(milvus, flt)) <= set(want), flt
            continue
        assert _ids(milvus, flt) == want, flt
    if value is not None:
        assert _ids(milvus, {"num": value})  # the value is there: a non-empty comparison


def test_none_means_missing_or_null_in_both(pair):
    memory, milvus = pair
    assert _ids(memory, {"num": None}) == _ids(milvus, {"num": None}) == ["missing", "null"]


def test_an_integer_beyond_64_bits_is_refused_with_the_fix(pair, no_milvus_errors):
    _, milvus = pair
    for flt in ({"num": 2 ** 64}, {"num": [1, -(2 ** 63) - 1]}):
        with pytest.raises(UnsupportedFilterError, match=r"outside the 64-bit integers.*float"):
            _ids(milvus, flt)


LLAMA_OPS = ["==", "!=", ">", ">=", "<", "<=", "in", "nin", "contains", "any", "all", "text_match"]
LISTED = {"in", "nin", "any", "all"}


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_llamaindex_and_langchain_comparisons_match_memory(pair, value, no_milvus_errors):
    from langchain_core.structured_query import Comparator, Comparison
    from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters
    from pydantic import ValidationError

    import langchain_funnel.milvus as lc
    import llama_index_funnel.milvus as li
    from llama_index_funnel.filters import to_predicate

    memory, milvus = pair
    lc_ops = {"==": Comparator.EQ, "!=": Comparator.NE, ">": Comparator.GT, ">=": Comparator.GTE,
              "<": Comparator.LT, "<=": Comparator.LTE, "in": Comparator.IN, "nin": Comparator.NIN,
              "contains": Comparator.CONTAIN, "text_match": Comparator.LIKE}
    checked = 0
    for op in LLAMA_OPS:
        if op == "text_match" and not isinstance(value, str) or \
                op == "text_match" and any(c in str(value) for c in "%_\\"):
            continue  # LIKE patterns: strings without Milvus wildcards (refused otherwise)
        wanted = [value, OTHER] if op in LISTED else value
        for key in ("num", "tags"):
            try:
                mf = MetadataFilter(key=key, value=wanted, operator=FilterOperator(op))
            except ValidationError:  # LlamaIndex's strict types refuse a bool or a mixed list;
                # the predicate and the translation read only the fields: build it unvalidated
                mf = MetadataFilter.model_construct(key=key, value=wanted, operator=FilterOperator(op))
            filters = MetadataFilters(filters=[mf])
            want = _ids(memory, to_predicate(filters))
            assert _ids(milvus, li.to_milvus_filter(filters)) == want, (op, key, wanted)
            if op in lc_ops:
                cmp = Comparison(comparator=lc_ops[op], attribute=key, value=wanted)
                assert _ids(milvus, lc.to_milvus_filter(cmp)) == want, ("langchain", op, key, wanted)
            checked += 1
    assert checked >= 8


def test_retrievers_of_both_frameworks_filter_negative_numbers_on_milvus(tmp_path, no_milvus_errors):
    from langchain_core.documents import Document
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

    from funnel_core.backends.milvus import MilvusBackend
    from langchain_funnel.retrievers import BM25Retriever as LCBM25
    from llama_index_funnel.retrievers import BM25Retriever as LIBM25

    rows = [(f"d{i}", f"alpha beta {i}", {"num": n, "tags": [n, 0]}) for i, n in enumerate([-1, -3.5, 2, -1])]
    db = str(tmp_path / "r.db")
    nodes = [TextNode(id_=i, text=t, metadata=m) for i, t, m in rows]
    docs = [Document(id=i, page_content=t, metadata=m) for i, t, m in rows]
    li_mem = LIBM25.from_defaults(nodes=nodes, similarity_top_k=10)
    li_mil = LIBM25.from_defaults(nodes=nodes, similarity_top_k=10, backend=MilvusBackend(db, collection="li"))
    for op, value in (("contains", -1), ("==", -3.5), ("<", -2), ("in", [-1, -3.5]), ("any", [-3.5])):
        filters = MetadataFilters(filters=[MetadataFilter(key="tags" if op in ("contains", "any") else "num",
                                                          value=value, operator=FilterOperator(op))])
        want = sorted(n.node.node_id for n in li_mem.search("alpha", filters=filters))
        assert want and sorted(n.node.node_id for n in li_mil.search("alpha", filters=filters)) == want, op
    lc_mem = LCBM25.from_documents(docs, k=10)
    lc_mil = LCBM25.from_documents(docs, k=10, backend=MilvusBackend(db, collection="lc"))
    for flt in ({"num": -1}, {"tags": -3.5}, {"num": [-3.5, 2]}):
        want = sorted(d.id for d in lc_mem.invoke("alpha", filter=flt))
        assert want and sorted(d.id for d in lc_mil.invoke("alpha", filter=flt)) == want, flt


MIXED = {"list": ["a", 5], "string": "m", "number": 5, "bool": True, "float": 2.5, "null": None}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """One key holding a value of every kind (and a unit without it)."""
    units = [Unit(id=name, text="alpha beta", metadata={"k": v}) for name, v in MIXED.items()]
    units.append(Unit(id="missing", text="alpha beta", metadata={}))
    db = str(tmp_path_factory.mktemp("milvus_mixed") / "m.db")
    return BM25Index().index(units), MilvusBM25Index(db, "mixed").index(units)


@pytest.mark.parametrize("op", [">", ">=", "<", "<=", "==", "!=", "text_match"])
@pytest.mark.parametrize("value", ["z", "", 3, -1.5, True], ids=repr)
def test_a_negated_comparison_between_kinds_keeps_what_memory_keeps(mixed, op, value, no_milvus_errors):
    """Milvus's comparison of two kinds (a list or a number against "z") is null, and ``not``
    keeps null: ``NOT (tags <= "z")`` returned nothing where memory returns every unit whose value
    is not a string at most "z". Each comparison and its negation, in both frameworks, against
    LlamaIndex's predicate in memory."""
    from langchain_core.structured_query import Comparator, Comparison, Operation, Operator
    from llama_index.core.vector_stores.types import FilterCondition, FilterOperator, MetadataFilter, MetadataFilters

    import langchain_funnel.milvus as lc
    import llama_index_funnel.milvus as li
    from llama_index_funnel.filters import to_predicate

    if op == "text_match" and not isinstance(value, str):
        return
    memory, milvus = mixed
    one = MetadataFilter.model_construct(key="k", value=value, operator=FilterOperator(op))
    lc_op = {">": Comparator.GT, ">=": Comparator.GTE, "<": Comparator.LT, "<=": Comparator.LTE,
             "==": Comparator.EQ, "!=": Comparator.NE, "text_match": Comparator.LIKE}[op]
    for negated in (False, True):
        filters = MetadataFilters(filters=[one], condition=FilterCondition.NOT if negated else None)
        want = _ids(memory, to_predicate(filters))
        assert _ids(milvus, li.to_milvus_filter(filters)) == want, (op, value, negated)
        cmp = Comparison(comparator=lc_op, attribute="k", value=value)
        lc_filter = Operation(operator=Operator.NOT, arguments=[cmp]) if negated else cmp
        assert _ids(milvus, lc.to_milvus_filter(lc_filter)) == want, ("langchain", op, value, negated)
