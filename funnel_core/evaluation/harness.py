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
import math
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from funnel_core import counters
from funnel_core.evaluation._files import (
    TooLargeError,
    append_text,
    check_plain_or_absent,
    read_bounded,
    write_atomic,
)
from funnel_core.evaluation.datasets import EvalDataset
from funnel_core.evaluation.metrics import (
    answer_recall,
    contextual_integrity,
    exact_match,
    ir_metrics_per_query,
    token_f1,
)
from funnel_core.evaluation.report import Report, summarise
from funnel_core.evaluation.systems import as_system, document_id_candidates
from funnel_core.hardware import available_cores
from funnel_core.units import Unit

__all__ = ["evaluate", "available_cores", "read_load_average", "wait_for_quiet", "parse_metric",
           "default_metrics", "CACHE_VERSION", "READER_PROMPT"]

#: Bumped when the per-question cache records change shape (2: the header names the corpus, the
#: system's model identity and the package version; 3: every record carries its SHA-256; 4: a result is
#: judged under the first of its candidate document ids the dataset knows; 5: a funnel's records carry
#: its per-stage trace and the counts name the FiD passages).
CACHE_VERSION = 5


def _record_digest(rec: Mapping[str, Any]) -> str:
    """SHA-256 of a cache record (without its ``sha256`` field), in canonical JSON: a record
    whose bytes changed on disk (a flipped byte that still parses, ``1.0`` -> ``0.0``) no longer
    matches it. It detects damage, not forgery (anyone can compute it)."""
    body = {k: v for k, v in rec.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


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


def _doc_id(u: Unit, id_key: str | None, known: frozenset[str] = frozenset()) -> str:
    """The document id a result is judged under: ``metadata[id_key]`` when ``id_key`` is given
    and present; else the first of :func:`~funnel_core.evaluation.systems.document_id_candidates`
    (``doc_id``, own id, ``funnel_parent_id`` / parent, LlamaIndex ``PARENT`` / ``SOURCE``) that
    the dataset knows (``known``: its judged and corpus document ids), so a framework passage
    without a ``doc_id`` key counts for the document it was cut from; else ``doc_id`` or the
    unit's own id."""
    if id_key and id_key in u.metadata:
        return str(u.metadata[id_key])
    candidates = document_id_candidates(u)
    if known:
        for c in candidates:
            if c in known:
                return c
    return candidates[0] if candidates else str(u.id)


#: The largest score-cache file read back (bytes); a larger one is not ours and is recomputed.
MAX_CACHE_BYTES = 1 << 30


#: Subfolders of a model folder that this package derives from the model (ONNX/OpenVINO exports).
_DERIVED = ("funnel_onnx",)
#: Files of a model folder that decide its outputs: weights, configuration, tokenizer, remote code
#: (the export cache's :data:`~funnel_core.rerank.runtimes.SOURCE_SUFFIXES`), other weight formats,
#: and ``MANIFEST.sha256``.
_MODEL_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model", ".py", ".tiktoken", ".gguf",
                   ".onnx", ".pt", ".pth", ".msgpack", ".h5", ".sha256")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")


def _folder_digest(folder: Path) -> dict[str, Any]:
    """SHA-256 over the name and content digest of every model file under ``folder`` (see
    :data:`_MODEL_SUFFIXES`), skipping our exports (``funnel_onnx``), hidden entries and
    ``checkpoint-*`` folders (a trainer's intermediate states, which loading the folder does not
    read). Weights replaced by others of the same size under the same modification time are
    another model. Each file is hashed once per process (:func:`~funnel_core.rerank.runtimes.file_sha256`)."""
    from funnel_core.rerank.runtimes import file_sha256

    files = []
    for root, dirs, names in os.walk(folder):
        rel_root = Path(root).relative_to(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not d.startswith("checkpoint-")
                         and not (rel_root == Path(".") and d in _DERIVED))
        for name in sorted(names):
            f = Path(root) / name
            if name.startswith(".") or f.suffix not in _MODEL_SUFFIXES or not f.is_file():
                continue
            files.append([(rel_root / name).as_posix(), file_sha256(f)])
            if len(files) >= 10_000:
                break
    return {"content": hashlib.sha256(json.dumps(files).encode()).hexdigest(), "files": len(files)}


def _hub_identity(name: str, revision: Any) -> dict[str, Any] | None:
    """The locally cached snapshot of hub model ``name`` (what ``from_pretrained`` loads
    offline): its commit hash, found without network by ``huggingface_hub``; ``None`` when
    ``name`` is not a cached hub model (then it names no weights this run could load offline)."""
    if not _HUB_ID.match(name):
        return None
    from funnel_core.rerank.runtimes import hub_snapshot

    snapshot = hub_snapshot(name, revision)
    if snapshot is None:
        return None
    return {"hub": name, "commit": snapshot.name, "revision": revision if isinstance(revision, str) else None}


def _model_identity(settings: Any) -> dict[str, Any]:
    """What identifies the weights each string of a system's settings names, so that other
    weights under the same name are another system: a local folder's content digest (every
    weights, configuration and tokenizer file, :func:`_folder_digest`), a local file's SHA-256,
    a cached hub model's snapshot commit (``revision`` taken from the same table when given)."""
    found: dict[str, Any] = {}

    def walk(v: Any, revision: Any = None) -> None:
        if isinstance(v, Mapping):
            rev = v.get("revision", revision)
            for x in v.values():
                walk(x, rev)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, revision)
        elif isinstance(v, str) and 0 < len(v) < 4096 and "\n" not in v and v not in found:
            try:
                p = Path(v)
                if p.is_dir():
                    found[v] = _folder_digest(p)
                elif p.is_file():
                    from funnel_core.rerank.runtimes import file_sha256

                    found[v] = {"sha256": file_sha256(p)}
                elif not p.is_absolute():
                    hub = _hub_identity(v, revision)
                    if hub is not None:
                        found[v] = hub
            except (OSError, ValueError):
                return

    walk(settings)
    return found


def _set_torch_threads(n: int) -> int | None:
    """Set torch's intra-op threads to ``n`` when torch is loaded (a run without torch has no
    threads to set); returns the number before, or ``None``."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    before = int(torch.get_num_threads())
    torch.set_num_threads(n)
    return before


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class _Cache:
    """Per-system JSONL files of finished questions. The first line is a header naming everything
    the results depend on (questions and labels, the corpus, the system's settings and model
    identity, depth, metrics, the package version); a file whose header differs is not reused
    (recomputed, with a warning), and a record that is damaged (its SHA-256 does not match) or
    implausible is discarded (with a warning) and its question runs again. Files are read bounded,
    written no-follow."""

    def __init__(self, folder: str | os.PathLike, header: dict[str, Any],
                 check: Callable[[Any], str | None]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.header = header
        self.check = check

    def path(self, system: str) -> Path:
        safe = re.sub(r"[^\w.-]+", "_", system)[:60]
        return self.folder / f"{safe}-{hashlib.sha256(system.encode()).hexdigest()[:8]}.jsonl"

    def _header(self, system: str, key: Any) -> dict[str, Any]:
        return {**self.header, "system": {"name": system, "settings": key, "models": _model_identity(key)}}

    def _head_line(self, system: str, key: Any) -> str:
        return json.dumps({"header": self._header(system, key)}, sort_keys=True, default=str) + "\n"

    def load(self, system: str, key: Any = None) -> dict[str, dict[str, Any]]:
        """The valid records of ``system``'s file; the file is rewritten (atomically) without what
        was discarded, or started afresh when its header differs."""
        p = self.path(system)
        check_plain_or_absent(p, "score cache")
        try:
            raw = read_bounded(p, MAX_CACHE_BYTES, "score cache")
        except TooLargeError as exc:
            warnings.warn(f"system {system!r}: {exc} Recomputing.", UserWarning, stacklevel=3)
            raw = b"garbage"
        head_line = self._head_line(system, key)
        if raw is None or not raw.strip():
            write_atomic(p, head_line.encode("utf-8"))
            return {}
        lines = raw.decode("utf-8", errors="replace").splitlines()
        try:
            head = json.loads(lines[0])
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
            head = None
        want = json.loads(head_line)
        if head != want:
            got = head.get("header") if isinstance(head, dict) else None
            if isinstance(got, dict):
                differ = sorted(k for k in set(got) | set(want["header"]) if got.get(k) != want["header"].get(k))
                if "system" in differ and isinstance(got.get("system"), dict):
                    differ += [f"system {k}" for k in ("settings", "models")
                               if got["system"].get(k) != want["header"]["system"].get(k)]
                why = f"was written for other inputs (differs in: {', '.join(differ)})"
            else:
                why = "has no readable header (damaged or not a score cache)"
            warnings.warn(f"system {system!r}: the score cache {str(p)!r} {why}; its {len(lines) - 1} record(s) "
                          "are not reused: recomputing.", UserWarning, stacklevel=3)
            write_atomic(p, head_line.encode("utf-8"))
            return {}
        done: dict[str, dict[str, Any]] = {}
        kept: list[str] = []
        problems: list[str] = []
        for n, line in enumerate(lines[1:], 2):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                problems.append(f"line {n}: not JSON")
                continue
            if not isinstance(rec, dict) or rec.get("sha256") != _record_digest(rec):
                problems.append(f"line {n}: its SHA-256 does not match (changed on disk)")
                continue
            rec = {k: v for k, v in rec.items() if k != "sha256"}
            problem: str | None = self.check(rec)
            if problem is None and rec["id"] in done:
                problem = f"question {rec['id']!r} recorded twice"
            if problem is not None:
                problems.append(f"line {n}: {problem}")
                continue
            done[rec["id"]] = rec
            kept.append(line)
        if problems:
            shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
            warnings.warn(f"system {system!r}: {len(problems)} record(s) of the score cache {str(p)!r} are damaged "
                          f"or implausible and are discarded, never reported; recomputing those questions "
                          f"({shown}).", UserWarning, stacklevel=3)
            write_atomic(p, (head_line + "".join(x + "\n" for x in kept)).encode("utf-8"))
        return done

    def append(self, system: str, record: dict[str, Any], key: Any = None) -> None:
        p = self.path(system)
        if not check_plain_or_absent(p, "score cache") or p.stat().st_size == 0:
            write_atomic(p, self._head_line(system, key).encode("utf-8"))
        append_text(p, json.dumps({**record, "sha256": _record_digest(record)}) + "\n")


def _record_problem(rec: Any, *, qids: set[str], answered: set[str], depth: int, local: Mapping[str, tuple],
                    reader_ks: Sequence[int]) -> str | None:
    """Why a cached record cannot be what :func:`evaluate` wrote (``None`` when it can)."""
    if not isinstance(rec, dict):
        return "not a record"
    q = rec.get("id")
    if not isinstance(q, str) or q not in qids:
        return f"unknown question id {q!r}"
    n = rec.get("n_results")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return f"question {q!r}: n_results {n!r} is not a count"
    ranked = rec.get("ranked")
    if not isinstance(ranked, list) or not all(isinstance(d, str) for d in ranked):
        return f"question {q!r}: the ranked list is not a list of document ids"
    if len(ranked) > min(depth, n) or len(set(ranked)) != len(ranked):
        return (f"question {q!r}: the ranked list has {len(ranked)} ids ({len(set(ranked))} distinct) for "
                f"depth {depth} and {n} results")
    values = rec.get("metrics")
    if not isinstance(values, dict):
        return f"question {q!r}: no metrics"
    reading = bool(reader_ks) and q in answered
    want = {m for m, (kind, _) in local.items()
            if kind in ("ci", "words") or (kind == "ar" and q in answered) or (kind in ("em", "f1") and reading)}
    if set(values) != want:
        return f"question {q!r}: metrics {sorted(values)} where {sorted(want)} were computed"
    for m, v in values.items():
        kind = local[m][0]
        if not _finite(v):
            return f"question {q!r}: metric {m!r} = {v!r} is not a finite number"
        if (kind in ("ar", "em") and v not in (0, 1)) or (kind == "f1" and not 0 <= v <= 1) or v < 0:
            return f"question {q!r}: metric {m!r} = {v!r} is outside its range"
    counts = rec.get("counts")
    if not isinstance(counts, dict) or not all(isinstance(k, str) and isinstance(c, int) and not isinstance(c, bool)
                                               and c >= 0 for k, c in counts.items()):
        return f"question {q!r}: counts are not counts"
    stages = rec.get("stages")
    if stages is not None and not (isinstance(stages, list) and all(
            isinstance(s, dict) and isinstance(s.get("stage"), str) and isinstance(s.get("units_out"), int)
            and not isinstance(s.get("units_out"), bool) and s["units_out"] >= 0
            and s.get("answer_recall") in (None, 0, 1) for s in stages)):
        return f"question {q!r}: the per-stage trace is damaged"
    read = rec.get("reader")
    if reading:
        ans = read.get("answers") if isinstance(read, dict) else None
        if not isinstance(read, dict) or not isinstance(ans, dict) or set(ans) != {str(k) for k in reader_ks} or \
                not all(isinstance(a, str) for a in ans.values()) or not isinstance(read.get("counts"), dict):
            return f"question {q!r}: the reader's answers are missing or damaged"
    elif read is not None:
        return f"question {q!r}: a reader's answer where no reader reads"
    return None


def _check_numbers(**values: Any) -> None:
    """``depth`` and ``n_boot`` are integers >= 1, ``n_timing`` >= 0; loads, ``quiet_poll`` finite
    and > 0; ``quiet_timeout`` finite and >= 0 (``None``: the default)."""
    for name, v in values.items():
        if v is None and name in ("max_load", "quiet_load"):
            continue
        if name in ("depth", "n_boot", "n_timing"):
            low = 0 if name == "n_timing" else 1
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}.")
        elif not _finite(v) or v < 0 or (v == 0 and name != "quiet_timeout"):
            raise ValueError(f"{name} must be a finite number {'>= 0' if name == 'quiet_timeout' else '> 0'}, "
                             f"got {v!r}.")


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
             reader_prompt: str = READER_PROMPT, reader_max_new_tokens: int = 32,
             timing_threads: int | None = None) -> Report:
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
        id_key: Metadata key holding the document id the qrels name. Default: the first id
            the dataset knows (its judged or corpus document ids) among ``metadata["doc_id"]``,
            the unit / node / Document id, the unit it was cut from (``funnel_parent_id``,
            written by later chunking and the other splitting stages), and a LlamaIndex node's
            ``PARENT`` / ``SOURCE`` relationship (``ref_doc_id``); none known: ``doc_id``, else
            the result's own id.
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
            resumes. Each file's header names the questions and labels, the corpus digest, the
            system's settings and model identity, depth, metrics, reader and package version; a
            file written for other inputs is recomputed (with a warning), and a damaged record
            (each carries its SHA-256) or an implausible one is discarded (with a warning) and its
            question run again.
        system_keys: ``{name: JSON-able settings}`` stored in each system's cache header, so
            that a changed system is recomputed rather than resumed (``funnel eval`` passes the
            TOML table); a string naming a model adds what identifies its weights (a local
            folder: the SHA-256 of its weights, configuration and tokenizer files; a local file:
            its SHA-256; a hub name: the commit of its locally cached snapshot). Without
            it, systems are matched by name only.
        load_reader: Injectable for tests: returns the 1-minute load average.
        cores: Injectable for tests: the number of available cores.
        clock: Injectable for tests: a monotonic clock in seconds.
        reader: The LLM that answers from each system's top-k for ``EM@k`` / ``F1@k``: a
            :class:`~funnel_core.llm.LLM` (``TransformersLLM``, or a framework model wrapped by
            ``llama_index_funnel.llm.LlamaIndexLLM`` / ``langchain_funnel.llm.LangChainLLM``) or a
            model name / folder. Greedy decoding. Or a passage reader: an object with
            ``answer(question, units) -> str`` and no ``generate``, such as
            :class:`~funnel_core.rerank.fid.FiDReader` (a FiD reader reads each of the top-k units
            as one passage; ``reader_prompt`` is not used).
        reader_prompt: ``str.format`` template with ``{context}`` and ``{question}``.
        reader_max_new_tokens: Longest answer, in tokens.
        timing_threads: torch's intra-op threads while timing (warm-up included; restored after),
            e.g. 1 so that a timed process whose model work is torch's alone holds the 1-minute
            load at about 1.0 on an otherwise idle machine (OpenVINO and ONNX Runtime keep their
            own threads). ``None``: as the process has them. Recorded in the report.
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
    _check_numbers(depth=depth, n_boot=n_boot, max_load=max_load, quiet_load=quiet_load, n_timing=n_timing,
                   quiet_timeout=quiet_timeout, quiet_poll=quiet_poll)
    if timing_threads is not None and (not isinstance(timing_threads, int) or isinstance(timing_threads, bool)
                                       or timing_threads < 1):
        raise ValueError(f"timing_threads must be an integer >= 1 (torch threads while timing), got {timing_threads!r}.")
    local = [m for m, (kind, _) in parsed.items() if kind in LOCAL_METRICS]
    reader_ks = sorted({k for kind, k in parsed.values() if kind in READER_METRICS and k})
    if reader is not None and not reader_ks:
        raise ValueError("reader= is given but no metric uses it; add 'EM@k' and/or 'F1@k' to metrics "
                         "(k: how many of each system's top texts the reader reads).")
    # a passage reader (e.g. funnel_core.rerank.fid.FiDReader) answers from the units themselves
    passage_reader = reader is not None and callable(getattr(reader, "answer", None)) and \
        not callable(getattr(reader, "generate", None))
    if reader is not None and not passage_reader:
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
    # the document ids a result may be judged under (see _doc_id)
    known_ids = frozenset({d for judged in dataset.qrels.values() for d in judged}
                          | {str(u.metadata.get("doc_id", u.id)) for u in dataset.corpus})

    cache = None
    if cache_dir is not None:
        from funnel_core.version import __version__

        header = {"version": CACHE_VERSION, "package": __version__, "dataset": dataset.fingerprint(),
                  "corpus": dataset.corpus_digest(), "depth": depth, "id_key": id_key, "title_key": title_key,
                  "metrics": sorted(local)}
        if reader is not None:
            settings = getattr(reader, "settings", None)
            try:  # the reader's weights too (TransformersLLM: its model folder or hub name)
                reader_models = _model_identity(settings()) if callable(settings) else {}
            except Exception:
                reader_models = {}
            header["reader"] = {"llm": repr(reader), "prompt": None if passage_reader else reader_prompt,
                                "max_new_tokens": None if passage_reader else reader_max_new_tokens,
                                "models": reader_models}
        answered = set(dataset.answers)
        qid_set = set(qids)

        def check(rec: Any) -> str | None:
            return _record_problem(rec, qids=qid_set, answered=answered, depth=depth,
                                   local={m: parsed[m] for m in local}, reader_ks=reader_ks)

        cache = _Cache(cache_dir, header, check)

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
            if passage_reader:  # each of the top-k units is one passage of the reader's input
                answers[str(k)] = str(reader.answer(dataset.queries[q], units[:k])).strip()
                continue
            prompt = reader_prompt.format(context="\n\n".join(u.text for u in units[:k]),
                                          question=dataset.queries[q])
            answers[str(k)] = reader.generate([prompt], max_new_tokens=reader_max_new_tokens)[0][0].strip()
        return {"answers": answers, "counts": counters.difference(counters.snapshot(), before)}

    def record(q: str, units: list[Unit], counts: dict[str, int],
               stages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
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
            did = _doc_id(u, id_key, known_ids)
            if did not in ranked:
                ranked.append(did)
            if len(ranked) >= depth:
                break
        rec: dict[str, Any] = {"id": q, "ranked": ranked, "n_results": len(units), "metrics": values,
                               "counts": counts}
        if stages is not None:
            rec["stages"] = stages
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
            units, stages = system.search_traced(dataset.queries[q], dataset.answers.get(q))
            rec = record(q, units, counters.difference(counters.snapshot(), before), stages)
            if cache:
                cache.append(name, rec, skey)
            done[q] = rec
        per_question[name] = {q: done[q] for q in qids}

    # -- phase 2: timing (with one_pass, the timed runs are the quality run too) -------------
    timing: dict[str, Any] = {"n_timing": 0, "cores": cores, "max_load": max_load, "records": [],
                              "order": [], "refused": None, "quiet_check": None, "one_pass": one_pass}
    # torch's threads while timing (warm-up included), restored afterwards
    threads_before = _set_torch_threads(timing_threads) if sample and timing_threads is not None else None
    try:
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

    finally:
        if threads_before is not None:
            _set_torch_threads(threads_before)
    timing["threads"] = timing_threads if threads_before is not None else None

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
                     systems={n: repr(s) for n, s in sys_map.items()},
                     uncounted={n: list(s.uncounted) for n, s in sys_map.items()})
