"""Tenant isolation through every retriever of both frameworks, in memory and on Milvus Lite.

Two tenants hold documents with the *same* texts (so ranking alone never separates them); every
query matches both. A tenant filter given at construction or per call must return only the
tenant's documents (or refuse with a clear error where a retriever takes no filter: the in-memory
dense index); a filter keyword spelt the other framework's way (``filters=`` vs ``filter=``),
``metadata_filter=``, ``where=``, ... must raise, never be silently dropped (which would return
every tenant's documents).

Reference: the tenant of each document is known from its id; a result set is correct iff every
returned document is the tenant's (and at least one is returned, so an empty answer cannot pass).
Wrong implementations this catches: a retriever that ignores its default filter, one that drops
the per-call filter, one that forgets the default filter after save/load, one that pushes a
filter down with the wrong field (Milvus), and any constructor/factory that swallows unknown
keywords into ``**kwargs`` (the filter typo then returns every tenant).
"""

from __future__ import annotations

import pytest

from funnel_core.backends.milvus import UnsupportedFilterError

pytestmark = pytest.mark.slow  # real MiniLM for the dense retrievers, a real Milvus Lite

TENANTS = ("acme", "globex")
TEXTS = ["quarterly revenue report for the board", "revenue forecast and quarterly budget",
         "annual report on revenue growth", "board meeting minutes about the budget",
         "customer churn report and revenue", "product roadmap and quarterly goals"]
QUERY = "quarterly revenue report"
TENANT = "acme"


def _rows():
    return [(f"{t}-{i}", text, {"tenant": t, "n": i}) for t in TENANTS for i, text in enumerate(TEXTS)]


def _tenant_of(doc_id: str) -> str:
    return doc_id.split("-")[0]


def _only_tenant(ids: list[str]) -> None:
    assert ids, "no result at all: the probe must return the tenant's documents"
    leaked = [i for i in ids if _tenant_of(i) != TENANT]
    assert not leaked, f"documents of another tenant returned: {leaked}"


def _milvus_available() -> bool:
    try:
        import milvus_lite  # noqa: F401
        import pymilvus  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS = ["memory", pytest.param("milvus", marks=pytest.mark.skipif(
    not _milvus_available(), reason="pymilvus / milvus-lite are not installed"))]


@pytest.fixture(scope="module")
def embedder(minilm_path):
    from funnel_core.embeddings import SentenceEmbedder

    return SentenceEmbedder(minilm_path)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("tenants") / "tenants.db")


_N = iter(range(10**6))


def _backend(kind: str, db: str):
    if kind == "memory":
        return None
    from funnel_core.backends.milvus import MilvusBackend

    return MilvusBackend(db, collection=f"tenant_{next(_N)}")


# -- LlamaIndex ---------------------------------------------------------------------------------
def _nodes():
    from llama_index.core.schema import TextNode

    return [TextNode(id_=i, text=t, metadata=m) for i, t, m in _rows()]


def _li_filters():
    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

    return MetadataFilters(filters=[MetadataFilter(key="tenant", value=TENANT)])


def _li_ids(nodes) -> list[str]:
    return [n.node.node_id for n in nodes]


def _li_build(kind: str, backend, embedder, **kwargs):
    from llama_index_funnel import DenseRetriever
    from llama_index_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever

    nodes = _nodes()
    if kind == "bm25":
        return BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=4, backend=backend, **kwargs)
    if kind == "clustered":
        return ClusteredBM25Retriever.from_defaults(nodes=nodes, similarity_top_k=4, backend=backend,
                                                    max_tokens=16, **kwargs)
    if kind == "dense":
        return DenseRetriever.from_defaults(nodes, embedder, backend=backend, similarity_top_k=4, **kwargs)
    raise AssertionError(kind)


LI_KINDS = ["bm25", "clustered", "dense"]


@pytest.mark.parametrize("where", BACKENDS)
@pytest.mark.parametrize("kind", LI_KINDS)
def test_llamaindex_filter_at_construction_per_call_and_after_persist(kind, where, db, embedder, tmp_path):
    backend = _backend(where, db)
    r = _li_build(kind, backend, embedder, filters=_li_filters())
    _only_tenant(_li_ids(r.retrieve(QUERY)))
    _only_tenant(_li_ids(r.search(QUERY, k=12)))
    plain = _li_build(kind, _backend(where, db), embedder)
    assert {_tenant_of(i) for i in _li_ids(plain.search(QUERY, k=12))} == set(TENANTS)
    _only_tenant(_li_ids(plain.search(QUERY, filters=_li_filters(), k=12)))
    _only_tenant(_li_ids(plain.search(QUERY, filters={"tenant": TENANT}, k=12)))
    if hasattr(r, "persist"):
        r.persist(str(tmp_path / "storage"))
        again = type(r).from_persist_dir(str(tmp_path / "storage"), backend=backend)
        _only_tenant(_li_ids(again.retrieve(QUERY)))


LI_TYPOS = ["filter", "metadata_filter", "metadata_filters", "where"]


def _li_typo_params():
    return [pytest.param(kind, how, typo, id=f"{kind}-{how}-{typo}")
            for kind in LI_KINDS for how in ("init", "factory", "search") for typo in LI_TYPOS]


@pytest.mark.parametrize(("kind", "how", "typo"), _li_typo_params())
def test_llamaindex_misspelt_filter_keyword_raises(kind, how, typo, embedder):
    r = _li_build(kind, None, embedder)
    with pytest.raises((TypeError, ValueError), match=typo):
        if how == "init":
            type(r)(r.index, _nodes(), **{typo: _li_filters()})
        elif how == "factory":
            _li_build(kind, None, embedder, **{typo: _li_filters()})
        else:
            r.search(QUERY, **{typo: _li_filters()})


@pytest.mark.parametrize("where", BACKENDS)
def test_llamaindex_hybrid_funnel_and_forward_lookup_keep_the_tenant(where, db, embedder, tiny_llama_path):
    from llama_index_funnel.best_practices import HybridRetriever
    from llama_index_funnel.fbrag import ForwardLookupRetriever
    from llama_index_funnel.funnel import FunnelRetriever

    backend = _backend(where, db)
    sparse = _li_build("bm25", backend, embedder, filters=_li_filters())
    dense = _li_build("dense", _backend(where, db), embedder, filters=_li_filters())
    hybrid = HybridRetriever(sparse, dense, similarity_top_k=4)
    _only_tenant(_li_ids(hybrid.retrieve(QUERY)))
    funnel = FunnelRetriever([sparse])
    _only_tenant(_li_ids(funnel.retrieve(QUERY)))
    fwd = ForwardLookupRetriever(tiny_llama_path, retriever=sparse, variant="B", k=3)
    _only_tenant(_li_ids(fwd.retrieve(QUERY)))


@pytest.mark.parametrize("typo", ["filters", "filter", "metadata_filter", "aplha"])
def test_llamaindex_hybrid_factory_misspellings_raise(typo, embedder):
    from llama_index_funnel.best_practices import HybridRetriever

    with pytest.raises((TypeError, ValueError), match=typo):
        HybridRetriever.from_defaults(_nodes(), embedder=embedder, candidates=4, **{typo: _li_filters()})


def test_llamaindex_mog_and_funnel_take_no_filter_keyword(embedder):
    """Retrievers without a filter must refuse one (not accept it into **settings and ignore it)."""
    from llama_index_funnel.funnel import FunnelRetriever
    from llama_index_funnel.granularity import MixOfGranularityRetriever

    with pytest.raises((TypeError, ValueError), match="filters"):
        MixOfGranularityRetriever(_nodes(), filters=_li_filters())
    with pytest.raises(TypeError, match="filters"):
        FunnelRetriever([_li_build("bm25", None, embedder)], filters=_li_filters())  # type: ignore[call-arg]


# -- LangChain ----------------------------------------------------------------------------------
def _docs():
    from langchain_core.documents import Document

    return [Document(id=i, page_content=t, metadata=m) for i, t, m in _rows()]


def _lc_ids(docs) -> list[str]:
    return [d.id for d in docs]


def _lc_build(kind: str, backend, embedder, **kwargs):
    from langchain_funnel import DenseRetriever
    from langchain_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever

    if kind == "bm25":
        return BM25Retriever.from_documents(_docs(), k=4, backend=backend, **kwargs)
    if kind == "clustered":
        return ClusteredBM25Retriever.from_documents(_docs(), k=4, backend=backend, max_tokens=16, **kwargs)
    if kind == "dense":
        return DenseRetriever.from_documents(_docs(), embedder, backend=backend, k=4, **kwargs)
    raise AssertionError(kind)


def _lc_filters():
    from langchain_core.structured_query import Comparator, Comparison

    return [{"tenant": TENANT}, Comparison(comparator=Comparator.EQ, attribute="tenant", value=TENANT)]


@pytest.mark.parametrize("where", BACKENDS)
@pytest.mark.parametrize("kind", LI_KINDS)
def test_langchain_filter_at_construction_per_call_and_after_save(kind, where, db, embedder, tmp_path):
    backend = _backend(where, db)
    plain = _lc_build(kind, backend, embedder)
    assert {_tenant_of(i) for i in _lc_ids(plain.invoke(QUERY, k=12))} == set(TENANTS)
    for flt in _lc_filters():
        if backend is None and not isinstance(flt, dict):  # structured queries: Milvus only
            with pytest.raises(UnsupportedFilterError, match="dict"):
                plain.invoke(QUERY, filter=flt)
            continue
        _only_tenant(_lc_ids(plain.invoke(QUERY, filter=flt, k=12)))
        fixed = type(plain)(index=plain.index, k=4, filter=flt)
        _only_tenant(_lc_ids(fixed.invoke(QUERY)))
    if hasattr(fixed, "save"):
        fixed.save(tmp_path / "saved")
        _only_tenant(_lc_ids(type(fixed).load(tmp_path / "saved", backend=backend).invoke(QUERY)))


LC_TYPOS = ["filters", "metadata_filter", "metadata_filters", "where"]


def _lc_typo_params():
    return [pytest.param(kind, how, typo, id=f"{kind}-{how}-{typo}")
            for kind in LI_KINDS for how in ("init", "factory", "invoke") for typo in LC_TYPOS]


@pytest.mark.parametrize(("kind", "how", "typo"), _lc_typo_params())
def test_langchain_misspelt_filter_keyword_raises(kind, how, typo, embedder):
    r = _lc_build(kind, None, embedder)
    with pytest.raises((TypeError, ValueError), match=typo):
        if how == "init":
            type(r)(index=r.index, k=4, **{typo: {"tenant": TENANT}})
        elif how == "factory":
            _lc_build(kind, None, embedder, **{typo: {"tenant": TENANT}})
        else:
            r.invoke(QUERY, **{typo: {"tenant": TENANT}})


@pytest.mark.parametrize("where", BACKENDS)
def test_langchain_hybrid_funnel_and_forward_lookup_keep_the_tenant(where, db, embedder, tiny_llama_path):
    from langchain_funnel.best_practices import HybridRetriever
    from langchain_funnel.fbrag import ForwardLookupRetriever
    from langchain_funnel.funnel import FunnelRetriever

    backend = _backend(where, db)
    sparse = _lc_build("bm25", backend, embedder).model_copy(update={"filter": {"tenant": TENANT}})
    dense = _lc_build("dense", _backend(where, db), embedder).model_copy(update={"filter": {"tenant": TENANT}})
    _only_tenant(_lc_ids(HybridRetriever(sparse=sparse, dense=dense, k=4).invoke(QUERY)))
    _only_tenant(_lc_ids(FunnelRetriever.from_stages(sparse, k=4).invoke(QUERY)))
    fwd = ForwardLookupRetriever(llm=tiny_llama_path, retriever=sparse, variant="B", k=3)
    _only_tenant(_lc_ids(fwd.invoke(QUERY)))


@pytest.mark.parametrize("typo", ["filters", "filter", "metadata_filter", "aplha"])
def test_langchain_hybrid_factory_misspellings_raise(typo, embedder):
    from langchain_funnel.best_practices import HybridRetriever

    with pytest.raises((TypeError, ValueError), match=typo):
        HybridRetriever.from_documents(_docs(), embedder=embedder, candidates=4, **{typo: {"tenant": TENANT}})


@pytest.mark.parametrize("typo", ["filter", "filters"])
def test_langchain_mog_funnel_and_forward_lookup_take_no_filter_keyword(typo, embedder, tiny_llama_path):
    from langchain_funnel.fbrag import ForwardLookupRetriever
    from langchain_funnel.funnel import FunnelRetriever
    from langchain_funnel.granularity import MixOfGranularityRetriever

    with pytest.raises((TypeError, ValueError), match=typo):
        MixOfGranularityRetriever(documents=_docs(), **{typo: {"tenant": TENANT}})
    sparse = _lc_build("bm25", None, embedder)
    with pytest.raises((TypeError, ValueError), match=typo):
        FunnelRetriever(funnel=FunnelRetriever.from_stages(sparse).funnel, **{typo: {"tenant": TENANT}})
    with pytest.raises((TypeError, ValueError), match=typo):
        ForwardLookupRetriever(llm=tiny_llama_path, retriever=sparse, **{typo: {"tenant": TENANT}})


# -- Filters narrow, never widen ---------------------------------------------
# A construction filter is a floor: a per-call filter is ANDed with it, an empty or blank one adds
# nothing, and a filter that cannot be persisted makes save/persist refuse (DESIGN.md). Each probe
# below returned every tenant (or, for blank strings in memory, raised) before the floor existed.
OTHER = "globex"
FLOOR_KINDS = [pytest.param(kind, where, id=f"{kind}-{where}", marks=() if where == "memory" else BACKENDS[1].marks)
               for kind in LI_KINDS for where in ("memory", "milvus")
               if not (kind == "dense" and where == "memory")]  # the in-memory dense index takes no filter


def _none_or_tenant(ids: list[str]) -> None:
    assert not [i for i in ids if _tenant_of(i) != TENANT], f"another tenant's documents: {ids}"


def _lc_empty_calls():
    return [None, {}, "", "   ", "\n\t"]


def _li_empty_calls():
    from llama_index.core.vector_stores.types import MetadataFilters

    return [None, {}, "", "   ", MetadataFilters(filters=[])]


def _combined_checks(search, where: str, dict_only: bool = False) -> None:
    """A per-call filter narrows the floor: another tenant's filter returns nothing; a filter
    naming both tenants keeps only the floor's; a filter on another key combines with it."""
    assert search({"tenant": OTHER}) == []
    _only_tenant(search({"tenant": [TENANT, OTHER]}))
    both = search({"n": [0, 1]})
    _only_tenant(both)
    assert {int(i.split("-")[1]) for i in both} <= {0, 1}
    if where == "milvus":
        assert search(f'metadata["tenant"] == "{OTHER}"') == []
        _only_tenant(search('metadata["tenant"] != "nobody"'))
    elif not dict_only:
        _only_tenant(search(lambda m: True))  # a per-call predicate is ANDed too
        assert search(lambda m: m["tenant"] == OTHER) == []


@pytest.mark.parametrize(("kind", "where"), FLOOR_KINDS)
def test_langchain_per_call_filter_never_widens_the_construction_filter(kind, where, db, embedder):
    r = _lc_build(kind, _backend(where, db), embedder, filter={"tenant": TENANT})
    for call in _lc_empty_calls():
        _only_tenant(_lc_ids(r.invoke(QUERY, filter=call, k=12)))
        _only_tenant(_lc_ids(r.batch([QUERY], filter=call, k=12)[0]))
    _combined_checks(lambda f: _lc_ids(r.invoke(QUERY, filter=f, k=12)), where)
    if where == "milvus":
        from langchain_core.structured_query import Comparator, Comparison, Operation, Operator

        eq = Comparison(comparator=Comparator.EQ, attribute="tenant", value=OTHER)
        assert r.invoke(QUERY, filter=eq, k=12) == []
        _only_tenant(_lc_ids(r.invoke(QUERY, filter=Operation(operator=Operator.NOT, arguments=[eq]), k=12)))


@pytest.mark.parametrize(("kind", "where"), FLOOR_KINDS)
def test_llamaindex_per_query_filters_never_widen_the_construction_filters(kind, where, db, embedder):
    from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

    for floor in (_li_filters(), {"tenant": TENANT}):
        r = _li_build(kind, _backend(where, db), embedder, filters=floor)
        for call in _li_empty_calls():
            _only_tenant(_li_ids(r.search(QUERY, filters=call, k=12)))
        _combined_checks(lambda f, r=r: _li_ids(r.search(QUERY, filters=f, k=12)), where)
        other = MetadataFilters(filters=[MetadataFilter(key="tenant", value=OTHER)])
        assert r.search(QUERY, filters=other, k=12) == []
        either = MetadataFilters(filters=[MetadataFilter(key="tenant", value=[TENANT, OTHER],
                                                         operator=FilterOperator.IN)])
        _only_tenant(_li_ids(r.search(QUERY, filters=either, k=12)))


@pytest.mark.parametrize("where", BACKENDS)
@pytest.mark.parametrize("kind", ["bm25", "clustered"])
def test_langchain_save_of_every_filter_kind_keeps_the_floor_or_refuses(kind, where, db, embedder, tmp_path):
    import numpy as np
    from langchain_core.structured_query import Comparator, Comparison

    backend = _backend(where, db)
    r = _lc_build(kind, backend, embedder, filter={"tenant": TENANT})
    saved = tmp_path / "saved"
    r.save(saved)
    kinds = [{"tenant": TENANT}]
    if where == "milvus":
        kinds += [f'metadata["tenant"] == "{TENANT}"',
                  Comparison(comparator=Comparator.EQ, attribute="tenant", value=TENANT)]
    for flt in kinds:  # persisted, and still a floor after load
        r.model_copy(update={"filter": flt}).save(saved)
        again = type(r).load(saved, backend=backend)
        for call in _lc_empty_calls():
            _only_tenant(_lc_ids(again.invoke(QUERY, filter=call, k=12)))
        assert again.invoke(QUERY, filter={"tenant": OTHER}, k=12) == []
    unsaveable = [lambda m: m["tenant"] == TENANT]
    if where == "memory" and kind == "bm25":  # a boolean mask over the indexed units
        unsaveable.append(np.array([_tenant_of(i) == TENANT for i, _, _ in _rows()]))
    for flt in unsaveable:  # refused, naming the fix; the previous save is left as it was
        with pytest.raises(ValueError, match="cannot be saved.*dict filter.*per call"):
            r.model_copy(update={"filter": flt}).save(saved)
        again = type(r).load(saved, backend=backend)
        _only_tenant(_lc_ids(again.invoke(QUERY, filter={}, k=12)))


@pytest.mark.parametrize("where", BACKENDS)
@pytest.mark.parametrize("kind", ["bm25", "clustered"])
def test_llamaindex_persist_of_every_filter_kind_keeps_the_floor_or_refuses(kind, where, db, embedder, tmp_path):
    from llama_index.core.vector_stores.types import MetadataFilters

    backend = _backend(where, db)
    r = _li_build(kind, backend, embedder, filters={"tenant": TENANT})
    storage = str(tmp_path / "storage")
    kinds = [{"tenant": TENANT}, _li_filters()]
    if where == "milvus":
        kinds.append(f'metadata["tenant"] == "{TENANT}"')
    for flt in kinds:
        r.filters = flt
        r.persist(storage)
        again = type(r).from_persist_dir(storage, backend=backend)
        for call in _li_empty_calls():
            _only_tenant(_li_ids(again.search(QUERY, filters=call, k=12)))
        _only_tenant(_li_ids(again.retrieve(QUERY)))
        assert again.search(QUERY, filters={"tenant": OTHER}, k=12) == []
    r.filters = lambda m: m["tenant"] == TENANT
    with pytest.raises(ValueError, match="cannot be saved.*dict filter.*per call"):
        r.persist(storage)
    again = type(r).from_persist_dir(storage, backend=backend)
    assert isinstance(again.filters, str if where == "milvus" else MetadataFilters)
    _only_tenant(_li_ids(again.search(QUERY, filters=MetadataFilters(filters=[]), k=12)))
