"""The result of :func:`~funnel_core.evaluation.harness.evaluate`: a JSON-ready dict, a Markdown
table and a Pareto plot (quality against seconds and against pairs scored per query)."""

from __future__ import annotations

import copy as _copy
import io
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from funnel_core.counters import COUNTER_NAMES
from funnel_core.evaluation._files import read_bounded, write_atomic
from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap, percentile

__all__ = ["Report", "summarise", "package_versions", "lower_is_better", "REPORT_FORMAT"]

#: The ``format`` field of :meth:`Report.to_dict`; report readers check it.
REPORT_FORMAT = "funnel-rag-eval/1"
#: The largest report file :meth:`Report.load` reads (bytes; a gzip one may hold eight times this).
MAX_REPORT_BYTES = 1 << 30

_PACKAGES = ("funnel-rag", "numpy", "ranx", "bm25s", "torch", "transformers", "sentence-transformers",
             "onnxruntime", "openvino", "faiss-cpu", "llama-index-core", "langchain-core")


def package_versions(names: Sequence[str] = _PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that decide results and speed (absent ones left out)."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def lower_is_better(metric: str) -> bool:
    """Contextual integrity (``CI@k``, an entropy) and context size (``words@k``) are better when
    lower; every other metric higher."""
    return metric.lower().startswith(("ci@", "words@"))


def _is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def _stage_summary(traces: Sequence[Any]) -> list[dict[str, Any]]:
    """Per stage of a funnel, over the questions: units out (mean) and the answer recall of the
    stage's whole output (over the questions with answers); ``[]`` unless every question has a
    trace with the same stages."""
    if not traces or any(t is None for t in traces):
        return []
    names = [s["stage"] for s in traces[0]]
    if any([s["stage"] for s in t] != names for t in traces):
        return []
    out = []
    for i, name in enumerate(names):
        recall = [t[i]["answer_recall"] for t in traces if t[i]["answer_recall"] is not None]
        out.append({"stage": name, "units_out_mean": sum(t[i]["units_out"] for t in traces) / len(traces),
                    "answer_recall": sum(recall) / len(recall) if recall else None, "questions": len(traces)})
    return out


def summarise(*, names: Sequence[str], baseline: str, metric_names: Sequence[str], dataset: Any,
              per_question: Mapping[str, Mapping[str, dict[str, Any]]], timing: dict[str, Any],
              depth: int, n_boot: int, seed: int, load_before: float | None, load_after: float | None,
              systems: Mapping[str, str], uncounted: Mapping[str, Sequence[str]] | None = None) -> "Report":
    """Turn per-question results and timing records into a :class:`Report`. ``uncounted``: per
    system, the parts whose model work nobody counted (``cost[system]["uncounted"]``)."""
    from funnel_core.hardware import describe

    summary: dict[str, dict[str, Any]] = {}
    comparisons: dict[str, dict[str, Any]] = {}
    cost: dict[str, dict[str, Any]] = {}
    stages: dict[str, list[dict[str, Any]]] = {}
    refused = timing.get("refused")
    for name in names:
        recs = list(per_question[name].values())
        summary[name] = {}
        for m in metric_names:
            vals = [r["metrics"][m] for r in recs if m in r["metrics"]]
            lo, hi = bootstrap_ci(vals, n_boot=n_boot, seed=seed)
            summary[name][m] = {"mean": float(sum(vals) / len(vals)) if vals else float("nan"),
                                "ci": [lo, hi], "n": len(vals)}
        n = max(len(recs), 1)
        c: dict[str, Any] = {f"{k}_per_query": sum(r["counts"].get(k, 0) for r in recs) / n
                             for k in COUNTER_NAMES}
        read = [r["reader"]["counts"] for r in recs if "reader" in r]  # the reader's cost, apart
        c.update({f"reader_{k}_per_query": sum(x.get(k, 0) for x in read) / n
                  for k in COUNTER_NAMES if any(x.get(k) for x in read)})
        c["uncounted"] = list((uncounted or {}).get(name, []))
        secs = [r["seconds"] for r in timing.get("records", []) if r["system"] == name]
        c["timed_questions"] = len(secs)
        if secs and not refused:
            c.update(seconds_p50=percentile(secs, 50), seconds_p95=percentile(secs, 95),
                     seconds_mean=sum(secs) / len(secs))
        else:
            c.update(seconds_p50=None, seconds_p95=None, seconds_mean=None)
        cost[name] = c
        trace = _stage_summary([r.get("stages") for r in recs])
        if trace:
            stages[name] = trace
    for name in names:
        if name == baseline:
            continue
        comparisons[name] = {}
        for m in metric_names:
            ids = [q for q, r in per_question[name].items()
                   if m in r["metrics"] and m in per_question[baseline][q]["metrics"]]
            a = [per_question[name][q]["metrics"][m] for q in ids]
            b = [per_question[baseline][q]["metrics"][m] for q in ids]
            if not ids:
                continue
            cmp = paired_bootstrap(a, b, n_boot=n_boot, seed=seed)
            if _is_binary(a) and _is_binary(b):
                cmp["mcnemar"] = mcnemar_exact(a, b)
            comparisons[name][m] = cmp
    machine = describe()
    data = {
        "format": REPORT_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dataset": {"name": dataset.name, "format": dataset.format, "questions": len(dataset.question_ids),
                    "with_answers": len(dataset.answers), "with_qrels": len(dataset.qrels),
                    "corpus": len(dataset.corpus), "fingerprint": dataset.fingerprint()},
        "systems": dict(systems),
        "baseline": baseline,
        "metrics": list(metric_names),
        "depth": depth,
        "summary": summary,
        "comparisons": comparisons,
        "cost": cost,
        "stages": stages,
        "timing": {k: v for k, v in timing.items()},
        "machine": machine,
        "cores_available": timing.get("cores"),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "versions": package_versions(),
        "per_question": {n: list(per_question[n].values()) for n in names},
    }
    return Report(data)


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{digits}f}"


def _seconds(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


class Report:
    """What :func:`~funnel_core.evaluation.harness.evaluate` returns.

    Attributes (views of :meth:`to_dict`): ``summary`` (``{system: {metric: {mean, ci, n}}}``),
    ``comparisons`` (``{system: {metric: paired bootstrap [+ McNemar]}}`` against ``baseline``),
    ``cost`` (``{system: {seconds_p50, seconds_p95, pairs_scored_per_query, model_calls_per_query,
    llm_*_per_query, uncounted, ...}}``; ``uncounted`` names the parts of a system whose model
    work is not counted, so its counts are a lower bound), ``timing`` and ``per_question``
    (``{system: [records]}``).
    """

    def __init__(self, data: dict[str, Any]) -> None:
        if data.get("format") != REPORT_FORMAT:
            raise ValueError(f"not an evaluation report (format {data.get('format')!r}, expected "
                             f"{REPORT_FORMAT!r}); pass the dict that Report.to_dict() wrote.")
        self._data = data

    # -- views -----------------------------------------------------------------------------
    @property
    def systems(self) -> list[str]:
        return list(self._data["summary"])

    @property
    def metrics(self) -> list[str]:
        return list(self._data["metrics"])

    @property
    def baseline(self) -> str:
        return str(self._data["baseline"])

    @property
    def summary(self) -> dict[str, Any]:
        return self._data["summary"]

    @property
    def comparisons(self) -> dict[str, Any]:
        return self._data["comparisons"]

    @property
    def cost(self) -> dict[str, Any]:
        return self._data["cost"]

    @property
    def stages(self) -> dict[str, list[dict[str, Any]]]:
        """``{system: [{"stage", "units_out_mean", "answer_recall", "questions"}]}`` for the
        funnels (what each stage kept, and the share of questions whose answer survived it)."""
        return self._data.get("stages", {})

    @property
    def timing(self) -> dict[str, Any]:
        return self._data["timing"]

    @property
    def per_question(self) -> dict[str, list[dict[str, Any]]]:
        return self._data["per_question"]

    def to_dict(self, per_question: bool = True, *, copy: bool = True) -> dict[str, Any]:
        """A JSON-ready copy (``per_question=False`` leaves the per-question results out);
        ``copy=False``: the report's own data, to read only (a large report's deep copy takes
        seconds)."""
        if not copy:
            return self._data if per_question else {k: v for k, v in self._data.items() if k != "per_question"}
        d = _copy.deepcopy(self._data)
        if not per_question:
            d.pop("per_question", None)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Report":
        return cls(_copy.deepcopy(data))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Report":
        """Read a report written by :meth:`save` (its ``report.json`` or ``report.json.gz``, or the
        folder holding one)."""
        p = Path(path)
        if p.is_dir():
            p = p / "report.json" if (p / "report.json").is_file() else p / "report.json.gz"
        raw = read_bounded(p, MAX_REPORT_BYTES, "report")
        if raw is None:
            raise FileNotFoundError(f"{str(p)!r} does not exist; pass a report.json written by Report.save.")
        if p.suffix == ".gz":
            import gzip
            import zlib

            try:
                with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
                    raw = g.read(MAX_REPORT_BYTES * 8 + 1)
            except (OSError, EOFError, zlib.error) as exc:
                raise ValueError(f"{str(p)!r} is not a gzip file ({exc}).") from exc
            if len(raw) > MAX_REPORT_BYTES * 8:
                raise ValueError(f"{str(p)!r} decompresses to more than {MAX_REPORT_BYTES * 8} bytes; not a report.")
        return cls(json.loads(raw.decode("utf-8")))

    # -- rendering -------------------------------------------------------------------------
    def primary_metric(self) -> str:
        """The first metric where higher is better (what the Pareto plot puts on its y axis)."""
        return next((m for m in self.metrics if not lower_is_better(m)), self.metrics[0])

    def to_markdown(self, metrics: Sequence[str] | None = None) -> str:
        """A Markdown table: each metric with its 95% interval, cost per query, and below it the
        paired comparisons against the baseline and any timing refusal."""
        metrics = list(metrics or self.metrics)
        with_llm = any(self.cost[s]["llm_calls_per_query"] for s in self.systems)
        with_fid = any(self.cost[s].get("fid_passages_per_query") for s in self.systems)
        head = ["system", *metrics, "pairs/query", *(["of which FiD"] if with_fid else []), "model calls/query"]
        if with_llm:
            head += ["LLM prompts/query", "LLM tokens/query"]
        head += ["s/query p50", "s/query p95"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for s in self.systems:
            row = [s]
            for m in metrics:
                v = self.summary[s][m]
                row.append(f"{_fmt(v['mean'])} [{_fmt(v['ci'][0])}, {_fmt(v['ci'][1])}]")
            c = self.cost[s]
            unknown = " + ?" if c.get("uncounted") else ""
            row += [f"{c['pairs_scored_per_query']:.1f}{unknown}",
                    *([f"{c.get('fid_passages_per_query', 0.0):.1f}"] if with_fid else []),
                    f"{c['model_calls_per_query']:.1f}{unknown}"]
            if with_llm:
                row += [f"{c['llm_calls_per_query']:.1f}",
                        f"{c['llm_prompt_tokens_per_query'] + c['llm_completion_tokens_per_query']:.0f}"]
            row += [_seconds(c["seconds_p50"]), _seconds(c["seconds_p95"])]
            lines.append("| " + " | ".join(row) + " |")
        notes = []
        ds = self._data["dataset"]
        notes.append(f"{ds['questions']} questions of {ds['name']!r} ({ds['format']}); intervals: 95% "
                     "bootstrap over questions.")
        for s, by_metric in self.comparisons.items():
            parts = []
            for m in metrics:
                cmp = by_metric.get(m)
                if not cmp:
                    continue
                p = f", McNemar p = {cmp['mcnemar']['p_value']:.3g}" if "mcnemar" in cmp else ""
                parts.append(f"{m} {cmp['difference']:+.3f} [{cmp['ci'][0]:+.3f}, {cmp['ci'][1]:+.3f}]{p}")
            if parts:
                notes.append(f"{s} vs {self.baseline}: " + "; ".join(parts) + ".")
        partly = [f"{s} ({', '.join(self.cost[s]['uncounted'])})" for s in self.systems
                  if self.cost[s].get("uncounted")]
        if partly:
            notes.append("Pairs and model calls count our stages and the candidates a framework "
                         "reranker (top_n) receives; \"+ ?\": not counted, cost unknown, for "
                         + "; ".join(partly) + ".")
        for s, trace in self.stages.items():
            steps = [f"{x['stage']} {x['units_out_mean']:.1f}"
                     + ("" if x["answer_recall"] is None else f" (answer in {x['answer_recall']:.3f})")
                     for x in trace]
            notes.append(f"{s} per stage (units out; share of questions whose answer is still there): "
                         + " -> ".join(steps) + ".")
        t = self.timing
        if t.get("n_timing"):
            load = t.get("load1") or {}
            notes.append(f"Seconds: {t['n_timing']} questions, systems in round-robin with warm models, "
                         f"{t['cores']} cores available, 1-minute load average "
                         f"{_fmt(load.get('min'), 2)}-{_fmt(load.get('max'), 2)}.")
        if t.get("refused"):
            notes.append(str(t["refused"]))
        return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"

    def plot(self, path: str | os.PathLike, metric: str | None = None) -> Path:
        """Pareto plot: ``metric`` (default :meth:`primary_metric`) against seconds per query
        (p50; left, when timed and not refused) and against pairs scored per query (right).
        The systems that no other system beats on both axes are joined by a line."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        metric = metric or self.primary_metric()
        axes_spec = []
        if all(self.cost[s]["seconds_p50"] is not None for s in self.systems):
            axes_spec.append(("seconds_p50", "seconds per query (p50)"))
        axes_spec.append(("pairs_scored_per_query", "(query, text) pairs scored per query"))
        fig, axes = plt.subplots(1, len(axes_spec), figsize=(6 * len(axes_spec), 4.5), squeeze=False)
        sign = -1.0 if lower_is_better(metric) else 1.0
        for ax, (key, label) in zip(axes[0], axes_spec):
            pts = [(float(self.cost[s][key]), float(self.summary[s][metric]["mean"]), s) for s in self.systems]
            for x, y, s in pts:
                lo, hi = self.summary[s][metric]["ci"]
                unknown = key.startswith("pairs") and bool(self.cost[s].get("uncounted"))
                ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt="o", capsize=3,
                            mfc="none" if unknown else None)  # hollow: part of the cost unknown
                ax.annotate(s + (" (cost partly unknown)" if unknown else ""), (x, y),
                            textcoords="offset points", xytext=(5, 5), fontsize=8)
            front = sorted((p for p in pts if not any(
                (q[0] <= p[0] and sign * q[1] >= sign * p[1]) and (q[0] < p[0] or sign * q[1] > sign * p[1])
                for q in pts)), key=lambda p: p[0])
            ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="grey", linewidth=1)
            ax.set_xscale("symlog" if key.startswith("pairs") else "log")
            ax.set_xlabel(label)
            ax.set_ylabel(metric)
            ax.grid(True, alpha=0.3)
        fig.suptitle(f"{self._data['dataset']['name']}: {metric} vs cost")
        fig.tight_layout()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        fig.savefig(buf, dpi=120, format=out.suffix.lstrip(".") or "png")
        plt.close(fig)
        return write_atomic(out, buf.getvalue())

    def save(self, folder: str | os.PathLike, plot: bool = True, compress: bool = False) -> dict[str, Path]:
        """Write ``report.json`` (with the per-question results), ``report.md`` and, when
        ``plot``, ``pareto.png`` into ``folder``; returns their paths. ``compress`` writes compact
        ``report.json.gz`` instead (per-question results of many systems run to megabytes)."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / ("report.json.gz" if compress else "report.json"), "markdown": out / "report.md"}
        stale = out / ("report.json" if compress else "report.json.gz")
        if stale.is_symlink() or stale.is_file():  # Report.load prefers report.json: never leave an older twin
            stale.unlink()  # (a link is removed itself, its target untouched)
        if compress:
            import gzip

            text = json.dumps(self._data, separators=(",", ":"), default=float)
            write_atomic(paths["json"], gzip.compress(text.encode("utf-8"), mtime=0))
        else:
            write_atomic(paths["json"], json.dumps(self._data, indent=1, default=float).encode("utf-8"))
        write_atomic(paths["markdown"], self.to_markdown().encode("utf-8"))
        if plot:
            paths["plot"] = self.plot(out / "pareto.png")
        return paths

    def __repr__(self) -> str:
        m = self.primary_metric()
        best = ", ".join(f"{s}: {self.summary[s][m]['mean']:.3f}" for s in self.systems)
        return f"Report({m} - {best})"
