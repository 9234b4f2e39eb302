"""Mix-of-Granularity for LangChain (see ``docs/mix_of_granularity.md``): two text splitters,
which write the structure as flat ``funnel_...`` metadata, and the MoG retriever over their
output."""

from __future__ import annotations

import asyncio
import uuid
from abc import abstractmethod
from typing import Any, Iterable, Optional, Sequence

from langchain_core.documents import Document
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_text_splitters import TextSplitter
from pydantic import Field, PrivateAttr, field_validator

from funnel_core.granularity.fields import (
    GraphGranularityFields,
    MixOfGranularityFields,
    MultiGranularityFields,
)
from funnel_core.granularity.retrieval import (
    MixOfGranularityRetrieve,
    check_mog_settings,
    mog_rebuilt,
    mog_stage,
)
from funnel_core.units import Unit, keep_source_funnel_keys, read_funnel_metadata
from langchain_funnel._base import StageModel, UnitRetriever, checked_documents, documents_to_units, units_to_documents

__all__ = ["MultiGranularityTextSplitter", "GraphGranularitySplitter", "MixOfGranularityRetriever"]


def _doc_units(documents: Iterable[Document]) -> tuple[list[Unit], dict[str, Document]]:
    """Documents -> units (empty ones skipped, as LangChain's splitters do) and the documents by
    unit id; a document without ``id`` gets a fresh ``uuid4``, so chunk ids never collide across
    calls (a second batch added to a vector store must not overwrite the first)."""
    units, by_id = [], {}
    for d in checked_documents(documents):
        if not d.page_content.strip():
            continue
        uid = str(d.id) if d.id else uuid.uuid4().hex
        units.append(Unit(id=uid, text=d.page_content, metadata=read_funnel_metadata(d.metadata)[0],
                          level="document"))
        by_id[uid] = d
    return units, by_id


def _texts_to_documents(texts: Sequence[str], metadatas: Optional[Sequence[dict]]) -> list[Document]:
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, got a single str; wrap it in a list.")
    metadatas = list(metadatas) if metadatas is not None else [{} for _ in texts]
    if len(metadatas) != len(texts):
        raise ValueError(f"got {len(texts)} texts but {len(metadatas)} metadatas.")
    return [Document(page_content=t, metadata=dict(m)) for t, m in zip(texts, metadatas)]


class _GranularitySplitter(StageModel, TextSplitter, Runnable[Sequence[Document], list[Document]]):
    """A LangChain text splitter holding one core splitter
    (:class:`funnel_core.settings.StageAdapter`), also a ``Runnable`` (``loader | splitter``).
    The ``TextSplitter`` settings (``chunk_overlap``, ...) do not apply: sizes are in words."""

    def split_text(self, text: str) -> list[str]:
        """The chunk texts of ``text``: the same chunks as :meth:`split_documents`."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}.")
        return [d.page_content for d in self.split_documents([Document(page_content=text)])]

    def split_documents(self, documents: Iterable[Document]) -> list[Document]:
        """The pieces of ``documents`` (``[]`` for none or only empty ones), each with its
        source's other ``funnel_`` keys (:func:`funnel_core.units.keep_source_funnel_keys`)."""
        units, by_id = _doc_units(documents)
        if not units:
            return []
        pieces = self._split(units)
        docs = units_to_documents(pieces)
        sources = ((by_id[u.funnel["doc_id"]].metadata, d.metadata)
                   for u, d in zip(pieces, docs) if u.funnel.get("doc_id") in by_id)
        keep_source_funnel_keys(type(self).__name__, sources)
        return docs

    @abstractmethod
    def _split(self, units: list[Unit]) -> Sequence[Unit]:
        """The core splitter's pieces of the document units."""

    def create_documents(self, texts: Sequence[str],
                         metadatas: Optional[Sequence[dict]] = None) -> list[Document]:
        """The chunks of plain texts (one metadata dict per text)."""
        return self.split_documents(_texts_to_documents(texts, metadatas))

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> list[Document]:
        return self.split_documents(documents)

    async def atransform_documents(self, documents: Sequence[Document],
                                   **kwargs: Any) -> list[Document]:
        return await asyncio.to_thread(self.split_documents, documents)

    def invoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        return self._call_with_config(self.split_documents, input, config)

    async def ainvoke(self, input: Sequence[Document], config: RunnableConfig | None = None,
                      **kwargs: Any) -> list[Document]:
        return await self._acall_with_config(self.atransform_documents, input, config)


class MultiGranularityTextSplitter(MultiGranularityFields, _GranularitySplitter):
    """Split documents into ``n_gra`` nested granularity levels (MoG section 3.2): a
    :class:`~funnel_core.granularity.levels.MultiGranularityChunker` (settings:
    :class:`~funnel_core.granularity.fields.MultiGranularityFields`).

    Chunks come finest level first; each has an ``id``, its source's metadata and flat
    ``funnel_...`` keys (``funnel_granularity``, ``funnel_parent_id``,
    ``funnel_child_ids_json``, ...), so ``filter_complex_metadata`` keeps the hierarchy.
    """

    levels: str = Field(default="all", description="'all' (every level, for "
                                                    "MixOfGranularityRetriever) or 'finest'.")

    @field_validator("levels")
    @classmethod
    def _check_levels(cls, value: str) -> str:
        if value not in ("all", "finest"):
            raise ValueError(f"levels must be 'all' (the whole hierarchy, for "
                             f"MixOfGranularityRetriever) or 'finest', got {value!r}.")
        return value

    def _split(self, units: list[Unit]) -> list[Unit]:
        """Every level's chunks, finest first (the finest only with ``levels="finest"``)."""
        hierarchy = self.stage.split(units)
        levels = hierarchy.levels if self.levels == "all" else hierarchy.levels[:1]
        return [u for level in levels for u in level]


class GraphGranularitySplitter(GraphGranularityFields, _GranularitySplitter):
    """Split documents into MoGG graph nodes linked by BM25 similarity (section 3.3): a
    :class:`~funnel_core.granularity.graph.GraphGranularityBuilder` (settings:
    :class:`~funnel_core.granularity.fields.GraphGranularityFields`).

    Each node carries ``funnel_graph_neighbors_json`` and ``funnel_graph_weights_json``; the
    graph spans the documents of one call (in ``ParentDocumentRetriever``: one parent).
    """

    last_build_seconds: Optional[float] = Field(default=None,
                                                description="Seconds of the last build.")

    def _split(self, units: list[Unit]) -> Sequence[Unit]:
        """The linked graph nodes, in document order."""
        graph = self.stage.build(units)
        self.last_build_seconds = graph.build_seconds
        return graph.nodes


class MixOfGranularityRetriever(MixOfGranularityFields, UnitRetriever):
    """MoG / MoGG retrieval over every chunk of either splitter (``documents``): a
    :class:`~funnel_core.granularity.retrieval.MixOfGranularityRetrieve` (settings:
    :class:`~funnel_core.granularity.fields.MixOfGranularityFields`)."""

    documents: list[Document] = Field(description="All chunks of a granularity splitter.")
    k: int = Field(default=1, description="Number of documents to return.")
    _stage: Optional[MixOfGranularityRetrieve] = PrivateAttr(default=None)
    _units: list[Unit] = PrivateAttr(default_factory=list)

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        if not self.documents:
            raise ValueError("MixOfGranularityRetriever needs documents; split them with "
                             "MultiGranularityTextSplitter or GraphGranularitySplitter first.")
        self._units = documents_to_units(self.documents)
        check_mog_settings(self.k_r, self.normalize, self.level_margin)
        self._stage = mog_stage(self._units, self.router, n_gra=self.n_gra, bm25=self.bm25,
                                top_k=self.k, k_r=self.k_r, normalize=self.normalize,
                                level_margin=self.level_margin)  # indexes the levels now

    def __setattr__(self, name: str, value: Any) -> None:
        stage = (getattr(self, "__pydantic_private__", None) or {}).get("_stage")
        if stage is not None and (name == "k" or name in self.forwarded):
            setattr(stage, "top_k" if name == "k" else name, value)  # validated by the stage first
        super().__setattr__(name, value)
        if stage is not None and name == "n_gra":
            self._stage = mog_rebuilt(stage, self._units, self.n_gra)

    @property
    def stage(self) -> MixOfGranularityRetrieve:
        """The core MoG stage this retriever runs."""
        assert self._stage is not None
        return self._stage

    def _search(self, query: str, k: int) -> list[Unit]:
        return self.stage.retrieve(query, k=k)
