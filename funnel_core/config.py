"""One typed, validated configuration per stage, owned by the core.

Each configurable stage has a frozen dataclass (:class:`CrossEncoderConfig`, ...) that lists its
settings once, with their types, defaults and descriptions. Everything else derives from it:

* the stage class records its config (``stage.config``) whatever way it was built, and gets
  ``from_config``/``to_dict``/``from_dict`` (see :func:`configured`);
* the LlamaIndex and LangChain adapters take their pydantic fields from it
  (:func:`pydantic_fields`) instead of restating them, and build the core stage from the
  *current* field values (:func:`current_stage`): a changed setting is honoured at the next call,
  and the loaded model is kept when only cheap settings (``top_n``, thresholds, ...) changed;
* persistence and serialisation write ``config.to_dict()`` and read ``from_dict``.

Configs validate types on construction (a clear ``TypeError`` naming the field); the semantic
checks (ranges, templates, backend names) stay in the stage constructor, which
:meth:`StageConfig.build` runs.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union

__all__ = [
    "StageConfig",
    "CrossEncoderConfig",
    "MonoT5Config",
    "FiDAttentionConfig",
    "AttentionLMConfig",
    "RankRAGConfig",
    "LaterChunkingConfig",
    "ExtractiveCompressorConfig",
    "RepackConfig",
    "ForwardLookupConfig",
    "LLMProviderConfig",
    "ForwardVariantConfig",
    "FusionConfig",
    "ClusterRetrievalConfig",
    "MultiGranularityConfig",
    "GraphGranularityConfig",
    "MixOfGranularityConfig",
    "configured",
    "config_attributes",
    "config_of",
    "current_stage",
    "pydantic_fields",
    "doc",
]


def doc(description: str, default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A dataclass field with a description (shown by the adapters' pydantic fields)."""
    return field(default=default, metadata={"description": description}, **kw)


def _check_type(name: str, value: Any, hint: Any, owner: str) -> Any:
    """Check ``value`` against a simple type hint; returns the (possibly normalised) value."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_type(name, value, arg, owner)
            except TypeError as exc:
                errors.append(exc)
        raise errors[0] if errors else TypeError(f"{owner}.{name}: bad value {value!r}.")
    if hint is Any or hint is object:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{owner}.{name} must be a bool, got {type(value).__name__} {value!r}.")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__} {value!r}.")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{owner}.{name} must be a number, got {type(value).__name__} "
                            f"{value!r}.")
        return float(value)
    if hint is str:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise TypeError(f"{owner}.{name} must be a str, got {type(value).__name__} {value!r}.")
        return value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{owner}.{name} must be a dict, got {type(value).__name__}.")
        return value
    return value


@dataclass(frozen=True)
class StageConfig:
    """Base of every stage configuration (frozen dataclasses: hashable, comparable).

    Class attributes set by each config:
        stage_path: ``"module:Class"`` of the stage it builds (imported lazily).
        model_keys: Fields whose change needs a new model; any other change keeps the loaded
            model (the attributes named by ``model_attrs`` move to the rebuilt stage).
        model_attrs: Attributes of the stage that hold the (lazily) loaded model.
    """

    stage_path: ClassVar[str] = ""
    model_keys: ClassVar[tuple[str, ...]] = ()
    model_attrs: ClassVar[tuple[str, ...]] = ("_model",)
    #: For a config that is not a stage by itself (no ``stage_path``): where it is used instead.
    used_by: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = _hints(type(self))  # type: ignore[arg-type]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            checked = _check_type(f.name, value, hints.get(f.name, Any), type(self).__name__)
            if checked is not value:
                object.__setattr__(self, f.name, checked)

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (plus ``"type"``, the config class name)."""
        return {"type": type(self).__name__, **self.kwargs()}

    def kwargs(self) -> dict[str, Any]:
        """The settings as constructor keyword arguments of the stage."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def split(cls, settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``settings`` split into this config's fields and the rest (another object's), for a
        constructor that takes the settings of two configs as keyword arguments."""
        mine = {k: v for k, v in settings.items() if k in cls.field_names()}
        return mine, {k: v for k, v in settings.items() if k not in mine}

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> "StageConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise ``TypeError`` naming them."""
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}.from_dict needs a dict, got {type(data).__name__}.")
        data = {**data, **overrides}
        kind = data.pop("type", cls.__name__)
        if kind != cls.__name__:
            raise ValueError(f"this dict describes a {kind}, not a {cls.__name__}.")
        check_kwargs(cls.__name__, data, cls.field_names())
        return cls(**data)

    def replace(self, **changes: Any) -> "StageConfig":
        """A copy with ``changes`` applied (validated)."""
        check_kwargs(type(self).__name__, changes, self.field_names())
        return dataclasses.replace(self, **changes)

    # -- building --------------------------------------------------------------------------
    @classmethod
    def stage_class(cls) -> type:
        module, _, name = cls.stage_path.partition(":")
        return getattr(importlib.import_module(module), name)

    def build(self, reuse: Any = None) -> Any:
        """Build the stage. With ``reuse`` (a stage built from another config of this class),
        its loaded model moves over when no field of :attr:`model_keys` changed."""
        if not self.stage_path:
            raise TypeError(f"{type(self).__name__} is not a stage by itself: {self.used_by}.")
        stage = self.stage_class()(**self.kwargs())
        old = getattr(reuse, "config", None)
        if type(old) is type(self) and all(getattr(old, k) == getattr(self, k)
                                           for k in self.model_keys):
            for attr in self.model_attrs:
                if hasattr(reuse, attr):
                    setattr(stage, attr, getattr(reuse, attr))
        return stage


def check_kwargs(owner: str, given: Any, accepted: Any) -> None:
    """Raise ``TypeError`` naming unknown keyword arguments and the accepted ones."""
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise TypeError(f"{owner} got unknown argument(s) {unknown}; accepted: {sorted(accepted)}.")


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def configured(config_cls: type[StageConfig]) -> Any:
    """Class decorator: the stage records ``self.config`` (a ``config_cls``) however it was built,
    and gains ``from_config``, ``to_dict`` and ``from_dict``.

    The constructor keeps its keyword arguments (existing callers are unaffected); the arguments
    that are config fields are collected into the config, which validates their types first.
    """

    def wrap(stage_cls: type) -> type:
        init = stage_cls.__init__  # type: ignore[misc]
        sig = inspect.signature(init)
        names = set(config_cls.field_names())

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            bound = sig.bind(self, *args, **kwargs)
            given = {k: v for k, v in bound.arguments.items() if k in names}
            var_kw = _var_kw(sig)
            extra = (bound.arguments.get(var_kw) if var_kw else None) or {}
            given.update({k: v for k, v in extra.items() if k in names})
            cfg = config_cls(**given)  # type errors first, naming the field
            init(self, *args, **kwargs)
            self.config = cfg

        def from_config(cls: type, config: StageConfig) -> Any:
            if not isinstance(config, config_cls):
                raise TypeError(f"{cls.__name__}.from_config needs a {config_cls.__name__}, got "
                                f"{type(config).__name__}.")
            return config.build()

        def to_dict(self: Any) -> dict[str, Any]:
            return self.config.to_dict()

        def from_dict(cls: type, data: dict[str, Any], **overrides: Any) -> Any:
            return config_cls.from_dict(data, **overrides).build()

        stage_cls.__init__ = __init__  # type: ignore[misc]
        stage_cls.config_class = config_cls  # type: ignore[attr-defined]
        stage_cls.from_config = classmethod(from_config)  # type: ignore[attr-defined]
        stage_cls.to_dict = to_dict  # type: ignore[attr-defined]
        stage_cls.from_dict = classmethod(from_dict)  # type: ignore[attr-defined]
        return stage_cls

    return wrap


class _ConfigAttribute:
    """One config field exposed as an attribute of its owner: reading gives the field of
    ``owner.<attr>``; assigning replaces the config (validated), so an edit is honoured."""

    def __init__(self, attr: str, name: str, description: str | None) -> None:
        self.attr, self.name, self.__doc__ = attr, name, description

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.attr), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.attr, getattr(obj, self.attr).replace(**{self.name: value}))


def config_attributes(config_cls: type[StageConfig], attr: str = "config") -> Any:
    """Class decorator for a plain (non-pydantic) class that keeps a ``config_cls`` instance in
    ``self.<attr>``: every field of the config becomes an attribute that reads and writes it, so
    the settings are declared once (in the config) and an assignment is validated."""

    def wrap(cls: type) -> type:
        for f in dataclasses.fields(config_cls):
            setattr(cls, f.name, _ConfigAttribute(attr, f.name, f.metadata.get("description")))
        return cls

    return wrap


def config_of(config_cls: type[StageConfig], config: Any, settings: dict[str, Any],
              owner: str) -> Any:
    """The ``config_cls`` of an object built with ``config=`` (a ready config) or with the
    config's fields as keyword arguments (``settings``), not both; unknown names raise naming
    the accepted ones."""
    if config is None:
        check_kwargs(owner, settings, config_cls.field_names())
        return config_cls(**settings)
    if not isinstance(config, config_cls):
        raise TypeError(f"{owner}: expected a {config_cls.__name__}, got {type(config).__name__}.")
    if settings:
        raise TypeError(f"{owner}: pass the settings either as one {config_cls.__name__} or as "
                        f"keyword arguments, not both (got {sorted(settings)} too).")
    return config


def _var_kw(sig: inspect.Signature) -> str | None:
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            return p.name
    return None


def current_stage(config: StageConfig, previous: Any = None) -> Any:
    """The stage for ``config``: ``previous`` itself when it was built from an equal config,
    else a new one (keeping ``previous``'s loaded model when no model field changed)."""
    if previous is not None and getattr(previous, "config", None) == config:
        return previous
    return config.build(reuse=previous)


def pydantic_fields(config_cls: type[StageConfig], *, exclude: tuple[str, ...] = (),
                    defaults: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """``{name: (annotation, FieldInfo)}`` for ``pydantic.create_model``: the adapters' fields,
    derived from the core config (type, default, description) instead of restated."""
    from pydantic import Field

    hints = _hints(config_cls)  # type: ignore[arg-type]
    defaults = defaults or {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config_cls):
        if f.name in exclude:
            continue
        desc = f.metadata.get("description")
        if f.name in defaults:
            default = defaults[f.name]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = (hints[f.name], Field(default_factory=f.default_factory,
                                                description=desc))
            continue
        else:
            default = ...
        out[f.name] = (hints[f.name], Field(default=default, description=desc))
    return out


# ----------------------------------------------------------------------------------------------
# The configurations. Defaults equal the stage constructors' (a test checks they agree).
# ----------------------------------------------------------------------------------------------

_COMMON_RERANK = (
    "top_n", "score_threshold", "normalize", "batch_size",
)


@dataclass(frozen=True)
class CrossEncoderConfig(StageConfig):
    """Settings of :class:`funnel_core.rerank.cross_encoder.CrossEncoderScorer`."""

    stage_path: ClassVar[str] = "funnel_core.rerank.cross_encoder:CrossEncoderScorer"
    model_keys: ClassVar[tuple[str, ...]] = ("model", "backend", "device", "fp16", "bf16",
                                              "model_kwargs", "max_length", "runtime",
                                              "export_dir", "dtype")

    model: Optional[str] = doc("Hub name or local folder; None = the backend's default model.",
                               None)
    backend: str = doc("sentence-transformers | flagembedding | transformers",
                       "sentence-transformers")
    batch_size: int = doc("Pairs per forward pass.", 32)
    device: Optional[str] = doc("cpu / cuda / mps; None = automatic.", None)
    max_length: int = doc("Tokens per (query, passage) pair; the passage is truncated, never "
                          "the query.", 512)
    fp16: Optional[bool] = doc("Half precision, CUDA only.", None)
    bf16: bool = doc("bfloat16 autocast (transformers backend).", False)
    sort_by_length: bool = doc("Batch pairs of similar length.", True)
    normalize: bool = doc("Sigmoid scores into (0, 1).", False)
    top_n: Optional[int] = doc("Units to keep (None: all).", None)
    score_threshold: Optional[float] = doc("Drop units scoring below this.", None)
    window_words: Optional[int] = doc("Score texts longer than this many words by their best "
                                      "window (MaxP); None = truncate.", None)
    window_overlap: int = doc("Words shared by consecutive windows.", 0)
    fuse_weight: Optional[float] = doc("Weight of the previous score in a min-max "
                                       "interpolation; None = off.", None)
    name: Optional[str] = doc("Stage name in traces and score histories.", None)
    model_kwargs: Optional[dict] = doc("Extra keyword arguments of the model loader.", None)
    runtime: str = doc("auto | torch | onnx | onnx-int8 | openvino (auto: torch on a GPU, the "
                       "fastest runtime within 0.005 nDCG@10 of fp32 measured on a CPU).", "auto")
    export_dir: Optional[str] = doc("Folder of the ONNX export; None = next to the model or the "
                                    "user cache.", None)
    dtype: str = doc("auto | float32 | bfloat16 | float16 (torch runtime; auto: bf16 only where "
                     "the hardware runs it natively).", "auto")


@dataclass(frozen=True)
class MonoT5Config(StageConfig):
    """Settings of :class:`funnel_core.rerank.monot5.MonoT5Scorer`."""

    stage_path: ClassVar[str] = "funnel_core.rerank.monot5:MonoT5Scorer"
    model_keys: ClassVar[tuple[str, ...]] = ("model", "device", "fp16", "model_kwargs",
                                              "true_token", "false_token", "template",
                                              "max_length", "dtype")

    model: str = doc("Hub name or local folder.", "castorini/monot5-base-msmarco")
    batch_size: int = doc("Prompts per forward pass.", 16)
    device: Optional[str] = doc("cpu / cuda / mps; None = automatic.", None)
    max_length: int = doc("Tokens per prompt; the passage is truncated, never the query.", 512)
    fp16: Optional[bool] = doc("Half precision, CUDA only.", None)
    sort_by_length: bool = doc("Batch prompts of similar length.", True)
    template: str = doc("Prompt with {query} before {document}.",
                        "Query: {query} Document: {document} Relevant:")
    true_token: str = doc("Token whose probability is the relevance.", "true")
    false_token: str = doc("The other token of the binary choice.", "false")
    normalize: bool = doc("Sigmoid scores into (0, 1).", False)
    top_n: Optional[int] = doc("Units to keep (None: all).", None)
    score_threshold: Optional[float] = doc("Drop units scoring below this.", None)
    name: Optional[str] = doc("Stage name in traces and score histories.", None)
    model_kwargs: Optional[dict] = doc("Extra keyword arguments of the model loader.", None)
    dtype: str = doc("auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the "
                     "hardware runs it natively, fp16 on older GPUs, else fp32).", "auto")


@dataclass(frozen=True)
class FiDAttentionConfig(StageConfig):
    """Settings of :class:`funnel_core.rerank.fid.FiDAttentionScorer`."""

    stage_path: ClassVar[str] = "funnel_core.rerank.fid:FiDAttentionScorer"
    model_keys: ClassVar[tuple[str, ...]] = ("model", "device", "fp16", "dtype")

    model: str = doc("Hub name or local folder of a T5 / FiD checkpoint.")
    template: str = doc("Reader input with {question}, {title} and {text}.",
                        "question: {question} title: {title} context: {text}")
    template_no_title: str = doc("Reader input for units without a title.",
                                 "question: {question} context: {text}")
    title_key: str = doc("Metadata key of a unit's title.", "title")
    lr: Optional[int] = doc("Representative tokens per passage (None: all).", 4)
    aggregation: str = doc("Table 7 aggregation scheme (as the paper writes it).", "mean")
    last_k: int = doc("Layers for aggregation='last_k_layers' (paper: 6).", 6)
    include_query_tokens: bool = doc("Table 8 'w/ query': mean over all question + passage "
                                     "tokens.", False)
    score_on: str = doc("alpha (eq. 3, pre-softmax) | log_attention | attention.", "alpha")
    decoder_steps: int = doc("Decoder positions averaged.", 1)
    return_answer: bool = doc("Store the FiD answer in metadata['fid_answer'].", False)
    max_answer_tokens: int = doc("Tokens generated for the answer.", 20)
    max_length: int = doc("Tokens per question + passage input.", 256)
    batch_size: int = doc("Passages per encoder pass.", 16)
    device: Optional[str] = doc("cpu, cuda, ... (None: best available).", None)
    fp16: bool = doc("Half precision, CUDA only.", False)
    top_n: Optional[int] = doc("Units to keep (None keeps all).", None)
    score_threshold: Optional[float] = doc("Drop units below this score.", None)
    normalize: bool = doc("Sigmoid-normalise scores.", False)
    name: Optional[str] = doc("Stage name in traces and score histories.", None)
    dtype: str = doc("auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the "
                     "hardware runs it natively, fp16 on older GPUs, else fp32).", "auto")


@dataclass(frozen=True)
class AttentionLMConfig(StageConfig):
    """Settings of :class:`funnel_core.rerank.attention_lm.AttentionLMScorer`."""

    stage_path: ClassVar[str] = "funnel_core.rerank.attention_lm:AttentionLMScorer"
    model_keys: ClassVar[tuple[str, ...]] = ("model", "gguf_file", "device", "fp16", "dtype")

    model: str = doc("Hub name or local folder of a causal LM.")
    gguf_file: Optional[str] = doc("GGUF file inside the folder.", None)
    attend_from: str = doc("'query' tokens or the 'answer' position.", "query")
    calibration_query: Optional[str] = doc("Content-free query (None: no calibration).", "N/A")
    instruction: Optional[str] = doc("Instruction before the passages (None: the default).",
                                     None)
    passage_template: str = doc("Template of one passage with {index} and {text}.",
                                "[{index}] {text}\n\n")
    query_template: str = doc("Template of the query with {query}.", "Query: {query}")
    use_chat_template: bool = doc("Wrap in the tokenizer's chat template.", True)
    max_passage_tokens: int = doc("Tokens kept per passage.", 300)
    max_context: Optional[int] = doc("Prompt limit (None: the model's).", None)
    fast_prefix: bool = doc("SDPA for the passages, eager for the query.", True)
    device: Optional[str] = doc("cpu, cuda, ... (None: best available).", None)
    fp16: bool = doc("Half precision, CUDA only.", False)
    top_n: Optional[int] = doc("Units to keep (None keeps all).", None)
    score_threshold: Optional[float] = doc("Drop units below this score.", None)
    normalize: bool = doc("Sigmoid-normalise scores.", False)
    batch_size: int = doc("Prompts per forward pass.", 1)
    name: Optional[str] = doc("Stage name in traces and score histories.", None)
    dtype: str = doc("auto | float32 | bfloat16 | float16 (auto: bf16 autocast only where the "
                     "hardware runs it natively, fp16 on older GPUs, else fp32).", "auto")

    def kwargs(self) -> dict[str, Any]:
        out = super().kwargs()
        if out["instruction"] is None:  # the constructor's default instruction
            del out["instruction"]
        return out


@dataclass(frozen=True)
class RankRAGConfig(StageConfig):
    """Settings of :class:`funnel_core.rerank.rankrag.RankRAGScorer`.

    ``llm`` is a ``funnel_core`` LLM provider or a local causal-LM name/folder; an LLM object is
    not serialisable, so ``to_dict`` writes ``None`` for it and ``from_dict`` asks for ``llm=``.
    """

    stage_path: ClassVar[str] = "funnel_core.rerank.rankrag:RankRAGScorer"
    model_keys: ClassVar[tuple[str, ...]] = ("llm", "gguf_file", "device", "timeout", "dtype")
    model_attrs: ClassVar[tuple[str, ...]] = ("llm",)

    llm: Any = doc("funnel_core LLM provider, or a causal-LM name/folder.")
    prompt: Optional[str] = doc("Template with {question} and {passage} (None: the paper's).",
                                None)
    mode: str = doc("'auto', 'logprobs' or 'generate'.", "auto")
    max_passage_words: int = doc("Passages are cut to this length.", 300)
    max_new_tokens: int = doc("Tokens per judgement (generate mode).", 8)
    samples: int = doc("Judgements per pair (generate mode).", 1)
    p_true: str = doc("renormalized: P(True)/(P(True)+P(False)); raw: P(True).", "renormalized")
    top_n: Optional[int] = doc("Units kept after reranking (None: all).", None)
    score_threshold: Optional[float] = doc("Drop units below this P(True).", None)
    batch_size: int = doc("Pairs per LLM call / forward pass.", 8)
    gguf_file: Optional[str] = doc("GGUF file for a local model folder.", None)
    device: Optional[str] = doc("Device of a local model.", None)
    timeout: Optional[float] = doc("Seconds per LLM call.", None)
    name: Optional[str] = doc("Stage name in traces and score histories.", None)
    dtype: str = doc("Weights of a local model: auto | float32 | bfloat16 | float16 (auto: bf16 "
                     "only where the hardware runs it natively, fp16 on older GPUs, else fp32).",
                     "auto")

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.llm, dict):
            raise TypeError("RankRAG llm came back as a dict: LLM objects are not serialisable; "
                            "pass the LLM again, e.g. RankRAGRerank.from_dict(data, llm=my_llm).")
        if self.llm is None:
            raise TypeError("RankRAG needs llm= (an LLM object or a local causal-LM folder).")

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if not isinstance(out["llm"], str):
            out["llm"] = None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> "StageConfig":
        data = dict(data)
        if data.get("llm") is None and "llm" not in overrides:
            raise TypeError("this RankRAG config was saved with an LLM object, which is not "
                            "serialised; pass it again: from_dict(data, llm=my_llm).")
        return super().from_dict(data, **overrides)

    def kwargs(self) -> dict[str, Any]:
        out = super().kwargs()
        if out["prompt"] is None:
            del out["prompt"]
        if not isinstance(out["llm"], str):  # provider objects carry their own settings
            for key in ("gguf_file", "device", "timeout", "dtype"):
                out.pop(key)
        else:
            out = {k: v for k, v in out.items() if v is not None or k not in ("gguf_file",
                                                                                "device",
                                                                                "timeout")}
        return out


@dataclass(frozen=True)
class LaterChunkingConfig(StageConfig):
    """Settings of :class:`funnel_core.funnelrag.chunking.LaterChunking`."""

    stage_path: ClassVar[str] = "funnel_core.funnelrag.chunking:LaterChunking"
    model_attrs: ClassVar[tuple[str, ...]] = ()

    words: int = doc("Target passage size in words.", 100)
    overlap: int = doc("Words repeated between consecutive passages.", 0)
    level: str = doc("Granularity name of the passages.", "passage")
    sentence_aware: bool = doc("End passages at sentence ends.", True)
    name: Optional[str] = doc("Stage name in traces (None: later_chunking(<words>w)).", None)


@dataclass(frozen=True)
class ExtractiveCompressorConfig(StageConfig):
    """Settings of :class:`funnel_core.best_practices.compress.ExtractiveCompressor` (an already loaded
    ``embedder`` object is passed to the stage or adapter beside the config, not in it)."""

    stage_path: ClassVar[str] = "funnel_core.best_practices.compress:ExtractiveCompressor"
    model_keys: ClassVar[tuple[str, ...]] = ("model", "batch_size", "device", "dtype")
    model_attrs: ClassVar[tuple[str, ...]] = ("_embedder", "_cache")

    method: str = doc("embedding (cosine similarity) or bm25 sentence scoring.", "embedding")
    ratio: float = doc("Share of input tokens to keep, in (0, 1].", 0.4)
    max_tokens: Optional[int] = doc("Absolute token budget (the smaller of the two wins).", None)
    scope: str = doc("global (one budget over all units) or unit (one budget per unit).",
                     "global")
    min_sentences: int = doc("Sentences always kept per scope (the best ones).", 1)
    model: Optional[str] = doc("Sentence-embedding model; None = the packaged MiniLM.", None)
    batch_size: int = doc("Sentences per forward pass.", 64)
    device: Optional[str] = doc("Torch device; None = best available.", None)
    cache_size: int = doc("Sentence embeddings kept in an LRU cache (0 = off).", 0)
    name: Optional[str] = doc("Stage name in traces (None: extractive_compressor).", None)
    dtype: str = doc("Precision of the embedding model: auto | float32 | bfloat16 | float16 "
                     "(auto: bf16 autocast only where the hardware runs it natively).", "auto")


@dataclass(frozen=True)
class RepackConfig(StageConfig):
    """Settings of :class:`funnel_core.best_practices.repack.Repack`."""

    stage_path: ClassVar[str] = "funnel_core.best_practices.repack:Repack"
    model_attrs: ClassVar[tuple[str, ...]] = ()

    order: str = doc("forward, reverse (best last, next to the question) or sides.", "reverse")
    name: Optional[str] = doc("Stage name in traces (None: repack).", None)


@dataclass(frozen=True)
class LLMProviderConfig(StageConfig):
    """How an adapter builds its ``funnel_core`` LLM provider when ``llm`` is given as a name (a
    hub name or local folder of a causal LM); ``timeout`` also applies to a framework's model."""

    model_attrs: ClassVar[tuple[str, ...]] = ()
    used_by: ClassVar[str] = "it configures the LLM provider of an adapter; pass it beside the llm"

    timeout: Optional[float] = doc("Seconds per LLM call.", None)
    gguf_file: Optional[str] = doc("GGUF file inside the folder, when llm is a name.", None)
    device: Optional[str] = doc("Torch device of the local model, when llm is a name.", None)

    def provider_kwargs(self, llm: Any) -> dict[str, Any]:
        """Keyword arguments of the adapters' ``as_provider(llm, ...)``."""
        out: dict[str, Any] = {"timeout": self.timeout}
        if isinstance(llm, str):
            out.update(gguf_file=self.gguf_file, device=self.device)
        return out


@dataclass(frozen=True)
class ForwardVariantConfig(LLMProviderConfig):
    """The settings of both frameworks' ``ForwardLookupRetriever`` beside
    :class:`ForwardLookupConfig`: the FB-RAG variant, whose weights ``eta_backward`` and
    ``eta_forward`` override, and the LLM provider (:class:`LLMProviderConfig`)."""

    variant: str = doc("FB (Ours-FB), F (Ours-F) or B (BM25 only).", "FB")
    eta_backward: Optional[float] = doc("Overrides the variant's weight of the backward score.",
                                        None)
    eta_forward: Optional[float] = doc("Overrides the variant's weight of the forward score.",
                                       None)

    def __post_init__(self) -> None:
        super().__post_init__()
        from funnel_core.fbrag import PRESETS

        if self.variant not in PRESETS:
            raise ValueError(f"unknown FB-RAG variant {self.variant!r}; choose one of "
                             f"{sorted(PRESETS)}.")

    def stage_config(self, **settings: Any) -> "ForwardLookupConfig":
        """The :class:`ForwardLookupConfig` of this variant with ``settings`` (its other fields)."""
        from funnel_core.fbrag import variant_config

        return variant_config(self.variant, self.eta_backward, self.eta_forward, **settings)


@dataclass(frozen=True)
class FusionConfig(StageConfig):
    """How hybrid search fuses a sparse and a dense ranking (paper section 3.4.3): the settings of
    :class:`funnel_core.best_practices.fusion.HybridRetrieve` and of both adapters' ``HybridRetriever`` beside
    their two sides (objects, not settings). Not a stage by itself: :meth:`fuse` applies it."""

    model_attrs: ClassVar[tuple[str, ...]] = ()
    used_by: ClassVar[str] = ("it configures a HybridRetrieve (or an adapter's HybridRetriever) "
                              "beside its sparse and dense sides; pass it there")

    alpha: float = doc("Sparse weight in S_h = alpha * S_sparse + S_dense, in [0, 1] "
                       "(method='alpha').", 0.3)
    method: str = doc("alpha (weighted sum of normalised scores) or rrf (reciprocal rank "
                      "fusion).", "alpha")
    normalization: str = doc("Score normalisation of each side for method='alpha': minmax, "
                             "zscore or none.", "minmax")
    rrf_k: int = doc("RRF constant (method='rrf'; Cormack et al.: 60).", 60)

    def __post_init__(self) -> None:
        super().__post_init__()
        from funnel_core.best_practices.fusion import check_fusion_config

        object.__setattr__(self, "alpha", check_fusion_config(self.method, self.alpha,
                                                              self.normalization, self.rrf_k))

    def fuse(self, sparse: Any, dense: Any, k: Optional[int] = None,
             stage: str = "hybrid") -> list:
        """:func:`funnel_core.best_practices.fusion.fuse` of two ranked unit lists with these settings."""
        from funnel_core.best_practices.fusion import fuse

        return fuse(sparse, dense, k=k, stage=stage, **self.kwargs())


@dataclass(frozen=True)
class ClusterRetrievalConfig(StageConfig):
    """How both frameworks' ``ClusteredBM25Retriever`` query a
    :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index` (FunnelRAG's retrieval stage), beside the
    framework's own cap on what is returned (``similarity_top_k`` / ``k``). The index's build
    settings (``max_tokens``, ``adjacency``, ``knn_k``, ``knn_threshold``, BM25) belong to
    the index and pass through to it."""

    model_attrs: ClassVar[tuple[str, ...]] = ()
    used_by: ClassVar[str] = "it configures a ClusteredBM25Retriever over its index; pass it there"

    k_clusters: int = doc("Clusters retrieved by BM25 and opened into their documents.", 10)
    return_clusters: bool = doc("Return the clusters themselves instead of their documents "
                                "(then the framework's cap counts clusters).", False)

    def __post_init__(self) -> None:
        super().__post_init__()
        from funnel_core.errors import check_positive_int

        check_positive_int(self.k_clusters, "k_clusters")

    def clusters_for(self, k: int, k_clusters: Optional[int] = None) -> int:
        """Clusters to retrieve for a call returning at most ``k`` results (``k_clusters``: a
        per-call override); with :attr:`return_clusters` the results are clusters, so ``k``
        caps them too."""
        from funnel_core.errors import check_positive_int

        n = self.k_clusters if k_clusters is None else check_positive_int(k_clusters,
                                                                          "k_clusters")
        return min(n, k) if self.return_clusters else n


@dataclass(frozen=True)
class MultiGranularityConfig(StageConfig):
    """Settings of :class:`funnel_core.granularity.levels.MultiGranularityChunker` (MoG section
    3.2), shared by both frameworks' multi-granularity splitters."""

    stage_path: ClassVar[str] = "funnel_core.granularity.levels:MultiGranularityChunker"
    model_attrs: ClassVar[tuple[str, ...]] = ()

    chunk_size: int = doc("Finest chunk size in words (level 1).", 64)
    n_gra: int = doc("Number of granularity levels; a level-j chunk is two adjacent level-(j-1) "
                     "chunks of the same document.", 5)
    sentence_aware: bool = doc("End finest chunks at sentence ends.", True)


@dataclass(frozen=True)
class GraphGranularityConfig(StageConfig):
    """Settings of :class:`funnel_core.granularity.graph.GraphGranularityBuilder` (MoGG section
    3.3), shared by both frameworks' graph splitters."""

    stage_path: ClassVar[str] = "funnel_core.granularity.graph:GraphGranularityBuilder"
    model_attrs: ClassVar[tuple[str, ...]] = ()

    sentences_per_node: int = doc("Sentences per graph node (1-2 in the paper).", 2)
    n_gra: int = doc("Number of hop ranges (levels) the retriever will use.", 5)
    k_graph: int = doc("Edges per node (its most BM25-similar nodes).", 3)
    t_graph: float = doc("Minimum normalised BM25 similarity of an edge, in [0, 1].", 0.3)
    block_size: int = doc("Nodes scored per block when building the kNN graph (memory bound).",
                          512)
    max_df: Optional[float] = doc("Ignore terms in more than this share of nodes when linking "
                                  "(None: keep all).", None)
    bm25: Optional[dict] = doc("BM25 settings of the similarity (k1, b, ...).", None)


@dataclass(frozen=True)
class MixOfGranularityConfig(StageConfig):
    """Settings of the MoG selection rule
    (:class:`~funnel_core.granularity.retrieval.MixOfGranularityRetrieve`) beside its corpus and
    router, shared by both frameworks' ``MixOfGranularityRetriever``. Build the stage with
    :func:`funnel_core.granularity.retrieval.mog_stage`."""

    model_attrs: ClassVar[tuple[str, ...]] = ()
    used_by: ClassVar[str] = ("the stage needs the corpus units and a router: build it with "
                              "funnel_core.granularity.retrieval.mog_stage(units, router, config)")
    #: Fields whose change needs new per-level BM25 indexes.
    index_keys: ClassVar[tuple[str, ...]] = ("n_gra", "bm25")

    k_r: int = doc("Units BM25 retrieves per level before mixing (paper: 3).", 3)
    normalize: str = doc("Per-level BM25 scores: none (raw, equation 1) or max (divided by the "
                         "level's best).", "none")
    level_margin: float = doc("Prefer a finer level unless a coarser one's router weight is "
                              "higher by more than this, in [0, 1] (0: the paper's argmax).", 0.0)
    n_gra: int = doc("Hop ranges when the units are graph nodes (a hierarchy's levels come from "
                     "its units).", 5)
    bm25: Optional[dict] = doc("BM25 settings of the per-level indexes.", None)

    def __post_init__(self) -> None:
        super().__post_init__()
        from funnel_core.errors import check_positive_int
        from funnel_core.granularity.retrieval import NORMALIZATIONS

        check_positive_int(self.k_r, "k_r")
        check_positive_int(self.n_gra, "n_gra (number of hop ranges)")
        if self.normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got "
                             f"{self.normalize!r}.")
        if not 0.0 <= self.level_margin <= 1.0:
            raise ValueError(f"level_margin must be in [0, 1], got {self.level_margin!r}.")


@dataclass(frozen=True)
class ForwardLookupConfig(StageConfig):
    """Settings of :class:`funnel_core.fbrag.ForwardLookup` (FB-RAG Stages I-III). The light
    LLM (and a ``token_counter``) is passed to the stage beside the config, not in it."""

    stage_path: ClassVar[str] = "funnel_core.fbrag:ForwardLookup"
    model_attrs: ClassVar[tuple[str, ...]] = ()

    eta_backward: float = doc("Weight of the backward score S(C; Q), >= 0.", 0.5)
    eta_forward: float = doc("Weight of the forward score S(C; R, A), >= 0.", 0.5)
    samples: int = doc("K outputs sampled by the light LLM.", 5)
    temperature: float = doc("Sampling temperature.", 1.0)
    top_p: float = doc("Nucleus sampling mass.", 0.9)
    top_k: int = doc("Top-k sampling.", 50)
    max_new_tokens: int = doc("Tokens per sampled output.", 128)
    prompt: Optional[str] = doc("Template with {context} and {question}; None = FORWARD_PROMPT.",
                                None)
    recall_k: int = doc("Stage I chunks the light LLM reads.", 20)
    reader_words: Optional[int] = doc("Cap on the words the light LLM reads.", None)
    k: Optional[int] = doc("Chunks returned (None: up to a budget, or all).", 3)
    budget_words: Optional[int] = doc("Word budget of the selection.", None)
    budget_tokens: Optional[int] = doc("Token budget of the selection.", None)
    order_preserving: bool = doc("Return chunks in their original order.", True)
    normalize: bool = doc("Divide each BM25 vector by its maximum before weighting.", True)
    chunk_words: int = doc("Chunk size in words.", 300)
    bm25: Optional[dict] = doc("BM25 settings of Stage I and the backward score.", None)
    name: Optional[str] = doc("Stage name in traces.", None)


def adapter_base(config_cls: type[StageConfig], base: type, *, exclude: tuple[str, ...] = (),
                 defaults: Optional[dict[str, Any]] = None) -> Any:
    """A pydantic subclass of ``base`` (an adapter base class) whose fields are those of
    ``config_cls``; an adapter class subclasses it and adds nothing but behaviour.

    ``base`` must declare ``config_class: ClassVar``; it is set to ``config_cls``.
    """
    from pydantic import create_model

    model: Any = create_model(f"_{config_cls.__name__}Fields", __base__=base,
                              __module__=base.__module__,
                              **pydantic_fields(config_cls, exclude=exclude, defaults=defaults))
    model.config_class = config_cls  # type: ignore[attr-defined]
    return model


def stage_key(obj: Any, names: Any) -> tuple:
    """A snapshot of ``obj``'s settings ``names`` (identity for unhashable values): an adapter
    without a config rebuilds its stage when this changes."""
    out = []
    for n in names:
        v = getattr(obj, n, None)
        try:
            hash(v)
        except TypeError:
            v = ("id", id(v))
        out.append((n, v))
    return tuple(out)


class ConfiguredAdapter:
    """Mixin of the adapters' pydantic stage wrappers (LlamaIndex postprocessors, LangChain
    compressors): :attr:`stage` is always built from the current field values.

    The pydantic class must declare private attributes ``_stage`` and ``_stage_key``. With a
    ``config_class`` (see :func:`adapter_base`) the stage is :func:`current_stage` of the config;
    otherwise :meth:`_build_stage` runs again whenever a field changed.
    """

    config_class: ClassVar[Optional[type[StageConfig]]] = None
    _stage: Any
    _stage_key: Any

    def _config_values(self) -> dict[str, Any]:
        """The config's settings from this object's fields (override to convert values)."""
        assert self.config_class is not None
        fields = type(self).model_fields  # type: ignore[attr-defined]
        return {n: getattr(self, n) for n in self.config_class.field_names() if n in fields}

    @property
    def config(self) -> StageConfig:
        """The core configuration built from the current field values."""
        if self.config_class is None:
            raise AttributeError(f"{type(self).__name__} has no core config.")
        return self.config_class(**self._config_values())

    def warm_up(self) -> Any:
        """Load the stage's model now and run one dummy batch (see ``Stage.warm_up``); returns self."""
        self.stage.warm_up()
        return self

    def _build_stage(self) -> Any:
        """Build the ``funnel_core`` stage from this object's fields."""
        return current_stage(self.config, self._stage)

    @property
    def stage(self) -> Any:
        """The ``funnel_core`` stage for the current settings."""
        if self.config_class is not None:
            self._stage = self._build_stage()
            return self._stage
        names = [n for n in type(self).model_fields  # type: ignore[attr-defined]
                 if n not in ("callback_manager", "callbacks", "name")]
        key = stage_key(self, names)
        if self._stage is None or key != self._stage_key:
            self._stage, self._stage_key = self._build_stage(), key
        return self._stage
