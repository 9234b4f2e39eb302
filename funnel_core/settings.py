"""Settings declared once: in a stage's keyword constructor.

A configurable class (a reranker, a chunker, a compressor, ...) subclasses :class:`Settings`
and declares its settings once, as the keyword parameters of its ``__init__``, storing each one
as a plain attribute of the same name. Everything else is derived from that signature, as
Haystack's ``component_to_dict``/``component_from_dict`` do:

* :meth:`Settings.to_dict` reads the current attributes (an edit shows at once);
* :meth:`Settings.from_dict` calls the constructor (unknown keys raise, naming the accepted
  ones);
* an assignment ``stage.batch_size = 4`` is validated by the constructor itself (a dry
  construction with the edited value; constructors only store settings and load nothing), and is
  honoured at the next call because scoring reads the attributes at call time;
* an edit of a *load-time* setting (:attr:`Settings.load_settings`: the model, its device,
  precision, runtime, ...) drops the loaded model, which reloads lazily; any other edit keeps it.

Nothing here imports a stage: this module sits below every stage in the import graph.
"""

from __future__ import annotations

import inspect
import threading
from abc import ABCMeta
from typing import Any, Callable, ClassVar, Mapping, TypeVar

from funnel_core.errors import BuiltSettingError

__all__ = ["Settings", "SettingsMeta", "BuiltSettingError", "field_defaults", "setting_names", "check_kwargs", "StageAdapter", "build_index",
           "keyword_names", "checked_keywords", "check_search_kwargs"]


_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


def check_kwargs(owner: str, given: Any, accepted: Any) -> None:
    """Raise ``TypeError`` naming unknown keyword arguments and the accepted ones."""
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise TypeError(f"{owner} got unknown argument(s) {unknown}; accepted: {sorted(accepted)}.")


def check_search_kwargs(owner: Any, search: Any, kwargs: Mapping[str, Any]) -> None:
    """Reject per-call keyword arguments that ``search`` does not take, besides ``k`` (a typo such
    as ``filters=`` for ``filter=`` must not silently return unfiltered results); ``owner`` is the
    retriever the user called."""
    if not kwargs:
        return
    params = inspect.signature(search).parameters
    accepted = ["k"] + [n for n, p in params.items()
                        if n not in ("query", "k") and p.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"{type(owner).__name__} got unknown keyword argument(s) {unknown} at "
                        f"query time; accepted: {accepted}.")


def checked_keywords(fn: _F) -> _F:
    """Decorate a constructor or factory so that a keyword it does not take raises
    :func:`check_kwargs`'s ``TypeError`` (naming the accepted keywords) before the call, instead
    of Python's bare "unexpected keyword argument". ``__init__`` is named after the class being
    built (``BM25Retriever got unknown argument(s) ...``), anything else by its qualified name
    (``FunnelRetriever.from_stages``). A function taking ``**kwargs`` is returned unchanged: it
    checks what it forwards itself (:func:`build_index`, :func:`check_kwargs`)."""
    import functools

    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn
    accepted = frozenset(n for n, p in params.items() if n not in ("self", "cls") and p.kind in (
        inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    is_init = fn.__name__ == "__init__"
    owner = fn.__qualname__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs and not accepted.issuperset(kwargs):
            check_kwargs(type(args[0]).__name__ if is_init and args else owner, kwargs, accepted)
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def keyword_names(*callables: Any) -> list[str]:
    """The keyword parameters ``callables`` take together (their ``**kwargs`` left out)."""
    out: list[str] = []
    for fn in callables:
        for n, p in inspect.signature(fn).parameters.items():
            if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                          inspect.Parameter.POSITIONAL_OR_KEYWORD) and n != "self" and n not in out:
                out.append(n)
    return out


def build_index(owner: str, factory: Any, settings: dict[str, Any], accepted: Any) -> Any:
    """``factory(**settings)`` (an index class or a backend's index factory) after rejecting
    settings that are not ``accepted``, naming ``owner`` (the class the user called) and the
    accepted ones, instead of an internal class's ``unexpected keyword argument``."""
    check_kwargs(owner, settings, accepted)
    return factory(**settings)


_NAMES: dict[type, tuple[str, ...]] = {}
_LOCK_MARK = "<funnel_core.settings: a lock, made anew when unpickled>"
_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def field_defaults(model: Any) -> dict[str, Any]:
    """``{field: default}`` of a pydantic model of shared adapter fields (``*Fields``): the defaults
    a framework's plain-class adapter takes for its keywords, so each is written once."""
    return {name: field.default for name, field in model.model_fields.items()}


def setting_names(cls: type) -> tuple[str, ...]:
    """The names of ``cls.__init__``'s named parameters (its settings), in declaration order,
    then those it takes through ``**kwargs`` (:attr:`Settings.keyword_settings`)."""
    names = _NAMES.get(cls)
    if names is None:
        params = inspect.signature(cls.__init__).parameters  # type: ignore[misc]
        names = tuple(n for n, p in params.items() if n != "self" and p.kind not in (
            inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD))
        names += tuple(n for n in getattr(cls, "keyword_settings", ()) if n not in names)
        _NAMES[cls] = names
    return names


class SettingsMeta(ABCMeta):
    """Marks an instance ready once its constructor has returned: from then on an assignment to a
    setting is an *edit* (validated, and dropping the model when it is a load-time setting)."""

    @property
    def __signature__(cls) -> inspect.Signature:
        """The constructor's signature (what ``inspect.signature(cls)`` and ``help`` show),
        not that of :meth:`__call__` below."""
        sig = inspect.signature(cls.__init__)  # type: ignore[misc]
        return sig.replace(parameters=list(sig.parameters.values())[1:])

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        check_kwargs(cls.__name__, kwargs, setting_names(cls))  # a typo names the accepted ones
        obj = super().__call__(*args, **kwargs)
        object.__setattr__(obj, "_settings_ready", True)
        return obj


class Settings(metaclass=SettingsMeta):
    """Mixin: settings = the keyword parameters of ``__init__``, stored as attributes.

    Class attributes:
        load_settings: Settings whose edit drops the loaded model (the weights, where and how
            they run). Every other edit keeps it.
        model_attrs: Attributes holding lazily loaded state (:class:`~funnel_core.models.LazyModel`
            objects are reset; anything else is set to ``None``) that :meth:`drop_model` clears.
        unserialised: Settings that hold live objects (an LLM, an embedder): :meth:`to_dict`
            writes ``None`` for them unless they are strings, and :meth:`from_dict` takes them as
            keyword overrides.
    """

    load_settings: ClassVar[frozenset[str]] = frozenset()
    model_attrs: ClassVar[tuple[str, ...]] = ("_model",)
    unserialised: ClassVar[tuple[str, ...]] = ()
    #: A setting stored under another attribute name (e.g. ``{"model": "model_name"}`` where
    #: ``model`` is the loaded model); every other setting is the attribute of its own name.
    setting_attrs: ClassVar[dict[str, str]] = {}
    #: Settings that shape what an index builds (BM25's ``k1``, a tokenizer's stemmer, a
    #: clustering's ``max_tokens``): editable until :meth:`built` is true, then an edit raises
    #: :class:`BuiltSettingError` naming the setting (the built data would no longer match it).
    build_settings: ClassVar[frozenset[str]] = frozenset()
    #: Settings a constructor takes through ``**kwargs`` and passes on (a Milvus BM25 index's
    #: tokenizer settings, which it may also adopt from its collection): accepted, named in
    #: errors, and editable like the others (the class reads and stores them itself, see
    #: :meth:`_setting` and :meth:`_take_setting`).
    keyword_settings: ClassVar[tuple[str, ...]] = ()

    # -- reading and writing the settings ----------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The current settings as constructor keyword arguments."""
        return {n: self._setting(n) for n in setting_names(type(self))}

    def _setting(self, name: str) -> Any:
        """The current value of the setting ``name``, as the constructor takes it."""
        return getattr(self, self.setting_attrs.get(name, name))

    @classmethod
    def _setting_of(cls, attr: str) -> str | None:
        """The setting stored in the attribute ``attr`` (``None``: not a setting)."""
        for name, stored in cls.setting_attrs.items():
            if stored == attr:
                return name
        return attr if attr in setting_names(cls) and attr not in cls.setting_attrs else None

    def built(self) -> bool:
        """Whether this object holds data built with its :attr:`build_settings` (an index
        answers true once it is built or loaded; a stage has none)."""
        return False

    def __setattr__(self, attr: str, value: Any) -> None:
        name = self._setting_of(attr) if self.__dict__.get("_settings_ready") else None
        if name is None:
            object.__setattr__(self, attr, value)
            return
        if name in self.build_settings and self.built():
            raise BuiltSettingError(
                f"{name} is a build-time setting of this {type(self).__name__}, which is already "
                f"built with {name}={self._setting(name)!r}; build a new index with the new value "
                f"({type(self).__name__}.from_dict({{**index.to_dict(), {name!r}: ...}}).index(...)).")
        old = self._setting(name)
        # validated and normalised by the constructor itself: a dry construction with the edit
        # (constructors store settings and load nothing, so this is cheap)
        probe = type(self)(**{**self.settings(), name: value})
        if name in self.load_settings and not _same(old, probe._setting(name)):
            self._detach_models()
            self._take_setting(name, attr, probe)
            self.drop_model()
        else:
            self._take_setting(name, attr, probe)

    def _take_setting(self, name: str, attr: str, probe: Any) -> None:
        """Store the setting ``name`` (in the attribute ``attr``) as ``probe``, the dry
        construction that validated the edit, holds it."""
        object.__setattr__(self, attr, getattr(probe, attr))

    def drop_model(self) -> None:
        """Forget the loaded model (it reloads lazily at the next call)."""
        from funnel_core.models import LazyModel

        for attr in self.model_attrs:
            old = self.__dict__.get(attr)
            # a new object, not a reset of the old one: a copy (``stage % k``) may share it
            object.__setattr__(self, attr, LazyModel(self._rebind(old._factory))
                               if isinstance(old, LazyModel) else None)

    def _rebind(self, factory: Any) -> Any:
        """``factory`` bound to this object when it is a method of another (a copy's)."""
        func = getattr(factory, "__func__", None)
        return func.__get__(self) if func is not None else factory

    def _detach_models(self) -> None:
        """Before a load-time edit: a lazy model that copies (``stage % k``) may share and that
        is not loaded yet goes on loading with the settings as they are now, not the edited
        ones (it is bound to a frozen copy); this object then gets a model of its own."""
        from funnel_core.models import LazyModel

        frozen = object.__new__(type(self))
        frozen.__dict__.update(self.__dict__)
        for attr in self.model_attrs:
            lazy = self.__dict__.get(attr)
            if isinstance(lazy, LazyModel) and not lazy.loaded:
                lazy._factory = frozen._rebind(lazy._factory)

    # -- pickling and copying ------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The attributes, with locks left out (they do not pickle; a new one is made on load);
        lazily loaded models pickle without their value (:class:`~funnel_core.models.LazyModel`)."""
        return {k: _LOCK_MARK if isinstance(v, _LOCK_TYPES) else v for k, v in self.__dict__.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, threading.Lock() if isinstance(v, str) and v == _LOCK_MARK else v)

    # -- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """``{"type": class name, **settings}`` with the current values."""
        out = self.settings()
        for n in self.unserialised:
            if not isinstance(out.get(n), (str, type(None))):
                out[n] = None
        return {"type": type(self).__name__, **out}

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> Any:
        """Inverse of :meth:`to_dict`; ``overrides`` (e.g. ``llm=``) replace saved values."""
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}.from_dict needs a dict, got {type(data).__name__}.")
        data = dict(data)
        kind = data.pop("type", cls.__name__)
        if kind != cls.__name__:
            raise ValueError(f"this dict describes a {kind}, not a {cls.__name__}.")
        data.update(overrides)
        check_kwargs(f"{cls.__name__}.from_dict", data, setting_names(cls))
        for n in cls.unserialised:
            if n in data and data[n] is None and n not in overrides \
                    and inspect.signature(cls.__init__).parameters[n].default is inspect._empty:  # type: ignore[misc]
                raise TypeError(f"{cls.__name__} was saved with a live {n!r} object, which is not "
                                f"serialised; pass it again: {cls.__name__}.from_dict(data, "
                                f"{n}=...).")
        return cls(**data)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # e.g. arrays
        return a is b


class StageAdapter:
    """Mixin of the pydantic adapters (LlamaIndex postprocessors and node parsers, LangChain
    compressors and splitters) that hold one :class:`Settings` object in ``_stage``.

    The adapter declares its fields in its own class body (what editors and type checkers see);
    the fields named like a setting of :attr:`stage_class` are passed to its constructor, and an
    edit of such a field is forwarded to the held object (validated there first; a load-time
    setting drops the model, any other keeps it). ``copy``/``model_copy`` give the copy its own
    stage (sharing the loaded model until a load-time setting of either changes).
    Unknown keyword arguments raise, naming the accepted ones.

    Framework-free: it touches only pydantic's ``model_fields`` and ``__pydantic_private__``
    through the class it is mixed into.
    """

    stage_class: ClassVar[Any] = None

    def __init__(self, **data: Any) -> None:
        check_accepted(type(self), data)
        super().__init__(**data)

    @classmethod
    def _forwarded(cls) -> tuple[str, ...]:
        fields = cls.model_fields  # type: ignore[attr-defined]
        return tuple(n for n in setting_names(cls.stage_class) if n in fields)

    def stage_settings(self) -> dict[str, Any]:
        """The stage's constructor arguments from the current field values."""
        return {n: self._stage_value(n, getattr(self, n)) for n in self._forwarded()}

    def _stage_value(self, name: str, value: Any) -> Any:
        """A field's value as the stage takes it (override to convert, e.g. a framework LLM)."""
        return value

    def _make_stage(self) -> Any:
        return self.stage_class(**self.stage_settings())

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)  # type: ignore[misc]
        self._stage = self._make_stage()  # validates every setting now; models load lazily

    @property
    def stage(self) -> Any:
        """The ``funnel_core`` object this adapter runs."""
        return self._stage

    def __setattr__(self, name: str, value: Any) -> None:
        private = getattr(self, "__pydantic_private__", None) or {}
        stage = private.get("_stage")
        if stage is not None and name in self._forwarded():
            # validated by the stage's constructor, before the field changes
            setattr(stage, getattr(stage, "setting_attrs", {}).get(name, name),
                    self._stage_value(name, value))
            super().__setattr__(name, value)
            return
        super().__setattr__(name, value)

    def __copy__(self) -> Any:
        import copy

        new = super().__copy__()  # type: ignore[misc]
        new.__pydantic_private__["_stage"] = copy.copy(self._stage)
        return new

    def model_copy(self: _T, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> _T:
        new = super().model_copy(deep=deep)  # type: ignore[misc]
        for name, value in (update or {}).items():
            setattr(new, name, value)
        return new  # type: ignore[no-any-return]

    def warm_up(self) -> Any:
        """Load the stage's model now and run one dummy batch (``Stage.warm_up``); returns self."""
        warm = getattr(self._stage, "warm_up", None)
        if callable(warm):
            warm()
        return self


def check_accepted(cls: type, data: dict[str, Any]) -> None:
    """Reject keyword arguments of a pydantic class that are none of its fields (or aliases),
    naming the accepted ones (pydantic's own ``extra="forbid"`` names only the bad one)."""
    fields = cls.model_fields  # type: ignore[attr-defined]
    accepted = set(fields) | {f.alias for f in fields.values() if f.alias}
    check_kwargs(cls.__name__, data, accepted)
