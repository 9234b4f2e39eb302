"""FB-RAG forward lookup for LlamaIndex.

* :class:`ForwardLookupQueryTransform` — a ``BaseQueryTransform`` that samples K
  ``Rationale/Answer`` outputs and attaches them to the query bundle
  (:class:`ForwardLookupQueryBundle`; their texts also go to ``custom_embedding_strs`` so an
  embedding retriever behind a ``TransformRetriever`` searches with them).
* :class:`ForwardLookupRetriever` — FB-RAG Stages I-III over a long context or over the nodes
  of any base retriever; reuses the samples of a :class:`ForwardLookupQueryBundle`. Its
  settings are the fields of :class:`~funnel_core.fbrag_fields.ForwardLookupFields`, shared with
  the LangChain twin.

The LLM can be a LlamaIndex ``LLM``, a ``funnel_core`` provider, or a hub name / folder of a
local causal LM.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.llms.llm import LLM as LlamaIndexBaseLLM
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from funnel_core.errors import check_query
from funnel_core.fbrag import ForwardLookup, ForwardLookupResult, ForwardSample, chunk_context, variant_weights
from funnel_core.fbrag_fields import ForwardLookupFields
from funnel_core.funnel import warm_up_attributes
from funnel_core.settings import StageAdapter, check_kwargs, checked_keywords, setting_names
from funnel_core.units import Unit, text_digest
from llama_index_funnel._base import nodes_to_units, units_to_nodes
from llama_index_funnel.llm import stage_llm

__all__ = ["ForwardLookupQueryTransform", "ForwardLookupQueryBundle", "ForwardLookupRetriever"]


def forward_lookup(owner: str, llm: Any, *, variant: str = "FB",
                   eta_backward: Optional[float] = None, eta_forward: Optional[float] = None,
                   **settings: Any) -> ForwardLookup:
    """The :class:`~funnel_core.fbrag.ForwardLookup` of an FB-RAG ``variant`` (``"FB"``, ``"F"``
    or ``"B"``; ``eta_backward``/``eta_forward`` override its weights) reading with ``llm`` (a
    LlamaIndex LLM is wrapped); ``settings`` are the stage's other settings. Unknown ones raise,
    naming ``owner`` (the class the user called) and the accepted ones."""
    accepted = {"variant", "eta_backward", "eta_forward",
                *(n for n in setting_names(ForwardLookup) if n != "llm")}
    check_kwargs(owner, settings, accepted)
    eta_b, eta_f = variant_weights(variant, eta_backward, eta_forward)
    return ForwardLookup(llm=stage_llm(llm, settings.get("timeout")), eta_backward=eta_b,
                         eta_forward=eta_f, **settings)


class _HoldsForwardLookup:
    """Forwards the settings of the :class:`~funnel_core.fbrag.ForwardLookup` it holds
    (``self.forward``) as attributes: ``transform.samples = 3`` is validated by the stage and
    honoured at the next call (the setting lives on the stage, not on this object). ``llm``
    takes a LlamaIndex LLM too; a new ``chunk_words`` chunks ``context`` again. (The query
    transform's mixin; the retriever declares its settings as fields instead.)"""

    #: Stage settings this class does not forward (its own, or derived from its own).
    _NOT_FORWARDED: ClassVar[frozenset[str]] = frozenset({"llm"})

    def _forwarded(self, name: str) -> bool:
        return name in setting_names(ForwardLookup) and name not in self._NOT_FORWARDED

    def __getattr__(self, name: str) -> Any:
        forward = self.__dict__.get("forward")
        if name == "llm" and forward is not None:
            return self.__dict__.get("_llm", forward.llm)
        if forward is not None and self._forwarded(name):
            return getattr(forward, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        forward = self.__dict__.get("forward")
        if forward is None:
            object.__setattr__(self, name, value)
        elif name == "llm":
            forward.llm = stage_llm(value, forward.timeout)
            object.__setattr__(self, "_llm", value)
        elif self._forwarded(name):
            setattr(forward, name, value)  # validated by the stage
            if name == "timeout" and isinstance(self.__dict__.get("_llm"), LlamaIndexBaseLLM):
                forward.llm = stage_llm(self.__dict__["_llm"], value)
            if name == "chunk_words" and self.__dict__.get("_context") is not None:
                object.__setattr__(self, "units", _chunks(self.__dict__["_context"], value))
        else:
            object.__setattr__(self, name, value)


def _chunks(context: str | Sequence[str], chunk_words: int) -> list[Unit]:
    return chunk_context(context, chunk_words, id_prefix=f"chunk-{text_digest(context)}")


@dataclass
class ForwardLookupQueryBundle(QueryBundle):
    """A ``QueryBundle`` carrying FB-RAG's forward-lookup samples (rationales and answers)."""

    samples: List[ForwardSample] = field(default_factory=list)
    reader_context: str = ""


# a misspelt field names the accepted ones (the dataclass's generated __init__ would not)
ForwardLookupQueryBundle.__init__ = checked_keywords(ForwardLookupQueryBundle.__init__)  # type: ignore[method-assign]


class ForwardLookupQueryTransform(_HoldsForwardLookup, BaseQueryTransform):
    """FB-RAG Stage II as a query transform: sample K ``Rationale: ... Answer: ...`` outputs.

    The light LLM reads a context chosen, in this order, from: ``metadata["context"]`` of the
    ``run`` call; the nodes of ``retriever`` for the query; the BM25 Stage I chunks of
    ``context``; or nothing (closed-book lookup). The returned
    :class:`ForwardLookupQueryBundle` keeps ``query_str`` and adds the samples; with
    ``embed_samples`` the sample texts join the query in ``custom_embedding_strs``.

    Args:
        llm: LlamaIndex LLM, funnel_core LLM, or a local causal-LM name/folder.
        context: A long text (or list of texts) to read from.
        retriever: Any LlamaIndex retriever whose nodes the LLM reads instead.
        embed_samples: Put ``[query, R_1 A_1, ..., R_K A_K]`` in ``custom_embedding_strs``.

    The sampling and reading arguments (``samples``, ``temperature``, ``top_p``, ``top_k``,
    ``max_new_tokens``, ``prompt``, ``recall_k``, ``reader_words``, ``chunk_words``, and
    ``timeout``/``gguf_file``/``device``/``dtype`` of a local model) are settings of
    :class:`funnel_core.fbrag.ForwardLookup`, passed as ``**settings``; each is also an
    attribute, and an edit (``transform.samples = 3``) is validated and used at the next call.
    """

    #: Stage II reads with the forward side only: the weights are not this class's settings.
    _NOT_FORWARDED = frozenset({"llm", "eta_backward", "eta_forward"})

    def __init__(self, llm: Any, *, context: str | Sequence[str] | None = None,
                 retriever: Optional[BaseRetriever] = None, embed_samples: bool = True,
                 **settings: Any) -> None:
        # Stage II reads: the forward side only
        self._context = context
        self._llm = llm
        self.units = _chunks(context, settings.get("chunk_words", 300)) \
            if context is not None else None
        self.forward = forward_lookup(type(self).__name__, llm, variant="F", **settings)
        self.retriever = retriever
        self.embed_samples = embed_samples

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        return None

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


class ForwardLookupRetriever(ForwardLookupFields, StageAdapter, BaseModel, BaseRetriever):
    """FB-RAG Stages I-III as a LlamaIndex retriever (``k`` = chunks returned, 3 by default): a
    :class:`~funnel_core.fbrag.ForwardLookup`.

    Candidates are the ``chunk_words``-word chunks of ``context``, or the nodes that
    ``retriever`` returns for the query. Each node's metadata holds ``funnel_backward_score``,
    ``funnel_forward_scores_json``, ``funnel_samples_json`` and ``funnel_position``; ``score`` is
    S_FB. Given a :class:`ForwardLookupQueryBundle` (from :class:`ForwardLookupQueryTransform` in
    a ``TransformRetriever``), its samples are reused instead of sampling again.

    Constructor keywords (the model's fields):

    * ``llm``: LlamaIndex LLM, funnel_core LLM, or a local causal-LM name/folder (the one
      argument that may be passed by position);
    * ``context``: a long text or a list of texts; or ``retriever``: a base retriever;
    * ``callback_manager``: LlamaIndex callback manager;
    * ``variant``: ``"FB"`` (Ours-FB, default), ``"F"`` (Ours-F) or ``"B"`` (BM25
      only), whose weights ``eta_backward``/``eta_forward`` override; and the settings of
      :class:`funnel_core.fbrag.ForwardLookup` (``k``, ``budget_words``, ``chunk_words``,
      sampling, ``timeout``/``gguf_file``/``device`` of a local model...): the fields of
      :class:`~funnel_core.fbrag_fields.ForwardLookupFields`. An unknown one raises, naming
      the accepted ones.

    Each setting is a field, forwarded to the stage (``.forward``): an edit
    (``retriever.k = 1``, ``retriever.variant = "F"``) is validated and used at the next query.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    stage_class: ClassVar[type] = ForwardLookup

    llm: Any = Field(description="LlamaIndex LLM, funnel_core LLM, or a causal-LM name/folder.")
    retriever: Optional[BaseRetriever] = Field(
        default=None, description="Base retriever whose nodes are the candidates (instead of context).")
    callback_manager: CallbackManager = Field(
        default_factory=CallbackManager, exclude=True, description="LlamaIndex callback manager.")

    _stage: Optional[ForwardLookup] = PrivateAttr(default=None)
    _verbose: bool = PrivateAttr(default=False)

    def __init__(self, llm: Any, **fields: Any) -> None:
        if "callback_manager" in fields and fields["callback_manager"] is None:
            del fields["callback_manager"]  # None: a new one, as BaseRetriever does
        super().__init__(llm=llm, **fields)

    def model_post_init(self, __context: Any) -> None:
        # what BaseRetriever.__init__ sets besides callback_manager (it is not called)
        object.__setattr__(self, "object_map", {})
        super().model_post_init(__context)  # checks the context, builds (and validates) the stage

    def _stage_value(self, name: str, value: Any) -> Any:
        return stage_llm(value, self.timeout) if name == "llm" else super()._stage_value(name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "timeout" and isinstance(self.llm, LlamaIndexBaseLLM):
            self.stage.llm = stage_llm(self.llm, self.timeout)

    @property
    def forward(self) -> ForwardLookup:
        """The ``funnel_core`` stage doing the work."""
        return self.stage

    def warm_up(self) -> "ForwardLookupRetriever":
        """Load the models of everything this retriever holds (see ``funnel_core`` ``Stage.warm_up``),
        e.g. at server start-up; returns ``self``."""
        return warm_up_attributes(self)

    @staticmethod
    def _samples(query_bundle: QueryBundle) -> Optional[list[ForwardSample]]:
        if isinstance(query_bundle, ForwardLookupQueryBundle) and query_bundle.samples:
            return list(query_bundle.samples)
        return None

    def _finish(self, res: ForwardLookupResult, originals: Sequence[Any]) -> List[NodeWithScore]:
        return units_to_nodes(res.units, originals)

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        originals: Sequence[Any] = ()
        units = self.units
        if units is None:
            assert self.retriever is not None
            originals = self.retriever.retrieve(QueryBundle(query_str=query))
            units = nodes_to_units(originals)
        return self._finish(self.forward.search(query, units, self._samples(query_bundle)),
                            originals)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        originals: Sequence[Any] = ()
        units = self.units
        if units is None:
            assert self.retriever is not None
            originals = await self.retriever.aretrieve(QueryBundle(query_str=query))
            units = nodes_to_units(originals)
        res = await self.forward.asearch(query, units, self._samples(query_bundle))
        return self._finish(res, originals)
