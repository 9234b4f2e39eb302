"""The funnel's indexes on Milvus: flat BM25, FunnelRAG's clustered BM25, and dense (HNSW).

Three classes with the *same query interface and results* as the in-memory indexes:

* :class:`MilvusBM25Index` ~ :class:`funnel_core.bm25.BM25Index` (``search``/``search_many``)
* :class:`MilvusClusteredBM25Index` ~ :class:`funnel_core.funnelrag.clustered_index.ClusteredBM25Index`
* :class:`MilvusDenseIndex` ~ :class:`funnel_core.embeddings.DenseIndex`

One argument picks where the data lives: ``uri="funnel.db"`` is Milvus Lite (embedded, a local
folder, ``pip install funnel-rag[milvus]``), ``uri="http://host:19530"`` (plus ``token`` and
``db_name``) a Milvus server or cluster. The client code is the same.

How BM25 is kept identical to the bm25s backend
-----------------------------------------------
Milvus computes BM25 itself (a ``BM25`` function over a text field into a sparse inverted
index, metric ``BM25``, ``bm25_k1``/``bm25_b`` set from our config). Its analyzers differ from
ours (Milvus Lite 3.2 has no stemming or stopword filters that work), so we feed it text that is
*already tokenized by our tokenizer* (lower-casing, token pattern, stopwords, Snowball stemmer):
tokens joined by spaces, each token made safe for Milvus's ``standard`` tokenizer (``\\w+`` +
lower-casing): a token that is not plain ``[a-z0-9]+`` is written as ``qx`` + its UTF-8 hex, and
so is a token that starts with ``qx``; the mapping is one-to-one, so Milvus counts exactly our
terms and keeps its own BM25 statistics (N, df, average length), which equal bm25s's "lucene"
variant (the only one Milvus implements). The query is tokenized the same way. Milvus returns
``distance = -score`` for BM25 (smaller is better): we return ``score = -distance``.

Milvus scores carry the ``(k1 + 1)`` factor of textbook BM25 that bm25s's "lucene" variant
leaves out; we divide it out, so the scores are the same numbers.

Milvus Lite facts that matter (read from milvus-lite 3.2.2's source and measured here):
statistics are per *segment*, and rows still in the in-memory buffer are scored with statistics
of the *filtered* subset; so every build ends with a ``flush`` (one sealed segment up to
``MILVUS_LITE_MEMTABLE_MEMORY_LIMIT_BYTES``, 128 MiB by default). A Milvus server aggregates
BM25 statistics over the collection.

Filters are pushed down as Milvus boolean expressions (never padded): ``{"key": value}`` ->
``metadata["key"] == value`` (or a list-valued field containing it), ``{"key": [v1, v2]}`` ->
any of them; a ``str`` is used as a raw Milvus expression (e.g. ``'metadata["year"] >= 2015'``).
Callables and boolean masks cannot be pushed down: they raise :class:`UnsupportedFilterError`.

Builds are atomic: data goes into a fresh physical collection ``<name>__fr<hex>``; only when it is
complete does the alias ``<name>`` move to it (``alter_alias``) and the old one get dropped. A
failed build drops its half-written collection and leaves ``<name>`` as it was. Settings (format
version, tokenizer/BM25 settings, dimension, ...) are stored in the collection's properties and
checked when an index is re-opened. ``save(path)`` writes only a small manifest (URI, names,
settings; never the token, never the data); ``load(path)`` re-opens without re-indexing.
"""

from __future__ import annotations

from funnel_core.backends.milvus.backend import (
    MilvusBackend,
    as_backend,
    build_bm25,
    build_dense,
    hybrid_backends,
    is_milvus_index,
    require_backend,
)
from funnel_core.backends.milvus.bm25 import MilvusBM25Index
from funnel_core.backends.milvus.client import (
    FORMAT_VERSION,
    MilvusCollectionError,
    MilvusConnectionError,
    MilvusError,
    MilvusSettingsError,
    UnsupportedFilterError,
)
from funnel_core.backends.milvus.clustered import MilvusClusteredBM25Index
from funnel_core.backends.milvus.dense import MilvusDenseIndex
from funnel_core.backends.milvus.expressions import (
    combine_expressions,
    comparison_expression,
    filter_expression,
    milvus_tokens,
)
from funnel_core.backends.milvus.manifest import is_milvus_entry, load_index, open_index

__all__ = [
    "MilvusBM25Index",
    "MilvusClusteredBM25Index",
    "MilvusDenseIndex",
    "MilvusError",
    "MilvusConnectionError",
    "MilvusCollectionError",
    "MilvusSettingsError",
    "UnsupportedFilterError",
    "is_milvus_index",
    "build_dense",
    "build_bm25",
    "filter_expression",
    "comparison_expression",
    "combine_expressions",
    "milvus_tokens",
    "load_index",
    "open_index",
    "is_milvus_entry",
    "MilvusBackend",
    "as_backend",
    "require_backend",
    "hybrid_backends",
    "FORMAT_VERSION",
]
