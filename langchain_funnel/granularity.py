"""Mix-of-Granularity for LangChain: splitters that build the granularity structure, and the
MoG retriever.

* :class:`MultiGranularityTextSplitter` — ``n_gra`` nested levels per document; the hierarchy is
  in ``Document.metadata`` (``granularity``, ``parent_id``, ``child_ids``, ``doc_id``,
  ``position``) and ``Document.id``.
* :class:`GraphGranularitySplitter` — MoGG's 1-2 sentence nodes with their BM25 kNN neighbours
  in ``metadata["graph_neighbors"]``.
* :class:`MixOfGranularityRetriever` — the MoG selection rule over either splitter's output;
  ``k`` in the constructor or per call, router weights and chosen level in metadata.

All three import only ``langchain_core``.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterable, Optional, Sequence

from langchain_core.documents import Document
from langchain_text_splitters import TextSplitter
from pydantic import Field, PrivateAttr

from funnel_core.config import (
    GraphGranularityConfig,
    MixOfGranularityConfig,
    MultiGranularityConfig,
    adapter_base,
    config_attributes,
    config_of,
    current_stage,
)
from funnel_core.granularity.retrieval import MixOfGranularityRetrieve, mog_stage
from funnel_core.units import Unit, read_funnel_metadata
from langchain_funnel._base import UnitRetriever, documents_to_units, units_to_documents

__all__ = ["MultiGranularityTextSplitter", "GraphGranularitySplitter", "MixOfGranularityRetriever"]


def _doc_units(documents: Iterable[Document]) -> tuple[list[Unit], dict[str, Document]]:
    """Documents -> units (empty documents skipped, as LangChain's splitters return nothing for
    them) and the documents by unit id.

    A document's id is its own ``Document.id``; one without gets a fresh ``uuid4``, so chunk ids
    (``<id>/L<level>/<position>``) never collide across calls (a second batch added to a vector
    store must not overwrite the first).
    """
    if isinstance(documents, Document):
        raise TypeError("pass a list of Documents, not a single Document; wrap it in a list.")
    units, by_id = [], {}
    for i, d in enumerate(documents):
        if not isinstance(d, Document):
            raise TypeError(f"expected langchain Documents, got {type(d).__name__} at position {i}.")
        if not d.page_content.strip():
            continue
        uid = str(d.id) if d.id else uuid.uuid4().hex
        units.append(Unit(id=uid, text=d.page_content, metadata=read_funnel_metadata(d.metadata)[0],
                          level="document"))
        by_id[uid] = d
    return units, by_id


def _to_documents(units: Sequence[Unit], by_id: dict[str, Document]) -> list[Document]:
    return units_to_documents(units)


def _texts_to_documents(texts: Sequence[str], metadatas: Optional[Sequence[dict]]) -> list[Document]:
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, got a single str; wrap it in a list.")
    metadatas = list(metadatas) if metadatas is not None else [{} for _ in texts]
    if len(metadatas) != len(texts):
        raise ValueError(f"got {len(texts)} texts but {len(metadatas)} metadatas.")
    return [Document(page_content=t, metadata=dict(m)) for t, m in zip(texts, metadatas)]


@config_attributes(MultiGranularityConfig, "config")
class MultiGranularityTextSplitter(TextSplitter):
    """Split documents into ``n_gra`` nested granularity levels (MoG section 3.2).

    Args:
        levels: ``"all"`` (every level, for :class:`MixOfGranularityRetriever`) or ``"finest"``.
        config: A :class:`funnel_core.config.MultiGranularityConfig`, or its fields as keyword
            arguments: ``chunk_size`` (finest chunk size in words, 64), ``n_gra`` (levels; a
            level-``j`` chunk is two adjacent level-``j - 1`` chunks, 5) and ``sentence_aware``
            (end finest chunks at sentence ends). Each is also an attribute; an edit is
            validated and honoured at the next call.

    :meth:`split_documents` (and ``transform_documents``) return the chunks of *every* level,
    finest first; each ``Document`` has ``id``, the source document's metadata as it was, and
    flat ``funnel_...`` keys: ``funnel_granularity`` (1 = finest), ``funnel_parent_id`` (below the
    top level), ``funnel_child_ids_json`` (above level 1), ``funnel_doc_id``,
    ``funnel_doc_index``, ``funnel_position`` and ``funnel_level``, so
    ``filter_complex_metadata`` keeps the hierarchy. :meth:`split_text` returns the chunk texts
    of one text.

    A LangChain ``TextSplitter``: it works wherever one is expected, e.g.
    ``ParentDocumentRetriever(child_splitter=MultiGranularityTextSplitter(...))``. The
    ``TextSplitter`` settings (``chunk_overlap``, ``length_function``, ``add_start_index``, ...)
    do not apply: sizes are ``chunk_size`` words.
    """

    def __init__(self, *, levels: str = "all", config: Optional[MultiGranularityConfig] = None,
                 **settings: Any) -> None:
        if levels not in ("all", "finest"):
            raise ValueError(f"levels must be 'all' (the whole hierarchy, for "
                             f"MixOfGranularityRetriever) or 'finest', got {levels!r}.")
        self.config = config_of(MultiGranularityConfig, config, settings, type(self).__name__)
        self._chunker = self.config.build()  # validates every setting now, naming the value
        self.levels = levels
        TextSplitter.__init__(self, chunk_overlap=0)

    def split_text(self, text: str) -> list[str]:
        """The chunk texts of ``text``: the same chunks as :meth:`split_documents` (every level,
        finest first, or the finest only with ``levels="finest"``)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}.")
        return [d.page_content for d in self.split_documents([Document(page_content=text)])]

    def split_documents(self, documents: Iterable[Document]) -> list[Document]:
        """Every level's chunks of ``documents`` (the whole hierarchy), finest level first
        (only the finest with ``levels="finest"``); ``[]`` for no or only empty documents."""
        units, by_id = _doc_units(documents)
        if not units:
            return []
        self._chunker = current_stage(self.config, self._chunker)
        hierarchy = self._chunker.split(units)
        levels = hierarchy.levels if self.levels == "all" else hierarchy.levels[:1]
        return _to_documents([u for level in levels for u in level], by_id)

    def create_documents(self, texts: Sequence[str],
                         metadatas: Optional[Sequence[dict]] = None) -> list[Document]:
        """The hierarchy of plain texts (one metadata dict per text)."""
        return self.split_documents(_texts_to_documents(texts, metadatas))

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        return self.split_documents(documents)


@config_attributes(GraphGranularityConfig, "config")
class GraphGranularitySplitter(TextSplitter):
    """Split documents into MoGG graph nodes and link them by BM25 similarity (section 3.3).

    Args:
        config: A :class:`funnel_core.config.GraphGranularityConfig`, or its fields as keyword
            arguments: ``sentences_per_node`` (1-2 in the paper), ``n_gra`` (hop ranges the
            retriever will use), ``k_graph`` (edges per node), ``t_graph`` (minimum normalised
            BM25 similarity of an edge), ``block_size``, ``max_df``, ``bm25``. Each is also an
            attribute; an edit is validated and honoured at the next call.

    Each node ``Document`` carries ``funnel_graph_neighbors_json`` (a JSON list of ids) and
    ``funnel_graph_weights_json``; the graph spans the documents of one call (in
    ``ParentDocumentRetriever``, which splits one parent at a time, each parent is a graph of its
    own). ``last_build_seconds`` is the latest edge-building time. With no pair above
    ``t_graph`` every neighbour list is empty (a warning says so). A LangChain ``TextSplitter``
    (its character-size settings do not apply).
    """

    def __init__(self, *, config: Optional[GraphGranularityConfig] = None, **settings: Any) -> None:
        self.config = config_of(GraphGranularityConfig, config, settings, type(self).__name__)
        self._builder = self.config.build()  # validates every setting now, naming the value
        self.last_build_seconds: float | None = None
        TextSplitter.__init__(self, chunk_overlap=0)

    def split_text(self, text: str) -> list[str]:
        """The node texts of one text (its sentences, ``sentences_per_node`` at a time)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}.")
        return [d.page_content for d in self.split_documents([Document(page_content=text)])]

    def split_documents(self, documents: Iterable[Document]) -> list[Document]:
        """The linked graph nodes of ``documents``, in document order."""
        units, by_id = _doc_units(documents)
        if not units:
            return []
        self._builder = current_stage(self.config, self._builder)
        graph = self._builder.build(units)
        self.last_build_seconds = graph.build_seconds
        return _to_documents(graph.nodes, by_id)

    def create_documents(self, texts: Sequence[str],
                         metadatas: Optional[Sequence[dict]] = None) -> list[Document]:
        return self.split_documents(_texts_to_documents(texts, metadatas))

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        return self.split_documents(documents)


class MixOfGranularityRetriever(adapter_base(MixOfGranularityConfig, UnitRetriever)):  # type: ignore[misc]
    """MoG / MoGG retrieval over the output of either splitter.

    Fields:
        documents: Every ``Document`` of :class:`MultiGranularityTextSplitter` (all levels) or of
            :class:`GraphGranularitySplitter` (detected by ``metadata["graph_neighbors"]``).
        router: A trained :class:`~funnel_core.granularity.router.GranularityRouter`, or ``None``
            for uniform level weights (the finest level is returned).
        k: Documents returned (``invoke(q, k=3)`` overrides it).

    The other fields (``k_r``, ``normalize``, ``level_margin``, ``n_gra``, ``bm25``) are those
    of :class:`funnel_core.config.MixOfGranularityConfig`; an edit is honoured at the next call
    (the per-level BM25 indexes are rebuilt only when ``n_gra`` or ``bm25`` changed).

    Result metadata: ``score`` (mixed score), ``router_weights``, ``chosen_level``, ``finest_id``.
    """

    documents: list[Document] = Field(description="All chunks of a granularity splitter.")
    router: Optional[Any] = Field(default=None, description="A trained GranularityRouter.")
    k: int = Field(default=1, description="Number of documents to return.")
    _stage: Optional[MixOfGranularityRetrieve] = PrivateAttr(default=None)
    _units: list[Unit] = PrivateAttr(default_factory=list)

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        if not self.documents:
            raise ValueError("MixOfGranularityRetriever needs documents; split them with "
                             "MultiGranularityTextSplitter or GraphGranularitySplitter first.")
        self._units = documents_to_units(self.documents)
        _ = self.stage  # validates the settings and indexes the levels now

    @property
    def config(self) -> MixOfGranularityConfig:
        """The core settings of the current field values."""
        return MixOfGranularityConfig(**{n: getattr(self, n)
                                         for n in MixOfGranularityConfig.field_names()})

    @property
    def stage(self) -> MixOfGranularityRetrieve:
        """The core MoG stage for the current settings (see ``funnel_core`` ``mog_stage``)."""
        self._stage = mog_stage(self._units, self.router, self.config, top_k=self.k,
                                previous=self._stage)
        return self._stage

    def _search(self, query: str, k: int) -> list[Unit]:
        return self.stage.retrieve(query, k=k)
