"""``evaluate(systems, dataset) -> Report``: quality with intervals and paired tests, and cost
(seconds, model calls, pairs scored, LLM tokens) measured so a reader can trust it.

The run has two phases:

1. **Quality**: every system answers every labelled question (in file order). Per question the
   harness keeps the top ``depth`` document ids, the answer-recall and contextual-integrity
   values, and what the stages counted while it ran (:mod:`funnel_core.counters`: reranker calls
   and (query, text) pairs, LLM prompts and tokens). With ``cache_dir`` every finished question is
   appended to ``<cache_dir>/<system>.jsonl`` first, so an interrupted run resumes where it
   stopped. nDCG / Recall / MRR are computed by ranx from the kept rankings.
2. **Timing** (``n_timing`` > 0): a seeded sample of questions, every system warmed up first
   (models loaded, one query run), then the systems take turns on each question (round-robin,
   the starting system rotating by one each question), so that a slow moment of the machine
   hits all systems alike. The 1-minute load average is read before every timed query; when it
   ever exceeds ``max_load`` (default: the cores available to this process) the report gives
   no seconds at all, only counts, and says why. ``quiet_check`` first waits (bounded) for the
   load to fall below ``max_load``. When every question is timed (and no cache is used), the
   timed runs are the quality run too: one pass, not two.

With a ``reader`` (any :class:`~funnel_core.llm.LLM`; LlamaIndex and LangChain models through the
adapters' ``LlamaIndexLLM`` / ``LangChainLLM``), the metrics ``EM@k`` and ``F1@k`` ask it to answer
each question from a system's top-k texts and score the answer against the gold answers (SQuAD's
exact match and token F1): whether better retrieval gives better answers. The reader's calls and
tokens are counted apart from the system's cost and are never timed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from funnel_core import counters
from funnel_core.evaluation.datasets import EvalDataset
from funnel_core.evaluation.metrics import (
    answer_recall,
    contextual_integrity,
    exact_match,
    ir_metrics_per_query,
    token_f1,
)
from funnel_core.evaluation.report import Report, summarise
from funnel_core.evaluation.systems import as_system
from funnel_core.hardware import available_cores
from funnel_core.units import Unit

__all__ = ["evaluate", "available_cores", "read_load_average", "wait_for_quiet", "parse_metric",
           "default_metrics", "CACHE_VERSION", "READER_PROMPT"]

#: Bumped when the per-question cache records change shape.
CACHE_VERSION = 1


def read_load_average() -> float | None:
    """The 1-minute load average (``None`` where the OS has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def wait_for_quiet(max_load: float, *, timeout: float = 600.0, poll: float = 15.0,
                   load_reader: Callable[[], float | None] = read_load_average,
                   sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Wait until the 1-minute load average is at most ``max_load``, for at most ``timeout``
    seconds (polling every ``poll``); returns ``{"quiet", "waited_s", "load1"}``. It does not
    raise: a machine that stays busy is reported by the timing refusal."""
    waited = 0.0
    while True:
        load = load_reader()
        if load is None or load <= max_load or waited >= timeout:
            return {"quiet": load is None or load <= max_load, "waited_s": waited, "load1": load,
                    "max_load": max_load, "timeout_s": timeout}
        step = min(poll, timeout - waited)
        sleep(step)
        waited += step


#: The metrics computed here from the returned texts (the rest go to ranx).
LOCAL_METRICS = ("ar", "ci", "words", "em", "f1")
#: The metrics a reader's answer is scored by.
READER_METRICS = ("em", "f1")
#: The reader's prompt (``{context}``: the top-k texts, blank-line separated; ``{question}``).
READER_PROMPT = ("Answer the question with a short phrase taken from the context.\n\nContext:\n{context}\n\n"
                 "Question: {question}\nAnswer:")

_METRIC = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:@(\d+))?$")


def parse_metric(name: str) -> tuple[str, int | None]:
    """``"AR@4"`` -> ``("ar", 4)``, ``"CI@10"`` -> ``("ci", 10)``, ``"words@5"`` -> ``("words", 5)``,
    ``"EM@4"`` -> ``("em", 4)``, ``"ndcg@10"`` -> ``("ndcg", 10)``, ``"mrr"`` -> ``("mrr", None)``.
    AR, CI, words, EM and F1 are ours; every other name is passed to ranx."""
    m = _METRIC.match(str(name).strip())
    if not m:
        raise ValueError(f"metric {name!r} is not NAME or NAME@k (e.g. 'AR@5', 'CI@5', 'ndcg@10', "
                         "'recall@100', 'mrr').")
    kind, k = m.group(1).lower(), int(m.group(2)) if m.group(2) else None
    if kind in LOCAL_METRICS and not k:
        raise ValueError(f"metric {name!r} needs a cut-off: write {kind.upper()}@k, e.g. {kind.upper()}@5.")
    if k is not None and k < 1:
        raise ValueError(f"metric {name!r}: k must be >= 1.")
    return kind, k


def default_metrics(dataset: EvalDataset, ks: Sequence[int] = (1, 5, 10)) -> list[str]:
    """AR@k and CI@max(k) for answer-labelled data; nDCG@k, Recall@k and MRR for qrels."""
    out: list[str] = []
    if dataset.answers:
        out += [f"AR@{k}" for k in ks] + [f"CI@{max(ks)}"]
    if dataset.qrels:
        out += [f"ndcg@{k}" for k in ks] + [f"recall@{k}" for k in ks] + ["mrr"]
    return out


def _doc_id(u: Unit, id_key: str | None) -> str:
    if id_key:
        return str(u.metadata.get(id_key, u.id))
    return str(u.metadata.get("doc_id", u.id))


class _Cache:
    """Per-system JSONL files of finished questions; the first line is a header that must match."""

    def __init__(self, folder: str | os.PathLike, header: dict[str, Any]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.header = header

    def path(self, system: str) -> Path:
        safe = re.sub(r"[^\w.-]+", "_", system)[:60]
        return self.folder / f"{safe}-{hashlib.sha256(system.encode()).hexdigest()[:8]}.jsonl"

    def _header(self, system: str, key: Any) -> dict[str, Any]:
        return {**self.header, "system": key}

    def load(self, system: str, key: Any = None) -> dict[str, dict[str, Any]]:
        p = self.path(system)
        if not p.exists():
            return {}
        done: dict[str, dict[str, Any]] = {}
        with open(p, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if not lines:
            return {}
        head = json.loads(lines[0])
        if head != {"header": self._header(system, key)}:
            raise ValueError(f"the score cache {str(p)!r} was written for other settings ({head.get('header')}); "
                             f"this run has {self._header(system, key)}. Delete the file or pass another "
                             "cache_dir.")
        for line in lines[1:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the interruption: that question runs again
                continue
            done[rec["id"]] = rec
        return done

    def append(self, system: str, record: dict[str, Any], key: Any = None) -> None:
        p = self.path(system)
        fresh = not p.exists() or p.stat().st_size == 0
        with open(p, "a", encoding="utf-8") as f:
            if fresh:
                f.write(json.dumps({"header": self._header(system, key)}) + "\n")
            f.write(json.dumps(record) + "\n")
            f.flush()


def _progress(iterable: Any, total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=not enabled, leave=False)


def evaluate(systems: Mapping[str, Any], dataset: EvalDataset, *,
             metrics: Sequence[str] | None = None, ks: Sequence[int] = (1, 5, 10),
             baseline: str | None = None, depth: int | None = None, id_key: str | None = None,
             title_key: str = "title", n_timing: int = 20, timing_seed: int = 0,
             timing_ids: Sequence[str] | None = None, warm_query: str | None = None,
             max_load: float | None = None, quiet_check: bool | str = False, quiet_load: float | None = None,
             quiet_timeout: float = 600.0,
             quiet_poll: float = 15.0, cache_dir: str | os.PathLike | None = None,
             n_boot: int = 2000, seed: int = 0, progress: bool = True,
             load_reader: Callable[[], float | None] = read_load_average, cores: int | None = None,
             clock: Callable[[], float] = time.perf_counter,
             system_keys: Mapping[str, Any] | None = None, reader: Any = None,
             reader_prompt: str = READER_PROMPT, reader_max_new_tokens: int = 32) -> Report:
    """Evaluate retrieval systems side by side on one dataset.

    Args:
        systems: ``{name: system}``; a system is a ``funnel_core`` stage or ``Funnel``, a
            LlamaIndex retriever, a LangChain retriever or runnable returning documents, a
            callable ``fn(query) -> list``, a ``(retriever, [postprocessors])`` pair, or a
            :class:`~funnel_core.evaluation.systems.System`.
        dataset: From :func:`~funnel_core.evaluation.datasets.load_dataset` (or built by hand).
        metrics: ``"AR@k"`` (answer recall, needs answers), ``"CI@k"`` (contextual integrity:
            entropy in bits of the top-k units' ``title_key``; lower is more coherent), ``"words@k"``
            (whitespace words in the top-k texts: the context a reader would get), and any
            ranx metric (``"ndcg@10"``, ``"recall@100"``, ``"mrr"``, ...; needs qrels).
            ``"EM@k"`` / ``"F1@k"``: exact match / token F1 of ``reader``'s answer from the top-k texts
            (needs answers and a reader).
            ``None``: :func:`default_metrics` over ``ks``.
        baseline: The system every other is compared with (paired bootstrap of the difference
            per metric, and the exact McNemar test for 0/1 metrics); default: the first.
        depth: Results kept per question (default: the largest k of the metrics, 100 when a
            metric has none, e.g. ``mrr``).
        id_key: Metadata key holding the document id the qrels name (default ``"doc_id"`` when
            present, else the unit / node / Document id).
        n_timing: Questions timed (a seeded sample of the labelled ones); 0 times nothing.
        timing_ids: Time exactly these question ids, in this order (instead of the sample).
        warm_query: The warm-up question (default: a labelled question outside the timing
            sample, or the first timed one when every question is timed).
        max_load: Refuse seconds when the 1-minute load average during timing exceeds this
            (default: the cores available to the process).
        quiet_check: Before timing, wait up to ``quiet_timeout`` seconds for the load average to
            fall to ``quiet_load`` (default ``max_load``). The run's own threads add to the load
            average while it times (a model using 2 threads adds about 2), so a strict start
            (``quiet_load=1.0``) and a refusal limit of the cores (``max_load``) go together.
            ``"each"`` waits before every timed query instead (polling every ``quiet_poll``
            seconds), so every recorded load is at most ``quiet_load`` even though the run's own
            threads raise it: slower (the machine idles between queries while the 1-minute
            average decays), but every query starts on a quiet machine; each record keeps the
            seconds waited.
        cache_dir: Folder of per-system, per-question results; a rerun with the same folder
            resumes (systems are matched by name: delete a system's file after changing it).
        system_keys: ``{name: JSON-able settings}`` stored in each system's cache header, so
            that a changed system is refused rather than resumed (``funnel eval`` passes the
            TOML table).
        load_reader: Injectable for tests: returns the 1-minute load average.
        cores: Injectable for tests: the number of available cores.
        clock: Injectable for tests: a monotonic clock in seconds.
        reader: The LLM that answers from each system's top-k for ``EM@k`` / ``F1@k``: a
            :class:`~funnel_core.llm.LLM` (``TransformersLLM``, or a framework model wrapped by
            ``llama_index_funnel.llm.LlamaIndexLLM`` / ``langchain_funnel.llm.LangChainLLM``) or a
            model name / folder. Greedy decoding.
        reader_prompt: ``str.format`` template with ``{context}`` and ``{question}``.
        reader_max_new_tokens: Longest answer, in tokens.
    """
    if not systems:
        raise ValueError("evaluate needs at least one system, e.g. {'bm25': BM25Retrieve(index)}.")
    if not isinstance(dataset, EvalDataset):
        raise TypeError(f"dataset must be an EvalDataset (load_dataset(path)), got {type(dataset).__name__}.")
    sys_map = {str(n): as_system(obj, str(n)) for n, obj in systems.items()}
    names = list(sys_map)
    baseline = names[0] if baseline is None else baseline
    if baseline not in sys_map:
        raise ValueError(f"baseline {baseline!r} is not among the systems {names}.")
    metric_names = list(metrics) if metrics is not None else default_metrics(dataset, ks)
    parsed = {m: parse_metric(m) for m in metric_names}
    for m, (kind, _) in parsed.items():
        if kind == "ar" and not dataset.answers:
            raise ValueError(f"metric {m!r} needs gold answer strings; dataset {dataset.name!r} has relevance "
                             "judgements only: use 'ndcg@k', 'recall@k' or 'mrr'.")
        if kind in READER_METRICS and (reader is None or not dataset.answers):
            raise ValueError(f"metric {m!r} scores a reader's answer against gold answers: pass reader= (an "
                             "LLM, e.g. TransformersLLM(name)) and a dataset with answers (SQuAD-format JSON).")
        if kind not in LOCAL_METRICS and not dataset.qrels:
            raise ValueError(f"metric {m!r} needs relevance judgements (qrels); dataset {dataset.name!r} has "
                             "gold answers only: use 'AR@k' (answer recall) or 'CI@k'.")
    if depth is None:
        cut = [k for _, k in parsed.values() if k]
        depth = max(cut + ([100] if any(k is None for _, k in parsed.values()) else []))
    local = [m for m, (kind, _) in parsed.items() if kind in LOCAL_METRICS]
    reader_ks = sorted({k for kind, k in parsed.values() if kind in READER_METRICS and k})
    if reader is not None and not reader_ks:
        raise ValueError("reader= is given but no metric uses it; add 'EM@k' and/or 'F1@k' to metrics "
                         "(k: how many of each system's top texts the reader reads).")
    if reader is not None:
        from funnel_core.llm import as_llm, check_prompt_template

        reader = as_llm(reader)
        reader_prompt = check_prompt_template(reader_prompt, ["context", "question"], "reader_prompt")
    ranx_metrics = [m for m in metric_names if m not in local]
    if quiet_check not in (False, True, "each"):
        raise ValueError(f"quiet_check must be True, False or 'each' (wait before every timed query), "
                         f"got {quiet_check!r}.")
    cores = cores or available_cores()
    max_load = float(cores) if max_load is None else float(max_load)
    qids = dataset.question_ids
    load_before = load_reader()

    header = {"version": CACHE_VERSION, "dataset": dataset.fingerprint(), "depth": depth,
              "id_key": id_key, "title_key": title_key, "metrics": sorted(local)}
    if reader is not None:
        header["reader"] = {"llm": repr(reader), "prompt": reader_prompt, "max_new_tokens": reader_max_new_tokens}
    cache = _Cache(cache_dir, header) if cache_dir is not None else None

    # -- the timing sample (decided first: when it is every question, one pass serves both) -------
    sample: list[str] = []
    if timing_ids is not None:
        unknown = [q for q in timing_ids if q not in dataset.queries]
        if unknown:
            raise ValueError(f"timing_ids name questions that are not in the dataset, e.g. {unknown[:3]}.")
        sample = list(timing_ids)
    elif n_timing and n_timing > 0:
        sample = dataset.subset(n_timing, seed=timing_seed).question_ids
    one_pass = bool(sample) and cache is None and set(sample) == set(qids)

    def read(q: str, units: list[Unit]) -> dict[str, Any]:
        """The reader's answer from the top-k texts, for every k an EM/F1 metric names."""
        before = counters.snapshot()
        answers = {}
        for k in reader_ks:
            prompt = reader_prompt.format(context="\n\n".join(u.text for u in units[:k]),
                                          question=dataset.queries[q])
            answers[str(k)] = reader.generate([prompt], max_new_tokens=reader_max_new_tokens)[0][0].strip()
        return {"answers": answers, "counts": counters.difference(counters.snapshot(), before)}

    def record(q: str, units: list[Unit], counts: dict[str, int]) -> dict[str, Any]:
        values: dict[str, float] = {}
        read_out = read(q, units) if reader is not None and q in dataset.answers else None
        for m in local:
            kind, k = parsed[m]
            if kind == "ar" and q in dataset.answers:
                values[m] = answer_recall(units, dataset.answers[q], k or depth)
            elif kind == "ci":
                values[m] = contextual_integrity(units, k or depth, key=title_key)
            elif kind == "words":
                values[m] = float(sum(len(u.text.split()) for u in units[: k or depth]))
            elif kind in READER_METRICS and read_out is not None:
                score = exact_match if kind == "em" else token_f1
                values[m] = score(read_out["answers"][str(k)], dataset.answers[q])
        ranked: list[str] = []
        for u in units:
            did = _doc_id(u, id_key)
            if did not in ranked:
                ranked.append(did)
            if len(ranked) >= depth:
                break
        rec = {"id": q, "ranked": ranked, "n_results": len(units), "metrics": values, "counts": counts}
        return rec if read_out is None else {**rec, "reader": read_out}

    # -- phase 1: quality (and counted cost) ------------------------------------------------
    per_question: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    for name in ([] if one_pass else names):
        system = sys_map[name]
        skey = (system_keys or {}).get(name)
        done = cache.load(name, skey) if cache else {}
        todo = [q for q in qids if q not in done]
        for q in _progress(todo, len(todo), f"{name}: quality", progress):
            before = counters.snapshot()
            units = system.search(dataset.queries[q])
            rec = record(q, units, counters.difference(counters.snapshot(), before))
            if cache:
                cache.append(name, rec, skey)
            done[q] = rec
        per_question[name] = {q: done[q] for q in qids}

    # -- phase 2: timing (with one_pass, the timed runs are the quality run too) -------------
    timing: dict[str, Any] = {"n_timing": 0, "cores": cores, "max_load": max_load, "records": [],
                              "order": [], "refused": None, "quiet_check": None, "one_pass": one_pass}
    if sample:
        spare = [q for q in qids if q not in set(sample)]
        if warm_query is None:
            warm_query = dataset.queries[spare[0]] if spare else dataset.queries[sample[0]]
        for name in names:
            sys_map[name].warm_up(warm_query)
        quiet_level = max_load if quiet_load is None else float(quiet_load)
        if quiet_check:
            timing["quiet_check"] = wait_for_quiet(quiet_level, timeout=quiet_timeout, poll=quiet_poll,
                                                   load_reader=load_reader)
        records = []
        for i, q in enumerate(_progress(sample, len(sample), "timing (round-robin)", progress)):
            order = names[i % len(names):] + names[: i % len(names)]
            for name in order:
                waited = None
                if quiet_check == "each":
                    waited = wait_for_quiet(quiet_level, timeout=quiet_timeout, poll=quiet_poll,
                                            load_reader=load_reader)["waited_s"]
                load1 = load_reader()
                before = counters.snapshot()
                t0 = clock()
                units = sys_map[name].search(dataset.queries[q])
                seconds = clock() - t0
                counts = counters.difference(counters.snapshot(), before)
                records.append({"id": q, "system": name, "seconds": seconds, "load1": load1,
                                **({} if waited is None else {"waited_s": waited})})
                timing["order"].append([q, name])
                if one_pass:
                    per_question[name][q] = record(q, units, counts)
        if one_pass:
            per_question = {name: {q: per_question[name][q] for q in qids} for name in names}
        timing["records"] = records
        timing["n_timing"] = len(sample)
        loads = [r["load1"] for r in records if r["load1"] is not None]
        if loads:
            timing["load1"] = {"min": min(loads), "median": sorted(loads)[len(loads) // 2], "max": max(loads)}
            if max(loads) > max_load:
                timing["refused"] = (f"seconds withheld: the 1-minute load average reached {max(loads):.2f} "
                                     f"during timing, above {max_load:g} (the cores available: {cores}); "
                                     "other processes shared the CPUs, so the times measure the machine, not "
                                     "the systems. The counts (model calls, pairs scored, tokens) stand. Re-run "
                                     "on a quiet machine (quiet_check=True / --quiet-check waits for one).")
        else:
            timing["load1"] = None

    if ranx_metrics:
        for name in names:
            run = {q: {d: float(len(r["ranked"]) - i) for i, d in enumerate(r["ranked"])}
                   for q, r in per_question[name].items()}
            judged = {q: dataset.qrels[q] for q in qids if q in dataset.qrels}
            values_by_metric = ir_metrics_per_query(judged, run, ranx_metrics)
            for m, per_q in values_by_metric.items():
                for q, v in per_q.items():
                    per_question[name][q]["metrics"][m] = v

    return summarise(names=names, baseline=baseline, metric_names=metric_names, dataset=dataset,
                     per_question=per_question, timing=timing, depth=depth, n_boot=n_boot, seed=seed,
                     load_before=load_before, load_after=load_reader(),
                     systems={n: repr(s) for n, s in sys_map.items()})
