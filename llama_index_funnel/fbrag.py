"""FB-RAG forward lookup for LlamaIndex: :class:`ForwardLookupQueryTransform` (Stage II) and
:class:`ForwardLookupRetriever` (Stages I-III), each holding a :class:`~funnel_core.fbrag.ForwardLookup`
(settings: :class:`~funnel_core.fbrag_fields.ForwardLookupFields`; ``llm`` may also be a
LlamaIndex ``LLM``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, List, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from funnel_core.errors import check_query
from funnel_core.fbrag import ForwardLookup, ForwardSample
from funnel_core.fbrag_fields import ForwardLookupFields
from funnel_core.funnel import WarmUpMixin
from funnel_core.settings import StageAdapter, checked_keywords
from llama_index_funnel._base import PromptlessTransform, nodes_to_units, units_to_nodes
from llama_index_funnel.llm import stage_llm

__all__ = ["ForwardLookupQueryTransform", "ForwardLookupQueryBundle", "ForwardLookupRetriever"]


@dataclass
class ForwardLookupQueryBundle(QueryBundle):
    """A ``QueryBundle`` carrying FB-RAG's forward-lookup samples (rationales and answers)."""

    samples: List[ForwardSample] = field(default_factory=list)
    reader_context: str = ""


# a misspelt field names the accepted ones (the dataclass's generated __init__ would not)
ForwardLookupQueryBundle.__init__ = checked_keywords(ForwardLookupQueryBundle.__init__)  # type: ignore[method-assign]


class _LlamaIndexForward(WarmUpMixin, StageAdapter, BaseModel):
    """What the retriever and the query transform's settings share: the stage and the
    LlamaIndex ``LLM`` wrapped for it."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    wrap_llm: ClassVar[Callable[[Any, Any], Any]] = staticmethod(stage_llm)

    retriever: Optional[BaseRetriever] = Field(
        default=None, description="Base retriever whose nodes are the candidates (instead of context).")

    _stage: Optional[ForwardLookup] = PrivateAttr(default=None)

    @property
    def forward(self) -> ForwardLookup:
        """The ``funnel_core`` stage doing the work."""
        return self.stage


class ForwardLookupQueryTransform(ForwardLookupFields, _LlamaIndexForward, PromptlessTransform):
    """FB-RAG Stage II as a query transform: sample K ``Rationale: ... Answer: ...`` outputs.

    The light LLM reads, in this order: ``metadata["context"]`` of the ``run`` call; the nodes of
    ``retriever``; the BM25 Stage I chunks of ``context``; or nothing (closed-book: any of
    ``context`` and ``retriever``, or neither). The returned :class:`ForwardLookupQueryBundle`
    adds the samples. ``llm`` is the one argument that may be passed by position.
    """

    needs_candidates: ClassVar[bool] = False
    variant: str = Field(default="F", description="Stage II samples with the forward side (F).")
    embed_samples: bool = Field(
        default=True, description="Put [query, R_1 A_1, ..., R_K A_K] in custom_embedding_strs.")

    def __init__(self, llm: Any, **settings: Any) -> None:
        super().__init__(llm=llm, **settings)

    def _context_for(self, query: str, metadata: Dict) -> str:
        if metadata.get("context"):
            return str(metadata["context"])
        if self.retriever is not None:
            nodes = self.retriever.retrieve(query)
            return "\n\n".join(n.node.get_content(MetadataMode.NONE) for n in nodes)
        if self.units is not None:
            stage1, _ = self.forward.recall(query, self.units)
            return self.forward.reader_context(stage1)
        return "(no context given: answer from what you know)"

    def _run(self, query_bundle: QueryBundle, metadata: Dict) -> QueryBundle:
        query = check_query(query_bundle.query_str)
        if not query:
            return query_bundle
        context = self._context_for(query, metadata or {})
        samples = self.forward.sample(query, context)
        strs = list(query_bundle.custom_embedding_strs or [query])
        if self.embed_samples:
            strs += [s.lookup_text for s in samples if s.lookup_text]
        return ForwardLookupQueryBundle(query_str=query_bundle.query_str,
                                        image_path=query_bundle.image_path,
                                        custom_embedding_strs=strs, embedding=None,
                                        samples=samples, reader_context=context)


class ForwardLookupRetriever(ForwardLookupFields, _LlamaIndexForward, BaseRetriever):
    """FB-RAG Stages I-III as a LlamaIndex retriever: a :class:`~funnel_core.fbrag.ForwardLookup`.

    Candidates are the chunks of ``context``, or the nodes that ``retriever`` returns (exactly
    one of the two); ``score`` is S_FB. The samples of a :class:`ForwardLookupQueryBundle` (from
    :class:`ForwardLookupQueryTransform` in a ``TransformRetriever``) are reused. ``llm`` is the
    one argument that may be passed by position.
    """

    callback_manager: CallbackManager = Field(
        default_factory=CallbackManager, exclude=True, description="LlamaIndex callback manager.")

    _verbose: bool = PrivateAttr(default=False)

    def __init__(self, llm: Any, **fields: Any) -> None:
        if "callback_manager" in fields and fields["callback_manager"] is None:
            del fields["callback_manager"]  # None: a new one, as BaseRetriever does
        super().__init__(llm=llm, **fields)

    def model_post_init(self, __context: Any) -> None:
        # what BaseRetriever.__init__ sets besides callback_manager (it is not called)
        object.__setattr__(self, "object_map", {})
        super().model_post_init(__context)  # checks the context, builds (and validates) the stage

    @staticmethod
    def _samples(qb: QueryBundle) -> Optional[list[ForwardSample]]:
        return list(qb.samples) if isinstance(qb, ForwardLookupQueryBundle) and qb.samples else None

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        nodes: Sequence[Any] = [] if self.units is not None else self.retriever.retrieve(query)  # type: ignore[union-attr]
        res = self.forward.search(query, self.units or nodes_to_units(nodes), self._samples(query_bundle))
        return units_to_nodes(res.units, nodes)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        nodes: Sequence[Any] = [] if self.units is not None else await self.retriever.aretrieve(query)  # type: ignore[union-attr]
        res = await self.forward.asearch(query, self.units or nodes_to_units(nodes),
                                         self._samples(query_bundle))
        return units_to_nodes(res.units, nodes)
