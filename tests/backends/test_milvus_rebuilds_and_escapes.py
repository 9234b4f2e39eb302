"""Milvus rebuilds never mix versions, leave no orphans, and filter values mean exactly
themselves (control characters, NUL, quotes, backslashes), or are refused clearly (lone
surrogates).

References: the in-memory :class:`ClusteredBM25Index` over the old and over the new corpus (the
Milvus index returns what it returns, as tests/backends/test_milvus_indexes.py checks), and
Python equality of metadata values. Wrong implementations caught: a reader that searches the
clusters through the alias (moved by the rebuild) but fetches documents from the collection it
opened first (the issue's 121/5,616 mixed queries); a build that never removes what killed
builds left; ``json.dumps`` literals (``\\u0001``: "unknown escape sequence").
"""

from __future__ import annotations

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from funnel_core.backends.milvus import MilvusBM25Index, MilvusClusteredBM25Index, UnsupportedFilterError  # noqa: E402
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index  # noqa: E402
from funnel_core.units import Unit  # noqa: E402

KW = dict(max_tokens=12, knn_k=3, knn_threshold=0.05)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("milvus_rebuild") / "rb.db")


def _corpus(version: str) -> list[Unit]:
    topics = ["paris capital france city", "hamlet tragedy shakespeare play",
              "bm25 ranking search engine", "neural vectors dense retrieval"]
    if version == "new":  # the same ids, other texts: clusters of the new build hold other ids
        topics = topics[::-1]
    return [Unit(id=f"d{i}", text=f"{topics[i % 4]} part {i}", metadata={"v": version})
            for i in range(12)]


def _view(units):
    return [(u.id, u.funnel["cluster_id"], u.metadata.get("v")) for u in units]


QUERIES = ["capital city france", "tragedy play", "ranking search", "dense vectors"]


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
def test_a_reader_sees_the_old_or_the_new_build_never_a_mix(db, monkeypatch):
    ref = {v: ClusteredBM25Index(**KW).index(_corpus(v)) for v in ("old", "new")}
    MilvusClusteredBM25Index(db, "rb", **KW).index(_corpus("old"))
    reader = MilvusClusteredBM25Index(db, "rb", **KW).open()
    writer = MilvusClusteredBM25Index(db, "rb", **KW)
    client = writer.client
    real_drop = client.drop_collection
    # the rebuild moves the alias, but dropping the old collections fails (another reader
    # still holds them): the window in which a reader could mix the two builds stays open
    monkeypatch.setattr(client, "drop_collection", lambda name, **kw: None)
    writer.index(_corpus("new"))
    monkeypatch.setattr(client, "drop_collection", real_drop)
    for q in QUERIES:
        want_old = _view(ref["old"].search(q, k=2))
        assert _view(reader.search(q, k=2)) == want_old, q  # the version it opened, whole
        assert _view(writer.search(q, k=2)) == _view(ref["new"].search(q, k=2)), q
    reader.refresh()
    for q in QUERIES:
        assert _view(reader.search(q, k=2)) == _view(ref["new"].search(q, k=2)), q
    # the old build is orphaned now (its drop failed); the next build removes it, and only it
    physical = [n for n in client.list_collections() if n.startswith("rb__fr")]
    assert len(physical) == 4  # old and new: clusters + documents each
    client.create_collection("rb__fr0123456789ab", dimension=4)  # a user's, named like ours
    writer.index(_corpus("new"))
    left = sorted(n for n in client.list_collections() if n.startswith("rb__fr"))
    assert len(left) == 3 and "rb__fr0123456789ab" in left
    assert left == sorted(["rb__fr0123456789ab", writer._meta["_physical"], writer._meta["documents"]])


def test_a_killed_build_leaves_nothing_the_next_build_keeps(db, monkeypatch):
    ix = MilvusBM25Index(db, "killed")
    ix.index([Unit(id="a", text="alpha")])
    client = ix.client

    def die(*args, **kwargs):
        raise KeyboardInterrupt  # killed while inserting

    monkeypatch.setattr(type(ix), "_insert", die)
    monkeypatch.setattr(client, "drop_collection", lambda name, **kw: None)  # no clean-up ran
    with pytest.raises(KeyboardInterrupt):
        ix.index([Unit(id="b", text="beta")])
    monkeypatch.undo()
    assert len([n for n in client.list_collections() if n.startswith("killed__fr")]) == 2
    ix.index([Unit(id="c", text="gamma")])
    assert [n for n in client.list_collections() if n.startswith("killed__fr")] == [ix._alias_target()]
    assert [u.id for u in ix.search("gamma")] == ["c"]


VALUES = ["a\x01b", "bell\x07", "nul\x00z", "cr\rlf\n", "tab\t", "vt\x0bff\x0c", "esc\x1b[0m",
          "del\x7f", 'quote"q', "back\\slash", "\\u0001 literal", "line\u2028sep", "é中文", "%_like"]


def test_filter_values_with_control_characters_mean_exactly_themselves(db):
    units = [Unit(id=f"u{i}", text="alpha beta", metadata={"k": v, "tags": [v, "x"]})
             for i, v in enumerate(VALUES)]
    ix = MilvusBM25Index(db, "ctl").index(units)
    for i, v in enumerate(VALUES):
        assert [u.id for u in ix.search("alpha", k=50, filter={"k": v})] == [f"u{i}"], repr(v)
        assert [u.id for u in ix.search("alpha", k=50, filter={"tags": v})] == [f"u{i}"], repr(v)
    assert sorted(u.id for u in ix.search("alpha", k=50, filter={"k": VALUES[:3]})) == ["u0", "u1", "u2"]
    with pytest.raises(UnsupportedFilterError, match="lone surrogate.*Clean the value"):
        ix.search("alpha", filter={"k": "x\ud800y"})
    with pytest.raises(UnsupportedFilterError, match="lone surrogate"):
        ix.search("alpha", filter={"bad\udfffkey": "x"})


def test_a_floor_and_a_call_filter_compile_to_both_and_an_expression_cannot_escape_the_and(db):
    """On Milvus a retriever's filter AND a per-call filter is
    ``(floor) and (call)``; a blank call adds nothing; an expression whose parentheses do not
    balance (``x) or (true``) is refused, never wrapped into ``(floor) and (x) or (true)``."""
    from funnel_core.backends.milvus import filter_expression
    from funnel_core.filters import combine_filters

    floor = {"tenant": "acme"}
    floor_expr = filter_expression(floor)
    assert filter_expression(combine_filters(floor, "  ")) == floor_expr
    assert filter_expression(combine_filters(floor, 'metadata["n"] > 1')) == f'({floor_expr}) and (metadata["n"] > 1)'
    assert filter_expression(combine_filters(floor, {"tenant": "globex"})).count(" and ") == 1
    assert filter_expression(combine_filters('metadata["a"] == "x) or (true"', "")) == 'metadata["a"] == "x) or (true"'
    units = [Unit(id=f"{t}{i}", text="alpha beta", metadata={"tenant": t, "n": i})
             for t in ("acme", "globex") for i in range(3)]
    ix = MilvusBM25Index(db, "floor").index(units)
    search = lambda call: sorted(u.id for u in ix.search("alpha", k=50, filter=combine_filters(floor, call)))  # noqa: E731
    assert search('metadata["n"] >= 1') == ["acme1", "acme2"]
    assert search('metadata["tenant"] == "globex"') == []
    for escape in ['metadata["n"] >= 0) or (true', 'true) or (metadata["tenant"] == "globex"', 'metadata["tenant"] == "acme']:
        with pytest.raises(UnsupportedFilterError, match="unbalanced"):
            search(escape)
