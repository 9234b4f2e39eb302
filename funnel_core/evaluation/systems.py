"""What the harness can evaluate: any retrieval pipeline, ours or a framework's own.

:class:`System` wraps one of

* a ``funnel_core`` :class:`~funnel_core.funnel.Stage` (a :class:`~funnel_core.funnel.Funnel`, a
  retriever stage such as ``BM25Retrieve``), called as ``stage(query)``;
* a LlamaIndex retriever (anything from ``llama_index`` with ``retrieve``), optionally followed by
  node postprocessors (``postprocess_nodes(nodes, query_str=...)``);
* a LangChain retriever or runnable returning documents (``invoke(query)``), optionally followed
  by document compressors (``compress_documents(documents, query)``);
* a plain callable ``fn(query) -> list`` of units, nodes, documents or strings.

Frameworks are recognised by the modules of the object's classes (duck typing): nothing here
imports LlamaIndex or LangChain. Results become :class:`~funnel_core.units.Unit` s with the
framework object kept in ``Unit.source``.

Cost: our stages and adapters count their model work themselves (:mod:`funnel_core.counters`).
A framework's own reranker (a LlamaIndex node postprocessor or LangChain document compressor
with a ``top_n`` setting, e.g. ``SentenceTransformerRerank``, ``CrossEncoderReranker``) is
counted here: one model call and one (query, text) pair per candidate it receives. Every other
framework object or plain function does work nobody counts; :attr:`System.uncounted` names them
and the report says so instead of showing their cost as 0.
"""

from __future__ import annotations

from typing import Any, Sequence

from funnel_core import counters
from funnel_core.funnel import Stage, warm_up_objects
from funnel_core.units import Unit, text_digest

__all__ = ["System", "as_system", "to_unit", "framework_of", "document_id_candidates",
           "counted_reranker"]


def framework_of(obj: Any) -> str | None:
    """``"llama_index"`` / ``"langchain"`` when a class in ``obj``'s MRO comes from that
    framework (or from our adapter package for it), else ``None``."""
    for cls in type(obj).__mro__:
        root = (cls.__module__ or "").split(".")[0]
        if root in ("llama_index", "llama_index_funnel"):
            return "llama_index"
        if root in ("langchain", "langchain_core", "langchain_funnel", "langchain_community",
                    "langchain_classic"):
            return "langchain"
    return None


_OURS = ("funnel_core", "llama_index_funnel", "langchain_funnel")


def _ours(obj: Any) -> bool:
    """Is ``obj`` one of our stages or adapters (which count their own model work)?"""
    return (type(obj).__module__ or "").split(".")[0] in _OURS


def counted_reranker(obj: Any) -> bool:
    """A framework's own reranker the harness counts from outside: a LlamaIndex postprocessor or
    LangChain compressor, not ours, with a ``top_n`` setting (it scores every candidate it
    receives: ``SentenceTransformerRerank``, ``LLMRerank``, ``CrossEncoderReranker``,
    ``CohereRerank``, ``FlashrankRerank``, ...)."""
    return (framework_of(obj) is not None and not _ours(obj) and hasattr(obj, "top_n")
            and (hasattr(obj, "postprocess_nodes") or hasattr(obj, "compress_documents")))


def _describe(obj: Any) -> str:
    return getattr(obj, "__name__", None) or type(obj).__name__


def to_unit(item: Any, rank: int = 0) -> Unit:
    """One retrieved item as a :class:`Unit`: a ``Unit``, a LlamaIndex ``NodeWithScore`` or
    node, a LangChain ``Document``, or a string."""
    if isinstance(item, Unit):
        return item
    score = None
    node = item
    if hasattr(item, "node") and hasattr(item, "score"):  # NodeWithScore
        node, score = item.node, item.score
    if hasattr(node, "get_content") and hasattr(node, "node_id"):  # a LlamaIndex node
        meta = dict(getattr(node, "metadata", None) or {})
        return Unit(id=str(node.node_id), text=str(node.get_content()), score=score, metadata=meta,
                    parent_id=getattr(node, "ref_doc_id", None), source=item)
    if hasattr(item, "page_content"):  # a LangChain Document
        meta = dict(getattr(item, "metadata", None) or {})
        did = getattr(item, "id", None) or meta.get("id") or text_digest(item.page_content)
        if score is None and isinstance(meta.get("relevance_score"), (int, float)):
            score = meta["relevance_score"]
        return Unit(id=str(did), text=str(item.page_content), score=score, metadata=meta,
                    parent_id=meta.get("source"), source=item)
    if isinstance(item, str):
        return Unit(id=text_digest(item), text=item)
    raise TypeError(f"a system returned a {type(item).__name__} at rank {rank + 1}; expected funnel_core "
                    "Units, LlamaIndex NodeWithScore/nodes, LangChain Documents or strings.")


def _related_id(node: Any, name: str) -> str | None:
    """The node id of a LlamaIndex node's ``PARENT`` / ``SOURCE`` relationship (by the enum's
    name, so nothing is imported), or ``None``."""
    rels = getattr(node, "relationships", None)
    if not isinstance(rels, dict):
        return None
    for key, info in rels.items():
        if getattr(key, "name", None) == name and getattr(info, "node_id", None) is not None:
            return str(info.node_id)
    return None


def document_id_candidates(unit: Unit) -> list[str]:
    """The ids a result may be judged under, most specific first: ``metadata["doc_id"]``, the
    unit's own id (a node's ``node_id``, a ``Document``'s ``id``), the unit it was cut from
    (``funnel_parent_id``, which our stages write, and :attr:`Unit.parent_id`), then the
    framework's own links: a LlamaIndex node's ``PARENT`` and ``SOURCE`` relationships (its
    ``ref_doc_id``), a LangChain ``Document``'s ``id``. The harness judges a result under the
    first of these that the dataset knows (see :func:`~funnel_core.evaluation.harness.evaluate`)."""
    out: list[str] = []

    def add(value: Any) -> None:
        if value is not None and str(value) and str(value) not in out:
            out.append(str(value))

    add(unit.metadata.get("doc_id"))
    add(unit.id)
    add(unit.metadata.get("funnel_parent_id"))
    add(unit.parent_id)
    src = unit.source
    node = getattr(src, "node", src)
    if hasattr(node, "get_content") and hasattr(node, "node_id"):
        add(_related_id(node, "PARENT"))
        add(_related_id(node, "SOURCE"))
    elif hasattr(src, "page_content"):
        add(getattr(src, "id", None))
    return out


class System:
    """One named retrieval pipeline under evaluation.

    Args:
        obj: A ``funnel_core`` stage or funnel, a LlamaIndex retriever, a LangChain retriever or
            runnable, or a callable ``fn(query) -> list``.
        postprocessors: Applied in order after ``obj``: LlamaIndex node postprocessors, LangChain
            document compressors, or ``funnel_core`` stages (``stage(query, units)``).
        name: Shown in reports (``evaluate`` sets it from the mapping's key).
    """

    def __init__(self, obj: Any, postprocessors: Sequence[Any] = (), *, name: str | None = None) -> None:
        if isinstance(obj, System):
            postprocessors = [*obj.postprocessors, *postprocessors]
            obj = obj.obj
        self.obj: Any = obj
        self.postprocessors: list[Any] = list(postprocessors)
        self.name = name or type(obj).__name__
        self.kind = "funnel_core" if isinstance(obj, Stage) else framework_of(obj) or "callable"
        if self.kind == "llama_index" and not callable(getattr(obj, "retrieve", None)):
            raise TypeError(f"system {self.name!r}: a LlamaIndex object needs retrieve(query) (a retriever); "
                            f"got {type(obj).__name__}. Pass index.as_retriever(...) rather than a query engine.")
        if self.kind == "langchain" and not callable(getattr(obj, "invoke", None)):
            raise TypeError(f"system {self.name!r}: a LangChain object needs invoke(query); got "
                            f"{type(obj).__name__}.")
        if self.kind == "callable" and not callable(obj):
            raise TypeError(f"system {self.name!r} is a {type(obj).__name__}; pass a funnel_core Stage or "
                            "Funnel, a LlamaIndex retriever, a LangChain retriever/runnable, or a callable "
                            "fn(query) -> list of units, nodes, documents or strings.")
        for pp in self.postprocessors:
            if not (isinstance(pp, Stage) or hasattr(pp, "postprocess_nodes")
                    or hasattr(pp, "compress_documents")):
                raise TypeError(f"system {self.name!r}: postprocessor {type(pp).__name__} has neither "
                                "postprocess_nodes (LlamaIndex) nor compress_documents (LangChain) and is "
                                "not a funnel_core Stage.")
        #: The parts whose model work is not counted (framework objects other than the rerankers
        #: :func:`counted_reranker` recognises, plain functions): the report marks their cost unknown.
        self.uncounted: list[str] = [_describe(x) for x in [self.obj, *self.postprocessors]
                                     if not (isinstance(x, Stage) or _ours(x) or counted_reranker(x))]

    def _first(self, query: str) -> list[Any]:
        if self.kind == "funnel_core":
            return list(self.obj(query))
        if self.kind == "llama_index":
            return list(self.obj.retrieve(query))
        if self.kind == "langchain":
            return list(self.obj.invoke(query))
        return list(self.obj(query))

    def retrieve(self, query: str) -> list[Any]:
        """The system's own output objects for ``query`` (nodes, documents or units)."""
        items = self._first(query)
        for pp in self.postprocessors:
            if isinstance(pp, Stage):
                items = list(pp(query, [to_unit(x, i) for i, x in enumerate(items)]))
            else:
                if items and counted_reranker(pp):  # the candidates it scores: one batch of pairs
                    counters.add(model_calls=1, pairs_scored=len(items))
                if hasattr(pp, "postprocess_nodes"):
                    items = list(pp.postprocess_nodes(items, query_str=query))
                else:
                    items = list(pp.compress_documents(items, query))
        return items

    def search(self, query: str) -> list[Unit]:
        """The ranked results for ``query`` as units, best first."""
        return [to_unit(x, i) for i, x in enumerate(self.retrieve(query))]

    def search_traced(self, query: str,
                      answers: Sequence[str] | None = None) -> tuple[list[Unit], list[dict[str, Any]] | None]:
        """:meth:`search` and, for a ``funnel_core`` :class:`~funnel_core.funnel.Funnel` without
        postprocessors, its per-stage trace: ``[{"stage", "units_out", "answer_recall"}]`` (the
        recall over all of a stage's output, ``None`` without ``answers``); ``None`` for others."""
        from funnel_core.funnel import Funnel

        if self.kind == "funnel_core" and not self.postprocessors and isinstance(self.obj, Funnel):
            res = self.obj.search(query, answers=answers)
            return res.units, [{"stage": r.name, "units_out": r.units_out, "answer_recall": r.answer_recall}
                               for r in res.trace.stages]
        return self.search(query), None

    def warm_up(self, query: str | None = None) -> None:
        """Load every lazy model (stages, adapters with ``warm_up()``) and, when ``query`` is
        given, run it once, so that timed queries pay neither."""
        warm_up_objects([self.obj, *self.postprocessors])
        if query:
            self.search(query)

    def __repr__(self) -> str:
        pp = f" + {len(self.postprocessors)} postprocessor(s)" if self.postprocessors else ""
        return f"System({self.name!r}, {self.kind}: {type(self.obj).__name__}{pp})"


def as_system(obj: Any, name: str) -> System:
    """A :class:`System` from any accepted object; a ``(retriever, [postprocessors])`` pair
    adds postprocessors."""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], (list, tuple)):
        return System(obj[0], obj[1], name=name)
    s = System(obj, name=name)
    s.name = name
    return s


