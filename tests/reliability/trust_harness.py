"""Reliability campaigns for what funnel-rag reads back but did not write in this run.

Each campaign returns a dict of counts, like :mod:`reliability_harness`; the short pytest run
(``test_reliability.py``) and the long run (``run.py``, ``make reliability``) call the same
functions with different sizes.

* :func:`eval_cache_campaign` — the evaluation's output folder and score cache: links, FIFOs and
  ``../`` paths planted where ``funnel eval`` writes; cache records damaged or forged (NaN
  metrics, unknown ids, lists of the wrong length, lines cut short, random bytes changed); the
  corpus, the questions or the system changed after caching. Every run must report exactly what a
  fresh run reports (recomputing what it cannot trust), or refuse with a clear error, and never
  touch a file outside its folder nor block on a FIFO.
* :func:`export_cache_campaign` — the cross-encoder's ONNX export cache: ``model.onnx`` swapped for
  another model's, the export's or the model's tokenizer edited, weights replaced by others of the
  same size under the same modification time, a link or a FIFO planted as an export file, the
  manifest damaged. The ONNX scores must equal the torch fp32 scores of the model as it is now
  (the export rebuilt) or the load must refuse; never scores of another model.
* :func:`filter_campaign` — random construction filters x random per-call filters (empty, blank,
  dicts, LlamaIndex ``MetadataFilters`` (empty ones too), LangChain ``Comparison``/``Operation``,
  Milvus expressions, predicates) through the BM25 and clustered retrievers of both frameworks,
  in memory and on Milvus Lite, and save/load of every filter kind. A result outside the
  construction filter is a widening (must be 0); one outside the per-call filter is an ignored
  filter; an unpersistable filter must make the save refuse.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import random
import shutil
import signal
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

#: Errors that count as a clear refusal (a funnel-rag error, or a ValueError/TypeError naming the fix).
CLEAR = (ValueError, TypeError, LookupError, OSError)


def _clear_error(exc: BaseException) -> bool:
    """A refusal a user can act on: one of ours, or a standard error with a message (not a
    RecursionError, KeyError, AttributeError, JSONDecodeError from deep inside, nor pymilvus's)."""
    from funnel_core.errors import FunnelError

    if isinstance(exc, FunnelError):
        return True
    if type(exc).__module__.startswith(("pymilvus", "grpc", "json")):
        return False
    return isinstance(exc, CLEAR) and not isinstance(exc, (KeyError, IndexError)) and len(str(exc)) > 20


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise TimeoutError when the body blocks (a FIFO opened for reading) for ``seconds``."""
    def alarm(signum: int, frame: Any) -> None:
        raise TimeoutError("blocked (a FIFO?)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# == (c) filters narrow, never widen =============================================================
TENANTS = ("acme", "globex", "initech")
TAGS = ("x", "y", "z")
FILTER_QUERY = "quarterly report"


def _filter_rows(n: int = 24) -> list[tuple[str, str, dict[str, Any]]]:
    """Documents that all match the query (so ranking never hides one), with metadata of every
    scalar kind: strings, negative ints, floats, lists; some documents lack a key."""
    rows = []
    words = ["revenue", "budget", "board", "growth", "churn", "roadmap"]
    for i in range(n):
        meta: dict[str, Any] = {"tenant": TENANTS[i % 3], "tags": [TAGS[i % 3], TAGS[(i // 3) % 3]],
                                "score": round(-1.5 + 0.25 * i, 2)}
        if i % 5:
            meta["n"] = (i % 7) - 3  # -3 .. 3; every fifth document has no "n"
        rows.append((f"d{i}", f"quarterly report on {words[i % 6]} and {words[(i * 5) % 6]}", meta))
    return rows


_MISSING = object()


def _cmp(op: str, value: Any, wanted: Any) -> bool:
    """LlamaIndex / LangChain comparison semantics (the reference): a missing key passes only
    ``ne``/``nin``; values of another type fail."""
    if value is _MISSING:
        return op in ("ne", "nin")
    try:
        if op == "eq":
            return bool(value == wanted)
        if op == "ne":
            return bool(value != wanted)
        if op in ("gt", "gte", "lt", "lte"):
            if isinstance(value, (list, str)) != isinstance(wanted, (list, str)):
                return False
            return bool({"gt": value > wanted, "gte": value >= wanted, "lt": value < wanted,
                         "lte": value <= wanted}[op])
        if op == "in":
            return value in wanted
        if op == "nin":
            return value not in wanted
        if op == "contains":
            return isinstance(value, list) and wanted in value
    except TypeError:
        return False
    raise AssertionError(op)


def _dict_ref(d: dict[str, Any]) -> Callable[[dict], bool]:
    def ok(m: dict) -> bool:
        for key, wanted in d.items():
            v = m.get(key)
            wants = wanted if isinstance(wanted, list) else [wanted]
            vals = v if isinstance(v, list) else [v]
            if not any(x == w for x in vals for w in wants):
                return False
        return True
    return ok


_OPS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains")


def _random_comparison(rng: random.Random) -> tuple[str, str, Any]:
    key = rng.choice(["tenant", "n", "tags", "score"])
    op = rng.choice(_OPS)
    pools = {"tenant": list(TENANTS) + ["nobody"], "n": list(range(-4, 5)), "tags": list(TAGS),
             "score": [-1.5, -0.5, 0.0, 0.75, 2.25]}
    pool = pools[key]
    if op in ("in", "nin"):
        value: Any = rng.sample(pool, rng.randint(1, 3))
    elif op == "contains":
        key, value = "tags", rng.choice(TAGS)
    else:
        value = rng.choice(pool)
    return key, op, value


def _random_filter(rng: random.Random, allow_empty: bool = True,
                   kind: str | None = None) -> tuple[str, Any, Callable[[dict], bool] | None]:
    """(kind, spec, reference predicate); ``None`` reference: adds nothing."""
    kinds = ["dict", "dict", "li", "lc", "expr", "pred"] + (["empty"] * 2 if allow_empty else [])
    kind = kind or rng.choice(kinds)
    if kind == "mask":  # a boolean array over the indexed units, in their order
        t = rng.choice(TENANTS)
        return "mask", t, lambda m, t=t: m.get("tenant") != t
    if kind == "empty":
        return "empty", rng.choice([None, {}, "", "   ", "\n\t", "li-empty"]), None
    if kind == "dict":
        d: dict[str, Any] = {}
        for _ in range(rng.randint(1, 2)):
            key = rng.choice(["tenant", "n", "tags"])
            pool = {"tenant": list(TENANTS), "n": [-3, -1, 0, 2, 3, None], "tags": list(TAGS)}[key]
            d[key] = rng.choice(pool) if rng.random() < 0.6 else rng.sample(pool, 2)
        return "dict", d, _dict_ref(d)
    if kind == "pred":
        t = rng.choice(TENANTS)
        return "pred", t, lambda m, t=t: m.get("tenant") != t
    if kind == "expr":  # a Milvus expression string and its Python meaning
        lo = rng.randint(-3, 2)
        t = rng.choice(TENANTS)
        return "expr", f'metadata["n"] >= {lo} or metadata["tenant"] == "{t}"', \
            lambda m, lo=lo, t=t: (("n" in m and m["n"] >= lo) or m.get("tenant") == t)
    parts = [_random_comparison(rng) for _ in range(rng.randint(1, 3))]
    cond = rng.choice(["and", "or"]) if len(parts) > 1 else "and"
    refs = [lambda m, k=k, o=o, v=v: _cmp(o, m.get(k, _MISSING), v) for k, o, v in parts]
    ref = (lambda m: all(r(m) for r in refs)) if cond == "and" else (lambda m: any(r(m) for r in refs))
    if kind == "lc" and len(parts) == 1 and rng.random() < 0.3:  # NOT of one comparison
        return "lc", ("not", parts), lambda m: not refs[0](m)
    return kind, (cond, parts), ref


def _render(kind: str, spec: Any, framework: str, where: str) -> tuple[Any, bool]:
    """The filter object for ``framework`` and whether a clear refusal is the right answer."""
    if kind == "empty":
        if spec == "li-empty":
            if framework != "llamaindex":
                return None, False
            from llama_index.core.vector_stores.types import MetadataFilters

            return MetadataFilters(filters=[]), False
        return spec, False
    if kind == "dict":
        return copy.deepcopy(spec), False
    if kind == "pred":
        return (lambda m, t=spec: m.get("tenant") != t), where == "milvus"
    if kind == "mask":
        import numpy as np

        return np.array([m.get("tenant") != spec for _, _, m in _filter_rows()]), where == "milvus"
    if kind == "expr":
        return spec, where == "memory"
    cond, parts = spec  # "li" / "lc": one spec, written in the framework's own filter objects
    if framework == "llamaindex":
        from llama_index.core.vector_stores.types import (
            FilterCondition,
            FilterOperator,
            MetadataFilter,
            MetadataFilters,
        )

        ops = {"eq": "==", "ne": "!=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<=", "in": "in",
               "nin": "nin", "contains": "contains"}
        filters = []
        for k, o, v in parts:
            try:
                filters.append(MetadataFilter(key=k, value=v, operator=FilterOperator(ops[o])))
            except Exception:  # LlamaIndex's strict value types: built unvalidated
                filters.append(MetadataFilter.model_construct(key=k, value=v, operator=FilterOperator(ops[o])))
        condition = {"and": FilterCondition.AND, "or": FilterCondition.OR, "not": FilterCondition.NOT}[cond]
        return MetadataFilters(filters=filters, condition=condition), False
    from langchain_core.structured_query import Comparator, Comparison, Operation, Operator

    comps = {"eq": Comparator.EQ, "ne": Comparator.NE, "gt": Comparator.GT, "gte": Comparator.GTE,
             "lt": Comparator.LT, "lte": Comparator.LTE, "in": Comparator.IN, "nin": Comparator.NIN,
             "contains": Comparator.CONTAIN}
    args = [Comparison(comparator=comps[o], attribute=k, value=v) for k, o, v in parts]
    op = {"and": Operator.AND, "or": Operator.OR, "not": Operator.NOT}[cond]
    directive = args[0] if len(args) == 1 and cond != "not" else Operation(operator=op, arguments=args)
    return directive, where == "memory"  # structured queries are pushed down to Milvus only


def _filter_retrievers(db: str) -> list[tuple[str, str, str, Any]]:
    """(framework, kind, where, retriever) for BM25 and clustered, both frameworks, memory and Milvus."""
    from langchain_core.documents import Document
    from llama_index.core.schema import TextNode

    from funnel_core.backends.milvus import MilvusBackend
    from langchain_funnel.retrievers import BM25Retriever as LCBM25
    from langchain_funnel.retrievers import ClusteredBM25Retriever as LCClustered
    from llama_index_funnel.retrievers import BM25Retriever as LIBM25
    from llama_index_funnel.retrievers import ClusteredBM25Retriever as LIClustered

    rows = _filter_rows()
    n = len(rows)
    out = []
    for where in ("memory", "milvus"):
        def backend(name: str, where: str = where) -> Any:
            return None if where == "memory" else MilvusBackend(db, collection=name)

        docs = [Document(id=i, page_content=t, metadata=dict(m)) for i, t, m in rows]
        nodes = [TextNode(id_=i, text=t, metadata=dict(m)) for i, t, m in rows]
        out += [
            ("langchain", "bm25", where, LCBM25.from_documents(docs, k=n, backend=backend("f_lc_bm25"))),
            ("langchain", "clustered", where, LCClustered.from_documents(
                docs, k=n, k_clusters=n, backend=backend("f_lc_cl"), max_tokens=16)),
            ("llamaindex", "bm25", where, LIBM25.from_defaults(nodes=nodes, similarity_top_k=n,
                                                                backend=backend("f_li_bm25"))),
            ("llamaindex", "clustered", where, LIClustered.from_defaults(
                nodes=nodes, similarity_top_k=n, backend=backend("f_li_cl"), max_tokens=16)),
        ]
    return out


def _ask(framework: str, r: Any, floor: Any, call: Any, k: int) -> list[str]:
    if framework == "langchain":
        rr = r.model_copy(update={"filter": floor})
        return [d.id for d in rr.invoke(FILTER_QUERY, filter=call, k=k)]
    old = r.filters
    r.filters = floor
    try:
        return [n.node.node_id for n in r.search(FILTER_QUERY, filters=call, k=k)]
    finally:
        r.filters = old


def filter_campaign(trials: int = 400, save_trials: int = 24, seed: int = 0,
                    workdir: Path | None = None) -> dict[str, Any]:
    """Random floors x random per-call filters over 8 retrievers, then save/load of floors."""
    import logging

    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)  # a refused expression is counted, not logged
    rng = random.Random(seed)
    tmp = Path(workdir or tempfile.mkdtemp())
    tmp.mkdir(parents=True, exist_ok=True)
    retrievers = _filter_retrievers(str(tmp / "filters.db"))
    meta = {i: m for i, _, m in _filter_rows()}
    n = len(meta)
    c = {"trials": 0, "ok": 0, "refused_as_expected": 0, "widened": 0, "call_ignored": 0, "wrong": 0,
         "unexpected_errors": 0, "save_trials": 0, "saved_and_kept_floor": 0, "unsaveable_refused": 0,
         "unsaveable_saved": 0, "by_kind": {}}
    examples: list[str] = []

    def judge(label: str, run: Callable[[], list[str]], ref_floor: Any, ref_call: Any, expect_refusal: bool,
              exact: bool) -> None:
        c["trials"] += 1
        slot = c["by_kind"].setdefault(label, {"trials": 0, "bad": 0})
        slot["trials"] += 1
        try:
            ids = run()
        except Exception as exc:
            if expect_refusal and _clear_error(exc):
                c["refused_as_expected"] += 1
                return
            c["unexpected_errors"] += 1
            slot["bad"] += 1
            examples.append(f"{label}: {type(exc).__name__}: {str(exc)[:160]}")
            return
        if expect_refusal:  # it ran: it must still not widen (a refusal was allowed, not required)
            pass
        floor_ok = [i for i in ids if ref_floor is None or ref_floor(meta[i])]
        bad = False
        if len(floor_ok) != len(ids):
            c["widened"] += 1
            bad = True
        if any(ref_call is not None and not ref_call(meta[i]) for i in ids):
            c["call_ignored"] += 1
            bad = True
        want = {i for i, m in meta.items() if (ref_floor is None or ref_floor(m)) and (ref_call is None or ref_call(m))}
        if exact and not bad and set(ids) != want:
            c["wrong"] += 1
            bad = True
        if bad:
            slot["bad"] += 1
            examples.append(f"{label}: got {sorted(ids)[:8]} want {sorted(want)[:8]}")
        else:
            c["ok"] += 1

    for _ in range(trials):
        framework, kind, where, r = rng.choice(retrievers)
        fk, fspec, fref = _random_filter(rng, allow_empty=rng.random() < 0.2)
        ck, cspec, cref = _random_filter(rng)
        floor, floor_refused = _render(fk, fspec, framework, where)
        call, call_refused = _render(ck, cspec, framework, where)
        if floor is None and fk not in ("empty",):
            fref = None  # a kind this framework does not have: no floor
        if call is None and ck not in ("empty",):
            cref = None
        label = f"{framework}/{kind}/{where}: floor {fk} x call {ck}"
        judge(label, functools.partial(_ask, framework, r, floor, call, n), fref, cref,
              floor_refused or call_refused, exact=kind == "bm25")

    # save/load of every filter kind on every retriever: a persisted floor is still a floor; an
    # unpersistable one (a predicate, a boolean mask) makes the save refuse
    combos = [(ret, fk) for fk in ("dict", "li", "lc", "expr", "pred", "mask") for ret in retrievers]
    for t in range(save_trials):
        (framework, kind, where, r), fk = combos[t % len(combos)]
        fk, fspec, fref = _random_filter(rng, allow_empty=False, kind=fk)
        floor, refused = _render(fk, fspec, framework, where)
        if floor is None or refused or (fk == "mask" and kind != "bm25"):
            continue  # a kind this backend refuses at search; a mask aligns with BM25's units only
        c["save_trials"] += 1
        folder = tmp / f"saved{t}"
        try:
            if framework == "langchain":
                r.model_copy(update={"filter": floor}).save(folder)
                again = type(r).load(folder, backend=None if where == "memory" else _backend_of(r))
            else:
                old, r.filters = r.filters, floor
                try:
                    r.persist(str(folder))
                finally:
                    r.filters = old
                again = type(r).from_persist_dir(str(folder), backend=None if where == "memory" else _backend_of(r))
        except ValueError as exc:
            if fk in ("pred", "mask") and "cannot be saved" in str(exc):
                c["unsaveable_refused"] += 1
            else:
                c["unexpected_errors"] += 1
                examples.append(f"save {framework}/{kind}/{where} {fk}: {exc}"[:200])
            continue
        if fk in ("pred", "mask"):
            c["unsaveable_saved"] += 1
            examples.append(f"save {framework}/{kind}/{where}: a {fk} floor was saved")
            continue
        floor_after = again.filter if framework == "langchain" else again.filters
        before = c["widened"] + c["call_ignored"] + c["wrong"] + c["unexpected_errors"]
        for _ in range(3):
            ck, cspec, cref = _random_filter(rng)
            call, call_refused = _render(ck, cspec, framework, where)
            if call is None and ck != "empty":
                cref = None
            judge(f"after save {framework}/{kind}/{where}: floor {fk} x call {ck}",
                  functools.partial(_ask, framework, again, floor_after, call, n), fref, cref, call_refused,
                  exact=kind == "bm25")
        if c["widened"] + c["call_ignored"] + c["wrong"] + c["unexpected_errors"] == before:
            c["saved_and_kept_floor"] += 1
    c["examples"] = examples[:10]
    c["bad"] = c["widened"] + c["call_ignored"] + c["wrong"] + c["unexpected_errors"] + c["unsaveable_saved"]
    if workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return c


def _backend_of(r: Any) -> Any:
    from funnel_core.backends.milvus import MilvusBackend

    index = r.index
    return MilvusBackend(index.uri, collection=index.collection)


# == (a) the evaluation's output folder and score cache ==========================================
EVAL_DOCS = [{"id": f"d{i}", "text": t, "title": t.split()[0]} for i, t in enumerate([
    "Paris is the capital of France and its largest city.", "Berlin is the capital of Germany.",
    "Rome is the capital of Italy, on the Tiber.", "Madrid is the capital of Spain.",
    "Lisbon is the capital of Portugal, on the Atlantic.", "Vienna is the capital of Austria.",
    "The Seine flows through Paris.", "The Spree flows through Berlin.",
    "Hamlet is a tragedy by Shakespeare.", "BM25 ranks documents by term frequency and length."])]
EVAL_QUESTIONS = [
    {"id": "q1", "question": "capital of France", "answers": ["Paris"], "relevant": ["d0"]},
    {"id": "q2", "question": "capital of Germany", "answers": ["Berlin"], "relevant": ["d1"]},
    {"id": "q3", "question": "capital of Italy", "answers": ["Rome"], "relevant": ["d2"]},
    {"id": "q4", "question": "river through Paris", "answers": ["Seine"], "relevant": ["d6"]},
    {"id": "q5", "question": "who wrote Hamlet", "answers": ["Shakespeare"], "relevant": ["d8"]},
    {"id": "q6", "question": "how does BM25 rank documents", "answers": ["term frequency"], "relevant": ["d9"]}]


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _eval_folder(folder: Path, *, docs: list[dict] | None = None, questions: list[dict] | None = None,
                 k: int = 2, output: str = "out") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    _jsonl(folder / "docs.jsonl", docs or EVAL_DOCS)
    _jsonl(folder / "questions.jsonl", questions or EVAL_QUESTIONS)
    cfg = folder / "eval.toml"
    cfg.write_text(f'[dataset]\npath = "questions.jsonl"\ncorpus = "docs.jsonl"\n\n'
                   f'[evaluate]\nmetrics = ["AR@1", "AR@2", "ndcg@2", "CI@2"]\nn_timing = 0\nn_boot = 50\n'
                   f'output = "{output}"\n\n[systems.bm25]\ncomponent = "bm25"\nk = {k}\n', encoding="utf-8")
    return cfg


def _run(cfg: Path, **kw: Any) -> Any:
    from funnel_core.evaluation.config import run_config

    with warnings.catch_warnings(record=True) as seen, _deadline(30):
        warnings.simplefilter("always")
        report, _ = run_config(cfg, progress=False, **kw)
    return report, [str(w.message) for w in seen]


def _cache_file(folder: Path) -> Path:
    (path,) = (folder / "out" / "cache").glob("*.jsonl")
    return path


def _damage_cache(path: Path, rng: random.Random) -> str:
    """One random damage of a score cache file; returns its name."""
    lines = path.read_text(encoding="utf-8").splitlines()
    head, recs = lines[0], [json.loads(x) for x in lines[1:]]
    i = rng.randrange(len(recs))
    how = rng.choice(["nan_metric", "inf_metric", "unknown_id", "ranked_too_long", "ranked_repeated",
                      "metric_missing", "metric_out_of_range", "truncated_line", "truncated_file",
                      "random_byte", "deep_nesting", "duplicate_record", "header_edited", "not_utf8",
                      "counts_negative", "ranked_not_strings"])
    rec = recs[i]
    if how == "nan_metric":
        rec["metrics"][rng.choice(sorted(rec["metrics"]))] = float("nan")
    elif how == "inf_metric":
        rec["metrics"][rng.choice(sorted(rec["metrics"]))] = float("inf")
    elif how == "unknown_id":
        rec["id"] = f"q-forged-{rng.randrange(100)}"
    elif how == "ranked_too_long":
        rec["ranked"] = rec["ranked"] + [f"d{j}" for j in range(5) if f"d{j}" not in rec["ranked"]]
    elif how == "ranked_repeated":
        rec["ranked"] = [rec["ranked"][0]] * 2
    elif how == "metric_missing":
        rec["metrics"].pop(rng.choice(sorted(rec["metrics"])))
    elif how == "metric_out_of_range":
        rec["metrics"]["AR@1"] = 7
    elif how == "duplicate_record":
        recs.append(dict(rec))
    elif how == "counts_negative":
        rec["counts"] = {"pairs": -3}
    elif how == "ranked_not_strings":
        rec["ranked"] = [[d] for d in rec["ranked"]]
    text = "\n".join([head] + [json.dumps(r) for r in recs]) + "\n"
    data = text.encode("utf-8")
    if how == "truncated_line":
        cut = text.index("\n", len(head) + 1)  # inside the first record
        data = (text[: rng.randrange(len(head) + 2, cut)] + "\n" + text[cut + 1:]).encode("utf-8")
    elif how == "truncated_file":
        data = data[: rng.randrange(1, len(data))]
    elif how == "random_byte":
        pos = rng.randrange(len(data))
        data = data[:pos] + bytes([rng.randrange(32, 127)]) + data[pos + 1:]
    elif how == "deep_nesting":
        data = (head + "\n" + "[" * 50_000 + "\n").encode("utf-8") + data[len(head) + 1:]
    elif how == "header_edited":
        data = (head.replace('"depth": 2', '"depth": 3') + text[len(head):]).encode("utf-8")
    elif how == "not_utf8":
        data = data.replace(b'"ranked"', b'"r\xff\xfeked"', 1)
    path.write_bytes(data)
    return how


def eval_cache_campaign(trials: int = 40, seed: int = 0, workdir: Path | None = None,
                        kinds: list[str] | None = None) -> dict[str, Any]:
    """Plant, damage, forge and change what ``funnel eval`` reads back; see the module docstring.

    Outcomes per trial: ``same`` (the report equals a fresh run's), ``refused`` (a clear error,
    where refusing is right: a link or FIFO where the cache or the output folder must be, a
    ``../`` output), and the bad ones: ``silent`` (another report and no warning: a damaged or
    stale record reported), ``wrong_with_warning`` (another report despite a warning),
    ``raw_errors`` (JSONDecodeError, RecursionError, KeyError, ...), ``outside_touched`` (a file
    outside the folder written or removed), ``blocked`` (a FIFO blocked the run)."""
    rng = random.Random(seed)
    tmp = Path(workdir or tempfile.mkdtemp())
    tmp.mkdir(parents=True, exist_ok=True)
    c = {"trials": 0, "same": 0, "refused": 0, "recomputed_with_warning": 0, "silent": 0,
         "wrong_with_warning": 0, "raw_errors": 0, "outside_touched": 0, "blocked": 0, "by_kind": {}}
    examples: list[str] = []
    fresh_cache: dict[str, Any] = {}

    def fresh(key: str, cfg: Path) -> Any:
        """The report of a run with an empty cache and a new output folder (the reference)."""
        if key not in fresh_cache:
            ref_dir = tmp / f"ref-{len(fresh_cache)}"
            fresh_cache[key] = _run(cfg, output=ref_dir / "out", cache_dir=ref_dir / "cache")[0].per_question
        return fresh_cache[key]

    kinds = kinds or ["cache_damage"] * 6 + ["corpus_changed", "questions_changed", "system_changed",
                                    "link_as_report", "link_as_cache_file", "fifo_as_cache_file",
                                    "fifo_as_report", "dotdot_output", "linked_output_folder",
                                    "linked_cache_folder"]
    for t in range(trials):
        kind = rng.choice(kinds)
        folder = tmp / f"t{t}"
        cfg = _eval_folder(folder)
        victim = tmp / f"victim{t}.txt"
        victim.write_text("a user's file outside the evaluation folder\n")
        elsewhere = tmp / f"elsewhere{t}"
        elsewhere.mkdir()
        c["trials"] += 1
        slot = c["by_kind"].setdefault(kind, {"trials": 0, "bad": 0})
        slot["trials"] += 1
        refusal_ok = False
        detail = kind
        try:
            _run(cfg)  # a first run fills the cache
            want_key = "base"
            if kind == "cache_damage":
                detail = f"cache_damage/{_damage_cache(_cache_file(folder), rng)}"
            elif kind == "corpus_changed":
                docs = [dict(d) for d in EVAL_DOCS]
                docs[0]["text"] = "Lyon is a large city of France."  # "Paris" gone
                _jsonl(folder / "docs.jsonl", docs)
                want_key = "corpus"
            elif kind == "questions_changed":
                qs = [dict(q) for q in EVAL_QUESTIONS]
                qs[1]["answers"] = ["Bonn"]
                _jsonl(folder / "questions.jsonl", qs)
                want_key = "questions"
            elif kind == "system_changed":
                cfg.write_text(cfg.read_text().replace("k = 2", "k = 1"))
                want_key = "k1"
            elif kind == "link_as_report":
                name = rng.choice(["report.json", "report.md", "pareto.png"])
                (folder / "out" / name).unlink()
                (folder / "out" / name).symlink_to(victim)
            elif kind == "link_as_cache_file":
                p = _cache_file(folder)
                p.unlink()
                p.symlink_to(victim)
                refusal_ok = True
            elif kind == "fifo_as_cache_file":
                p = _cache_file(folder)
                p.unlink()
                os.mkfifo(p)
                refusal_ok = True
            elif kind == "fifo_as_report":
                (folder / "out" / "report.md").unlink()
                os.mkfifo(folder / "out" / "report.md")
                refusal_ok = True
            elif kind == "dotdot_output":
                cfg.write_text(cfg.read_text().replace('output = "out"', f'output = "../{elsewhere.name}/out"'))
                refusal_ok = True
            elif kind == "linked_output_folder":
                shutil.rmtree(folder / "out")
                (folder / "out").symlink_to(elsewhere)
                refusal_ok = True
            elif kind == "linked_cache_folder":
                shutil.rmtree(folder / "out" / "cache")
                (folder / "out" / "cache").symlink_to(elsewhere)
                refusal_ok = True
            if want_key == "base":
                want = fresh("base", _eval_folder(tmp / "base"))
            else:
                want = fresh(want_key, cfg)
            report, seen = _run(cfg)
        except TimeoutError:
            c["blocked"] += 1
            slot["bad"] += 1
            examples.append(f"{detail}: blocked")
            continue
        except Exception as exc:
            if refusal_ok and _clear_error(exc):
                c["refused"] += 1
            else:
                c["raw_errors"] += 1
                slot["bad"] += 1
                examples.append(f"{detail}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        finally:
            touched = victim.read_text() != "a user's file outside the evaluation folder\n" or any(elsewhere.iterdir())
            if touched:
                c["outside_touched"] += 1
                slot["bad"] += 1
                examples.append(f"{detail}: wrote outside its folder")
        if report.per_question == want:
            c["same"] += 1
            if seen and any("recomput" in s for s in seen):
                c["recomputed_with_warning"] += 1
        elif seen:
            c["wrong_with_warning"] += 1
            slot["bad"] += 1
            examples.append(f"{detail}: another report (warned: {seen[0][:100]})")
        else:
            c["silent"] += 1
            slot["bad"] += 1
            examples.append(f"{detail}: another report, no warning")
    c["examples"] = examples[:10]
    c["bad"] = c["silent"] + c["wrong_with_warning"] + c["raw_errors"] + c["outside_touched"] + c["blocked"]
    if workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return c


# == (b) the cross-encoder's ONNX export cache ====================================================
EXPORT_QUERY = "what makes clouds produce rain"
EXPORT_TEXTS = ["rain forms when droplets in clouds grow heavy and fall", "the cat sat on the mat",
                "clouds", "a passage about rainfall and storms in summer",
                "droplets grow by collision and coalescence until they fall as rain"]


def _ce_scores(model: str, runtime: str) -> list[float]:
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    kw = {"dtype": "float32"} if runtime == "torch" else {}
    return CrossEncoderScorer(model, library="transformers", runtime=runtime, max_length=48,
                              batch_size=4, **kw).score(EXPORT_QUERY, EXPORT_TEXTS)


def _same_stat_edit(path: Path, edit: Callable[[Path], None]) -> None:
    """Edit ``path`` in place keeping its size, then set its mtime back (as ``cp -p`` would)."""
    st = path.stat()
    edit(path)
    if path.stat().st_size != st.st_size:
        raise AssertionError(f"the edit changed the size of {path}")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _perturb(folder: Path, amount: float) -> None:
    from safetensors.torch import load_file, save_file

    def edit(p: Path) -> None:
        tensors = load_file(str(p))
        for key in tensors:
            if key.startswith("classifier") or "dense.weight" in key:
                tensors[key] = tensors[key] + amount
        save_file(tensors, str(p), metadata={"format": "pt"})

    _same_stat_edit(folder / "model.safetensors", edit)


def _amplify(folder: Path) -> None:
    """Scale the tiny random model's classifier by 1000: its scores then differ between texts
    (and between tokenizers) by far more than ONNX and torch differ (about 6e-6 here), so a stale
    export cannot pass for a rebuilt one within the campaign's 1e-4."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    tensors["classifier.weight"] = tensors["classifier.weight"] * 1000
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _swap_ids(path: Path, rng: random.Random) -> None:
    """Swap the ids of two vocabulary entries whose ids have as many digits (same size)."""
    def edit(p: Path) -> None:
        data = json.loads(p.read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        words = [w for w, i in vocab.items() if w.isascii() and w.isalpha() and 1000 <= i < 10000]
        used = sorted({w for t in [EXPORT_QUERY, *EXPORT_TEXTS] for w in t.split()} & set(words))
        a = rng.choice(used)  # a word the scored texts hold: the edit changes their scores
        b = rng.choice([w for w in words if w != a])
        # a list of swaps keyed by the word: the JSON text keeps its length
        text = p.read_text(encoding="utf-8")
        sa, sb = json.dumps(a) + ":" + str(vocab[a]), json.dumps(b) + ":" + str(vocab[b])
        if sa not in text:  # the indented JSON transformers writes
            sa, sb = sa.replace(":", ": "), sb.replace(":", ": ")
        if sa not in text or sb not in text:
            raise AssertionError("vocabulary entries not found verbatim")
        text = text.replace(sa, "\0A", 1).replace(sb, "\0B", 1)
        text = text.replace("\0A", sa.replace(str(vocab[a]), str(vocab[b]))).replace(
            "\0B", sb.replace(str(vocab[b]), str(vocab[a])))
        p.write_text(text, encoding="utf-8")

    _same_stat_edit(path, edit)


def export_cache_campaign(trials: int = 16, seed: int = 0, workdir: Path | None = None) -> dict[str, Any]:
    """Tamper with a tiny cross-encoder and its ONNX export, then score with ``runtime="onnx"``.

    Outcomes: ``same`` (the ONNX scores equal the torch fp32 scores of the model as it is now),
    ``refused`` (a clear error), ``reused`` (an untouched export was used again, not rebuilt);
    bad: ``silent`` (other scores: a stale or foreign export used), ``raw_errors``, ``blocked``."""
    from transformers.utils import logging as hf_logging

    from funnel_core.rerank import runtimes
    from funnel_core.testing import tiny_cross_encoder

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per trial
    rng = random.Random(seed)
    tmp = Path(workdir or tempfile.mkdtemp())
    tmp.mkdir(parents=True, exist_ok=True)
    base = Path(tiny_cross_encoder(tmp / "built"))
    model, pristine, other = tmp / "ce", tmp / "pristine", tmp / "other"
    shutil.copytree(base, model, ignore=shutil.ignore_patterns("funnel_onnx", ".complete"))
    _amplify(model)
    shutil.copytree(model, other)
    _ce_scores(str(model), "onnx")  # the export every trial starts from
    shutil.copytree(model, pristine)
    _perturb(other, 0.5)
    other_scores = _ce_scores(str(other), "onnx")  # another model's export
    export = model / runtimes.EXPORT_SUBDIR
    c = {"trials": 0, "same": 0, "reused": 0, "refused": 0, "silent": 0, "raw_errors": 0, "blocked": 0,
         "foreign_scores": 0, "by_kind": {}}
    examples: list[str] = []
    kinds = ["untouched", "swapped_model_onnx", "linked_model_onnx", "fifo_model_onnx",
             "edited_export_tokenizer", "edited_model_tokenizer_same_stat", "same_size_same_mtime_weights",
             "garbage_manifest", "truncated_model_onnx", "extra_tokenizer_file_dropped_in"]
    for t in range(trials):
        kind = kinds[t % len(kinds)] if t < len(kinds) else rng.choice(kinds)
        shutil.rmtree(model)
        shutil.copytree(pristine, model)  # the same path: the pristine export is valid again
        onnx_before = os.stat(export / "model.onnx").st_ino
        if kind == "swapped_model_onnx":
            shutil.copy2(other / runtimes.EXPORT_SUBDIR / "model.onnx", export / "model.onnx")
        elif kind == "linked_model_onnx":
            (export / "model.onnx").unlink()
            (export / "model.onnx").symlink_to(other / runtimes.EXPORT_SUBDIR / "model.onnx")
        elif kind == "fifo_model_onnx":
            (export / "model.onnx").unlink()
            os.mkfifo(export / "model.onnx")
        elif kind == "edited_export_tokenizer":
            _swap_ids(export / runtimes.TOKENIZER_FILE, rng)
        elif kind == "edited_model_tokenizer_same_stat":
            _swap_ids(model / "tokenizer.json", rng)
        elif kind == "same_size_same_mtime_weights":
            _perturb(model, rng.choice([0.25, -0.25, 0.5]))
        elif kind == "garbage_manifest":
            raw = (export / runtimes.MANIFEST).read_bytes()
            (export / runtimes.MANIFEST).write_bytes(raw[: rng.randrange(len(raw))])
        elif kind == "truncated_model_onnx":
            raw = (export / "model.onnx").read_bytes()
            (export / "model.onnx").write_bytes(raw[: len(raw) // 2])
        elif kind == "extra_tokenizer_file_dropped_in":
            (export / runtimes.TOKENIZER_SETTINGS).unlink()
            (export / runtimes.TOKENIZER_SETTINGS).write_text(json.dumps({"pad_id": 7}))
        c["trials"] += 1
        slot = c["by_kind"].setdefault(kind, {"trials": 0, "bad": 0})
        slot["trials"] += 1
        try:
            want = _ce_scores(str(model), "torch")
            with _deadline(120):
                got = _ce_scores(str(model), "onnx")
        except TimeoutError:
            c["blocked"] += 1
            slot["bad"] += 1
            examples.append(f"{kind}: blocked")
            continue
        except Exception as exc:
            if _clear_error(exc):
                c["refused"] += 1
            else:
                c["raw_errors"] += 1
                slot["bad"] += 1
                examples.append(f"{kind}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        if all(abs(a - b) <= 1e-4 for a, b in zip(got, want)) and len(got) == len(want):
            c["same"] += 1
            if kind == "untouched" and os.stat(export / "model.onnx").st_ino == onnx_before:
                c["reused"] += 1
        else:
            c["silent"] += 1
            slot["bad"] += 1
            if all(abs(a - b) <= 1e-4 for a, b in zip(got, other_scores)):
                c["foreign_scores"] += 1
            examples.append(f"{kind}: onnx {[round(x, 4) for x in got[:3]]} torch {[round(x, 4) for x in want[:3]]}")
    c["examples"] = examples[:10]
    c["bad"] = c["silent"] + c["raw_errors"] + c["blocked"]
    if workdir is None:
        shutil.rmtree(tmp, ignore_errors=True)
    return c
