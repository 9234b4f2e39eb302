"""Stages and the progressive :class:`Funnel` (FunnelRAG's coarse-to-fine pipeline).

A stage is anything with the signature ``stage(query, units) -> units``. Subclasses of
:class:`Stage` get, for free:

* ``stage % k`` — a rank cut-off (kept as ``stage.cutoff``; stages that can do less work when
  they know ``k``, such as BM25, read it and push it down, as PyTerrier does);
* ``a >> b`` — a :class:`Funnel` that runs ``a`` then ``b``;
* ``await stage.acall(query, units)`` — an async twin (a worker thread by default, so the event
  loop never blocks on model inference);
* a clear error for a non-string query, and an empty result for an empty one.

Example — the paper's funnel::

    funnel = clustered_bm25 % 80 >> LaterChunking(level="document") >> cross_encoder % 8 \
        >> LaterChunking(words=100) >> fid % 4
    result = funnel.search("who wrote Hamlet?", answers=["Shakespeare"])
    print(result.trace.format())
"""

from __future__ import annotations

import asyncio
import copy
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar, overload

from funnel_core.errors import check_positive_int, check_query
from funnel_core.units import StageRecord, Trace, Unit

__all__ = ["Stage", "FunctionStage", "Funnel", "FunnelResult", "as_stage", "warm_up_objects",
           "warm_up_attributes", "WarmUpMixin", "runs_as", "defined_by", "CallStage"]


def warm_up_objects(objects: Iterable[Any], _seen: set[int] | None = None) -> None:
    """Warm up every stage among ``objects`` and load every lazy model (one level into lists,
    and into objects holding a ``_model`` :class:`~funnel_core.models.LazyModel`, e.g. embedders)."""
    from funnel_core.models import LazyModel

    seen = set() if _seen is None else _seen
    for obj in objects:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, Stage):
            obj.warm_up()
        elif isinstance(obj, LazyModel):
            obj.get()
        elif isinstance(getattr(obj, "_model", None), LazyModel):
            obj._model.get()
        elif isinstance(obj, (list, tuple)):
            warm_up_objects(obj, seen)
        elif callable(getattr(obj, "warm_up", None)) and not isinstance(obj, type):
            obj.warm_up()  # an adapter (postprocessor, compressor, retriever) wrapping a stage


def warm_up_attributes(obj: Any) -> Any:
    """Warm up everything ``obj`` holds (its attributes and, for pydantic models, its private
    attributes; see :func:`warm_up_objects`); returns ``obj``. Adapters call it from ``warm_up()``."""
    private = getattr(obj, "__pydantic_private__", None) or {}
    warm_up_objects([*vars(obj).values(), *private.values()], {id(obj)})
    return obj


class WarmUpMixin:
    """Gives an adapter (a retriever holding stages and indexes) :meth:`warm_up`."""

    def warm_up(self) -> Any:
        """Load the models of the stages and indexes this object holds and run one dummy batch
        (:meth:`Stage.warm_up`), e.g. at server start-up; returns ``self``."""
        return warm_up_attributes(self)


def defined_by(cls: type, method: str) -> type | None:
    """The class of ``cls``'s MRO whose body defines ``method``."""
    return next((k for k in cls.__mro__ if method in vars(k)), None)


def runs_as(obj: Any, bases: Sequence[type], *methods: str) -> bool:
    """Whether ``obj`` runs each of ``methods`` as one of ``bases`` defines it: how an adapter's
    funnel tells its own objects (run on units, no framework object built) from a subclass that
    overrides one of them (run through its framework, converting around it, like any other)."""
    return all(defined_by(type(obj), m) in bases for m in methods)


#: An item a stage passes through untouched on an empty query (a Unit, a framework node).
T = TypeVar("T")

class Stage(ABC):
    """Base class of every pipeline stage: ``(query, units) -> units``.

    Subclasses implement :meth:`run`. ``name`` is what the trace shows and the key under which
    the next stage keeps this stage's score; ``level`` is the granularity of the output units
    (``None`` when the stage does not change it).
    """

    name: str = "stage"
    level: str | None = None
    cutoff: int | None = None

    @abstractmethod
    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        """Score, filter or split ``units`` for ``query``; return new units, best first."""

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        """Async twin of :meth:`run`; by default runs :meth:`run` in a worker thread."""
        return await asyncio.to_thread(self.run, query, units)

    def warm_up(self) -> "Stage":
        """Load every lazily loaded model now (this stage's and its sub-stages') and run one
        dummy batch, so the first real query pays neither; returns ``self``. For servers: call it
        at start-up. The CLI calls it before timing."""
        warm_up_objects([v for v in vars(self).values() if v is not self], {id(self)})
        self._warm_up_batch()
        return self

    def _warm_up_batch(self) -> None:
        """Run one dummy batch through the loaded model (stages with a model override this)."""
        return None

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, query: str, units: Sequence[Unit] | None = None) -> list[Unit]:
        query = check_query(query)
        if not query:
            return self.no_query(units or [])
        out = self.run(query, list(units or []))
        return out[: self.cutoff] if self.cutoff is not None else out

    async def acall(self, query: str, units: Sequence[Unit] | None = None) -> list[Unit]:
        query = check_query(query)
        if not query:
            return self.no_query(units or [])
        out = await self.arun(query, list(units or []))
        return out[: self.cutoff] if self.cutoff is not None else out

    def no_query(self, items: Sequence[T]) -> list[T]:
        """What every stage (and every adapter of one) returns for an empty or blank query:
        there is nothing to score with, so the incoming items keep their order, capped by the
        stage's ``top_n`` and its cut-off (``stage % n``) as for any other query. A first
        stage (a retriever) gets no items, so it returns none."""
        limit = self.limit(getattr(self, "top_n", None))
        out = list(items)
        return out[:limit] if limit is not None else out

    @overload
    def limit(self, k: int) -> int: ...

    @overload
    def limit(self, k: None = None) -> int | None: ...

    def limit(self, k: int | None = None) -> int | None:
        """How many units this stage needs to produce: the smaller of its own ``k`` and its
        cut-off (``stage % n``), ``None`` when neither is set. A cut-off never adds results:
        ``stage % n`` returns at most what the stage alone returns. Stages that can do less work
        when they know the number (BM25, dense search, fusion, MoG) push this down."""
        limits = [x for x in (k, self.cutoff) if x is not None]
        return min(limits) if limits else None

    # -- composition -----------------------------------------------------------------------
    def __mod__(self, k: int) -> "Stage":
        """``stage % k``: a copy of the stage that keeps its top ``k`` units."""
        check_positive_int(k, "cut-off k")
        new = copy.copy(self)
        new.cutoff = k
        return new

    def __rshift__(self, other: Any) -> "Funnel":
        return Funnel([self, other])

    def __rrshift__(self, other: Any) -> "Funnel":
        return Funnel([other, self])

    def __repr__(self) -> str:
        cut = f" % {self.cutoff}" if self.cutoff is not None else ""
        return f"{type(self).__name__}(name={self.name!r}){cut}"


class FunctionStage(Stage):
    """Wrap a plain function ``f(query, units) -> units`` as a stage."""

    def __init__(self, fn: Callable[[str, list[Unit]], list[Unit]], name: str | None = None,
                 level: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"FunctionStage needs a callable, got {type(fn).__name__}.")
        self.fn = fn
        self.name = str(name or getattr(fn, "__name__", "function"))
        self.level = level

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return list(self.fn(query, units))


class CallStage(Stage):
    """A stage that calls an object of a framework (the adapters' wrappers of retrievers,
    postprocessors, compressors, ...), written once for both call paths: ``_call(query, units,
    asynchronous)`` returns the object's output (with ``asynchronous``, an awaitable of it: the
    object's own async method), which ``_units(output, units)`` reads back as this stage's
    units."""

    @abstractmethod
    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        """The object's output for ``query`` and ``units`` (an awaitable with ``asynchronous``)."""

    @abstractmethod
    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        """The object's output as units (``before``: this stage's input)."""

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._units(self._call(query, units, False), units)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._units(await self._call(query, units, True), units)


def as_stage(obj: Any) -> Stage:
    """Accept a :class:`Stage` or any ``callable(query, units)`` and return a :class:`Stage`."""
    if isinstance(obj, Stage):
        return obj
    if callable(obj):
        return FunctionStage(obj)
    raise TypeError(
        f"a funnel stage must be a funnel_core Stage or a callable (query, units) -> units, "
        f"got {type(obj).__name__}."
    )


@dataclass
class FunnelResult:
    """The final units of a funnel run and its :class:`Trace`."""

    units: list[Unit]
    trace: Trace


class Funnel(Stage):
    """An ordered list of stages; each stage's output is the next stage's input.

    ``Funnel`` is itself a :class:`Stage`, so funnels nest and compose with ``>>`` and ``%``.
    :meth:`search` returns the units together with a :class:`Trace` (units in/out and seconds
    per stage, and the answer recall that survives each stage when gold answers are given).
    """

    name = "funnel"

    def __init__(self, stages: Iterable[Any], name: str = "funnel") -> None:
        flat: list[Stage] = []
        for s in stages:
            s = as_stage(s)
            # a >> b >> c builds Funnel([Funnel([a, b]), c]); flatten un-cut inner funnels.
            if isinstance(s, Funnel) and s.cutoff is None and s.name == "funnel":
                flat.extend(s.stages)
            else:
                flat.append(s)
        if not flat:
            raise ValueError("a Funnel needs at least one stage, got none.")
        self.stages: list[Stage] = flat
        self.name = name

    def __rshift__(self, other: Any) -> "Funnel":
        return Funnel([*self.stages, other]) if self.cutoff is None else Funnel([self, other])

    def __len__(self) -> int:
        return len(self.stages)

    def __iter__(self):
        return iter(self.stages)

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._run(query, units, None).units

    def no_query(self, items: Sequence[T]) -> list[T]:
        """An empty query: each stage's :meth:`Stage.no_query` in turn (their ``top_n`` and
        cut-offs cap the items), then the funnel's own cut-off."""
        out = list(items)
        for stage in self.stages:
            out = stage.no_query(out)
        return super().no_query(out)

    def search(self, query: str, units: Sequence[Unit] | None = None,
               answers: Sequence[str] | None = None) -> FunnelResult:
        """Run every stage and return the final units with the trace.

        Args:
            query: The question.
            units: Input units for the first stage (usually empty: a retriever stage comes first).
            answers: Gold answer strings; when given, the trace records answer recall per stage.
        """
        query = check_query(query)
        if not query:
            return FunnelResult([], Trace(query=query))
        res = self._run(query, _check_units(units), answers)
        if self.cutoff is not None:
            res.units = res.units[: self.cutoff]
        return res

    def _run(self, query: str, units: list[Unit], answers: Sequence[str] | None) -> FunnelResult:
        trace = Trace(query=query)
        for stage in self.stages:
            n_in = len(units)
            t0 = time.perf_counter()
            units = stage(query, units)
            seconds = time.perf_counter() - t0
            trace.stages.append(self._record(stage, n_in, units, seconds, answers))
        return FunnelResult(units, trace)

    async def asearch(self, query: str, units: Sequence[Unit] | None = None,
                      answers: Sequence[str] | None = None) -> FunnelResult:
        """Async twin of :meth:`search` (each stage's :meth:`Stage.acall`)."""
        query = check_query(query)
        if not query:
            return FunnelResult([], Trace(query=query))
        trace = Trace(query=query)
        out = _check_units(units)
        for stage in self.stages:
            n_in = len(out)
            t0 = time.perf_counter()
            out = await stage.acall(query, out)
            trace.stages.append(self._record(stage, n_in, out, time.perf_counter() - t0, answers))
        if self.cutoff is not None:
            out = out[: self.cutoff]
        return FunnelResult(out, trace)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return (await self.asearch(query, units)).units

    @staticmethod
    def _record(stage: Stage, n_in: int, out: list[Unit], seconds: float,
                answers: Sequence[str] | None) -> StageRecord:
        recall = None
        if answers:
            from funnel_core.text import has_answer

            recall = 1.0 if has_answer(" ".join(u.text for u in out), answers) else 0.0
        level = stage.level or (out[0].level if out else None)
        name = stage.name + (f" % {stage.cutoff}" if stage.cutoff is not None else "")
        return StageRecord(name=name, units_in=n_in, units_out=len(out), seconds=seconds,
                           level=level, answer_recall=recall)

    def __repr__(self) -> str:
        return " >> ".join(repr(s) for s in self.stages)


def _check_units(units: Sequence[Unit] | None) -> list[Unit]:
    """``units`` as a list, or ``TypeError`` naming the first element that is not a Unit."""
    if isinstance(units, (str, Unit)):
        raise TypeError("units must be a list of Unit objects; wrap a single unit in a list.")
    out = list(units or [])
    for i, u in enumerate(out):
        if not isinstance(u, Unit):
            raise TypeError(f"units[{i}] is a {type(u).__name__} ({u!r:.60}), not a Unit; build "
                            "units with Unit(id=..., text=...) (or pass no units when the first "
                            "stage is a retriever).")
    return out
