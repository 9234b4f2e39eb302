"""Render the results tables of README.md and docs/ from benchmarks/results/*.json.

    python benchmarks/report.py            # rewrite the marked blocks in place
    python benchmarks/report.py --check    # exit 1 when a block is out of date (nothing written)

A block is the text between ``<!-- results:NAME:begin -->`` and ``<!-- results:NAME:end -->``;
everything outside the markers is left alone, so running the script twice changes nothing. No
number in a block is typed by hand: each comes from a JSON file, and every row names the command
that produced it, its sample size and its interval. Where a JSON holds per-question 0/1 outcomes or
a bootstrap interval the row shows that; for a proportion with only its mean and n recorded the
row shows a Wilson 95% interval (marked "Wilson"); where neither is possible the row says so.
A row whose JSON is missing (or lacks the fields) is left out with a warning.

One renderer for all of them: a ``Table`` declares a block (or a part of one) as data: a JSON
file, the column headers, one template per cell (``"{path.to.field:.3f}"``, see ``_Template`` and
``FORMATS``), where its rows come from (``each``, ``labels``), the note before it and the text after
it; ``joined`` puts parts together and ``Table.rows()`` gives README rows. ``HARNESS_BLOCKS`` lists
the blocks that are one ``harness_table`` of an evaluation-harness report, ``README_ROWS`` the README
summary rows. What no template can say (comparisons, statements in words) is a function: registered
with ``@block("name")``, or given to a Table (``each``, ``names``) or a harness table (``after``).
The two markers go in a file of ``FILES``; ``table(header, rows, note)`` renders every table.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))
Row = Sequence[str]   # a README row: what, result, n, interval, command

#: block name -> renderer; filled by ``@block``
BLOCKS: dict[str, Callable[[], str]] = {}


def block(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    """Register the renderer of the block ``<!-- results:NAME:begin/end -->``."""
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        if name in BLOCKS:
            raise ValueError(f"block {name!r} is registered twice ({BLOCKS[name]!r}, {fn!r})")
        BLOCKS[name] = fn
        return fn
    return register


# -- helpers -------------------------------------------------------------------------------------
def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def wilson(p: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p`` observed on ``n`` trials."""
    if n <= 0:
        return (float("nan"), float("nan"))
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (centre - half, centre + half)


def f3(x: float) -> str:
    return f"{x:.3f}"


def ci(lo_hi, digits: int = 3) -> str:
    lo, hi = lo_hi
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], note: str = "") -> str:
    """A markdown table, after ``note`` (a paragraph naming command, sample and interval) if given."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return (note.rstrip() + "\n\n" if note else "") + "\n".join(out)


def bold_best(rows: list[list[str]], columns: Sequence[int]) -> list[list[str]]:
    """``rows`` with, in each of ``columns``, the cells whose leading number is the largest shown in bold
    (every tie; an empty cell is not a number)."""
    for col in columns:
        shown = [float(r[col].split()[0]) if r[col] else None for r in rows]
        top = max((v for v in shown if v is not None), default=None)
        for r, v in zip(rows, shown):
            r[col] = f"**{r[col]}**" if v is not None and v == top else r[col]
    return rows


def secs(x: float) -> str:
    """Seconds for a table cell: two decimals, or two significant digits below 0.01 s."""
    return f"{x:.2g}" if abs(x) < 0.01 else f"{x:.2f}"


#: scripts removed when model building moved to `funnel train` -> the `funnel train` recipe that now makes the model
REMOVED_SCRIPTS = {"squad_ce_model.py": "squad_ce", "prerank_model.py": "scifact_ce"}


def removed_note(text: str) -> str:
    """``text`` (a run's recorded description) with a note where it names a removed script."""
    gone = [s for s in REMOVED_SCRIPTS if s in text]
    return text + (f" (`{gone[0]}` was removed when model building moved to `funnel train`, see git history; the "
                   f"model is now made by `funnel train benchmarks/train/{REMOVED_SCRIPTS[gone[0]]}.toml`, another run)"
                   if gone else "")


# -- tables declared as data: templates over JSON ------------------------------------------------------
class _Missing(str):
    """The text a template shows for a missing value (``{path|text}``), never formatted."""


class _Template(string.Formatter):
    """``str.format`` over JSON: ``{a.b.c:SPEC}`` reads key ``a``, then ``b``, then ``c`` of the row
    (``{^a.b}``: of the whole file; a ``*`` in a path is the row's key; ``{key}``, ``{label}`` and any other
    name given to ``fill``: that value; ``{a|text}``: ``text`` where the value is missing or null). ``SPEC``
    is a format spec or a name of ``FORMATS`` followed by its argument (``{p:wci300}``: a Wilson interval
    over 300; ``{done:if|yes|no}``: ``yes`` where ``done`` is true, else ``no``)."""

    def get_field(self, field_name, args, kwargs):  # type: ignore[override]
        path, bar, default = field_name.partition("|")
        names = kwargs["names"]
        if path in names:
            return names[path], field_name
        try:
            node = lookup(kwargs["root"] if path.startswith("^") else kwargs["row"], path.lstrip("^"),
                          names.get("key", ""))
        except (KeyError, IndexError, TypeError):
            if not bar:
                raise
            node = None
        return (_Missing(default) if bar and node is None else node), field_name

    def format_field(self, value, format_spec):  # type: ignore[override]
        if isinstance(value, _Missing):
            return str(value)
        name = re.match(r"[a-z_]*", format_spec).group(0)  # type: ignore[union-attr]
        if name in FORMATS:
            return FORMATS[name](value, format_spec[len(name):])
        return format(value, format_spec)


#: named formats of a template: value, argument -> text
FORMATS: dict[str, Callable[[Any, str], str]] = {
    "ci": lambda v, spec: "[{}, {}]".format(*(format(x, spec or ".3f") for x in v)),
    "arci": lambda x, _: f"{x['mean']:.3f} {ci(x['ci95'])}",     # mean [95% interval]
    "diff": lambda c, _: f"{c['difference']:+.3f} {ci(c['ci'])}",  # paired difference [95% interval]
    "wci": lambda p, n: f"{ci(wilson(p, int(n)))} (Wilson)",
    "secs": lambda v, _: secs(v),
    "join": lambda v, sep: (sep or ", ").join(map(str, v)),
    "na": lambda v, spec: "n/a" if v is None else format(v, spec),
    "range": lambda v, spec: f"{min(v):{spec}}-{max(v):{spec}}",  # smallest-largest
    "qps": lambda q, _: f"{q:,.0f}" if q >= 10 else f"{q:.1f}",  # queries per second
    "commands": lambda v, _: removed_note("; ".join(f"`{c}`" for c in v)),
    "bare_commands": lambda v, _: removed_note("; ".join(f"`{c.split('#')[0].strip()}`" for c in v)),  # no comments
    "removed": lambda v, _: removed_note(v),
    "if": lambda v, choices: choices.split("|", 2)[1 if v else 2],  # {x:if|text if true|text if not}
    "len": lambda v, _: str(len(v)),
    "below": lambda v, limit: "yes" if v < float(limit) else "no",
    "mega": lambda v, _: f"{v / 1e6:.1f} M",
    "times": lambda v, spec: f"{v:{spec}}×",
    "about": lambda v, _: f"~{round(sum(v.values()) / len(v), -1):.0f}",  # the mean of a dict's values, to tens
    "curve": lambda c, _: ", ".join(f"{x['step']}: {x['loss']:.2f}" for x in (c or [])[:: max(1, len(c or []) // 8)]),
}


def lookup(node: Any, path: str, key: str = "") -> Any:
    """The value at ``path`` in ``node``: keys, or indices of a list, joined by dots; ``*`` stands for ``key``;
    ``field=value`` picks the first item of a list whose ``field`` is ``value`` (``K=5``)."""
    for part in path.split("."):
        part = part.replace("*", key)
        if isinstance(node, list) and "=" in part:
            field, _, value = part.partition("=")
            node = next(item for item in node if str(item[field]) == value)
        else:
            node = node[int(part) if isinstance(node, list) else part]
    return node


def fill(template: str, row: Any = None, root: Any = None, key: str = "", label: str = "", **names: Any) -> str:
    """``template`` with its ``{path:spec}`` fields read from ``row`` (and ``root``, ``key``, ``label``, ``names``)."""
    return _Template().format(template, row=row, root=root, names={"key": key, "label": label, **names})


@dataclass(frozen=True)
class Table:
    """A markdown table read from one JSON file of results/ (``source``: its name, or a function returning
    the data), or from its part ``at`` (a key: a file without it has no table, an empty string; ``{^path}``
    still reads the whole file).

    ``each``: the path of a dict (or list) with a row per item, or a function of the data returning one; each
    row is ``body[0]``'s templates over that item. ``labels`` picks, orders and names (``{label}``) the items
    it finds and, with ``each`` empty, makes a row per label over the whole file (``*`` in a path: the
    label's key). Without either, ``body`` is a list of rows of templates over the whole file. ``note``
    precedes the table and ``after`` follows it, both templates over the file; ``names(data)``: values no
    path reads (derived from the data), by name; ``bold``: the columns whose best (largest) number is in bold.
    A table without rows is left out (an empty string); ``rows()`` is the body alone (README rows)."""

    source: str | Callable[[], Any]
    header: Sequence[str]
    body: Sequence[Sequence[str]]
    each: str | Callable[[Any], Any] | None = None
    labels: dict[str, str] | None = None
    note: str = ""
    after: str = ""
    at: str = ""
    names: Callable[[Any], dict[str, Any]] | None = None
    bold: Sequence[int] = ()

    def __call__(self) -> str:
        parts = self.render()
        return table(*parts[:3]) + parts[3] if parts and parts[1] else ""  # no rows, no table

    def rows(self) -> list[list[str]]:
        parts = self.render()
        return parts[1] if parts else []

    def render(self) -> tuple[list[str], list[list[str]], str, str] | None:
        """The header, rows, note and text after the table (None where the file lacks the part ``at``)."""
        root = load(self.source) if isinstance(self.source, str) else self.source()
        if self.at and self.at not in root:
            return None
        d = root[self.at] if self.at else root
        names = self.names(d) if self.names else {}

        def cells(templates: Sequence[str], row: Any, key: str = "", label: str = "") -> list[str]:
            return [fill(t, row, root, key, label, **names) for t in templates]

        if self.each is None and self.labels is None:
            rows = [cells(row, d) for row in self.body]
        else:
            items = d if self.each is None else self.each(d) if callable(self.each) else lookup(d, self.each)
            keys = list(items) if isinstance(items, dict) else list(range(len(items)))
            labels = self.labels or {}
            if labels:
                keys = [k for k in labels if self.each is None or k in keys]
            rows = [cells(self.body[0], d if self.each is None else items[k], str(k), labels.get(str(k), ""))
                    for k in keys]
        note, after = (fill(text, d, root, **names) for text in (self.note, self.after))
        return cells(self.header, d), bold_best(rows, self.bold), note, after


def joined(*parts: Callable[[], str]) -> Callable[[], str]:
    """A block of several parts (tables, statements), a blank line between two; an empty part is left out."""
    return lambda: "\n\n".join(text for text in (part() for part in parts) if text)


# -- reports of the evaluation harness (`funnel eval`, funnel_core.evaluation.evaluate) -------------
@functools.cache
def harness(name: str) -> dict:
    """``results/<name>/report.json[.gz]``: what ``Report.save`` wrote, per-question results included.
    Read once per process and shared by every renderer (which only read it: never change it)."""
    from funnel_core.evaluation import Report

    folder = RESULTS / name
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} holds no harness report")
    return Report.load(folder).to_dict(copy=False)  # the Report is not kept: nothing else holds the dict


def harness_command(d: dict) -> str:
    return f"`{d['command']}`" if "command" in d else f"`funnel eval {d['config']['path']}`"


def harness_label(d: dict, system: str, labels: dict[str, str] | None) -> str:
    """The row label of ``system``; a setting the run tuned names its value and where it was chosen."""
    label = (labels or {}).get(system) or f"`{system}`"
    t = d.get("tuning", {}).get(system)
    return label + (f" ({t['setting']} = {t['chosen']}, chosen on the {t['questions']} questions of "
                    f"`{t['split']}` by {t['metric']})" if t else "")


def harness_timing(d: dict) -> str:
    t = d["timing"]
    if not t.get("n_timing"):
        return "seconds not measured in this run"
    if t.get("refused"):
        return t["refused"]
    lq = t.get("load1") or {}
    threads = (f" ({t['threads']} torch thread{'s' if t['threads'] > 1 else ''} while timing)"
               if t.get("threads") else "")
    return (f"seconds: {t['n_timing']} questions, systems round-robin with warm models, {t['cores']} cores{threads}, "
            f"1-minute load average {lq.get('min', float('nan')):.2f}-{lq.get('max', float('nan')):.2f}")


def harness_table(name: str, metrics: Sequence[str] | None = None,
                  labels: dict[str, str] | Callable[[dict], dict[str, str]] | None = None, *,
                  bold: Sequence[str] = (), vs_baseline: str | None = None, digits: int = 3,
                  command: str | None = None, after: Callable[[dict], str] | None = None) -> str:
    """Any harness report as one table: a row per system (``labels``, or ``labels(report)``, picks, orders
    and names them), each metric the run computed as its mean and 95% bootstrap interval (the best mean of
    a ``bold`` metric in bold), the paired difference against the baseline in ``vs_baseline``, and pairs
    scored and seconds per query where the run counted or timed them; the note names the questions, the
    command (``command``: a script that ran the harness) and the timing. ``after(report)``: text derived
    from the same report, after the table."""
    d = harness(name)
    summ, cost = d["summary"], d["cost"]
    labels = labels(d) if callable(labels) else labels
    systems = [s for s in (labels or summ) if s in summ]
    metrics = [m for m in metrics or d["metrics"] if m in d["metrics"]]
    dig = {m: 1 if m.startswith("words") else digits for m in metrics}  # words: one decimal
    pairs = any(cost[s]["pairs_scored_per_query"] for s in systems)
    fid = any(cost[s].get("fid_passages_per_query") for s in systems)
    timed = any(cost[s]["seconds_p50"] is not None for s in systems)
    head = ["system", *metrics] + ([f"{vs_baseline} minus `{d['baseline']}` (paired)"] if vs_baseline else [])
    head += (["pairs/query"] if pairs else []) + (["of which FiD passages"] if fid else [])
    head += ["s/query p50", "s/query p95"] if timed else []
    rows = []
    for s in systems:
        row = [harness_label(d, s, labels)] + [f"{summ[s][m]['mean']:.{dig[m]}f} {ci(summ[s][m]['ci'], dig[m])}"
                                               for m in metrics]
        if vs_baseline:
            c = d["comparisons"].get(s, {}).get(vs_baseline)
            row.append(f"{c['difference']:+.{dig[vs_baseline]}f} {ci(c['ci'], dig[vs_baseline])}" if c else "")
        row += [f"{cost[s]['pairs_scored_per_query']:.0f}"] if pairs else []
        row += [f"{cost[s].get('fid_passages_per_query', 0):.0f}"] if fid else []
        row += [secs(cost[s][k]) if cost[s][k] is not None else "" for k in ("seconds_p50", "seconds_p95") if timed]
        rows.append(row)
    bold_best(rows, [1 + i for i, m in enumerate(metrics) if m in bold])
    ds = d["dataset"]
    tail = after(d) if after else ""
    return table(head, rows, f"{ds['questions']:,} questions of `{ds['name']}`, 95% bootstrap intervals over "
                             f"questions; command: {command or harness_command(d)}; {harness_timing(d)}.") + (
        f"\n\n{tail}" if tail else "")


def harness_row(name: str, what: str, metrics: Sequence[str], labels: dict[str, str],
                command: str | None = None) -> Row:
    """One README row from a harness report: each metric of the ``labels`` systems (the first in bold),
    with the first system's interval of the first metric; ``command``: a script that ran the harness."""
    d = harness(name)
    summ, first = d["summary"], next(iter(labels))
    def cell(s: str, m: str, label: str) -> str:
        text = f"{label} {summ[s][m]['mean']:.{1 if m.startswith('words') else 3}f}"
        return f"**{text}**" if (s, m) == (first, metrics[0]) else text

    result = "; ".join(f"{m} " + ", ".join(cell(s, m, label) for s, label in labels.items()) for m in metrics)
    return (what, result, f"{d['dataset']['questions']:,} questions",
            f"{labels[first]}: {ci(summ[first][metrics[0]]['ci'])} (bootstrap)", command or harness_command(d))


# -- the large SQuAD benchmark (bench_squad_large.py; its seconds from time_squad_large.py) ------------
TIMING_KEYS = ("seconds_p50", "seconds_p95", "seconds_mean", "timed_questions", "reranked_units_per_query_real",
               "pairs_scored_per_query_real", "model_calls_per_query_real", "AR@4_hit_agreement_real_vs_cached")


def merge_timing(res: dict, harness: dict) -> dict:
    """``squad_large.json`` with the seconds, counts and load of the evaluation harness's timing report
    (``squad_large_timing.json``, written by ``time_squad_large.py``). A report whose seconds the harness
    withheld (load average above its limit) changes nothing."""
    if harness.get("format") != "funnel-rag-eval/1":
        raise ValueError(f"not an evaluation-harness report (format {harness.get('format')!r}).")
    if harness["timing"].get("refused"):
        return res
    res, t = json.loads(json.dumps(res)), harness["timing"]
    agree = harness.get("AR@4_hit_agreement_real_vs_cached", {})
    for name, row in res["systems_dev_a"].items():
        for k in TIMING_KEYS:
            row.pop(k, None)
        c = harness["cost"].get(name)
        if c and c["seconds_p50"] is not None:
            row.update({k: c[k] for k in ("seconds_p50", "seconds_p95", "seconds_mean", "timed_questions")},
                       pairs_scored_per_query_real=c["pairs_scored_per_query"],
                       model_calls_per_query_real=c["model_calls_per_query"])
            if name in agree:
                row["AR@4_hit_agreement_real_vs_cached"] = agree[name]
    res["samples"]["dev_a_timing"] = t["n_timing"]
    res["load_average_before_timing"] = [harness["load_average_before"]]
    res["load_average_after_timing"] = [harness["load_average_after"]]
    res["load_average_per_question"] = {**(t.get("load1") or {}), "n": t["n_timing"]}
    res["timing_run"] = {"command": harness.get("command", "python benchmarks/time_squad_large.py"),
                         "cores": harness["cores_available"], "max_load": t["max_load"],
                         "report": "benchmarks/results/squad_large_timing.json"}
    return res


def large() -> dict:
    """The large SQuAD comparison: quality from ``squad_large.json``; seconds from the harness's
    ``squad_large_timing.json`` when a run wrote one (else the older timing in ``squad_large.json``)."""
    res = load("squad_large.json")
    if (RESULTS / "squad_large_timing.json").exists():
        res = merge_timing(res, load("squad_large_timing.json"))
    return res


def large_cmd(d: dict) -> str:
    return f"`{d['command']}` (see docs/benchmarks.md)"


def of_kind(rows: dict, kind: str, timed: bool = False) -> dict:
    """The systems of ``rows`` of one kind (first stage, flat, funnel); with ``timed``, only those timed."""
    return {n: r for n, r in rows.items() if r["kind"] == kind and (not timed or "seconds_p50" in r)}


def _system(x: dict, side: str = "flat", name: str | None = None) -> str:
    """``x``'s flat system (or, with ``side="funnel"``, the funnel ``name``): name, AR@4 and seconds."""
    return f"`{name or x[side]}` (AR@4 {f3(x[f'AR@4_{side}'])}, {x[f'seconds_p50_{side}']:.2f} s/query)"


def _diff(x: dict) -> str:
    diff, mc = x["AR@4_difference"], x["mcnemar_exact"]
    return (f"AR@4 funnel - flat **{diff['difference']:+.3f}** (paired bootstrap 95% {ci(diff['ci'])}; McNemar "
            f"exact p = {mc['p_value']:.3g}, {mc['a_only']} vs {mc['b_only']} discordant questions)")


def large_plain(d: dict) -> list[str]:
    """Where the funnel beats the best flat system and where it does not, in plain words, from the JSON:
    at equal AR@4 the time ratio, at equal time the AR@4 difference with its interval."""
    c, rows = d["comparison"], d["systems_dev_a"]
    f = c["funnel"]
    fr = rows[f]
    out = []
    if "equal_AR@4" in c:
        x = c["equal_AR@4"]
        ratio = x["time_ratio_funnel_over_flat"]
        who = ("the fastest flat system with at least the funnel's AR@4" if x.get("flat_reaches_funnel_AR@4") else
               "no flat system reaches the funnel's AR@4; the most accurate one")
        out.append(f"**At equal AR@4 the funnel is {'faster' if ratio < 1 else 'slower'}**: the funnel chosen on "
                   f"train, {_system(x, 'funnel', f)}, takes **{ratio:.2f}x the time** of {who}, {_system(x)}; "
                   f"{_diff(x)}.")
    if "equal_time" in c:
        x = c["equal_time"]
        lo, hi = x["AR@4_difference"]["ci"]
        verdict = ("the funnel is more accurate" if lo > 0 else "the funnel is less accurate" if hi < 0
                   else "no difference the sample can resolve")
        who = ("the most accurate flat system no slower than the funnel" if x.get("flat_within_funnel_time") else
               "every flat system is slower than the funnel; the fastest")
        out.append(f"**At equal time, {verdict}**: against {who}, {_system(x)}, {_diff(x)}; the funnel takes "
                   f"{x['time_ratio_funnel_over_flat']:.2f}x its time.")
    flats, funnels = of_kind(rows, "flat", timed=True), of_kind(rows, "funnel", timed=True)
    undominated = [n for n, r in funnels.items()
                   if not any(o["AR@4"] >= r["AR@4"] and o["seconds_p50"] <= r["seconds_p50"] for o in flats.values())]
    out.append(f"Of the {len(funnels)} timed funnel configurations, "
               + (f"{len(undominated)} are not matched by a flat system at least as accurate in at most their time: "
                  + ", ".join(f"`{n}`" for n in undominated) + "."
                  if undominated else
                  f"none beats the flat systems: for each, a flat system (of {len(flats)} timed) is at least as "
                  "accurate in at most its time."))
    allflat = of_kind(rows, "flat")
    reach = [n for n in allflat if allflat[n]["AR@4"] >= fr["AR@4"]]
    if reach:  # the cost that does not depend on the machine
        cheapest = min(reach, key=lambda n: allflat[n]["pairs_per_query"])
        cr = allflat[cheapest]
        out.append(f"In cross-encoder pairs per query (independent of the machine): the cheapest flat system with at "
                   f"least the funnel's AR@4 is `{cheapest}` (AR@4 {f3(cr['AR@4'])} with {cr['pairs_per_query']:.0f} "
                   f"pairs/query) against {fr['pairs_per_query']:.0f} pairs/query for `{f}` "
                   f"({fr['pairs_per_query'] / max(cr['pairs_per_query'], 1e-9):.1f}x the pairs).")
    else:
        best = max(allflat, key=lambda n: allflat[n]["AR@4"])
        out.append(f"No flat system reaches the funnel's AR@4 ({f3(fr['AR@4'])}); the best flat system is `{best}` "
                   f"({f3(allflat[best]['AR@4'])}, {allflat[best]['pairs_per_query']:.0f} pairs/query vs "
                   f"{fr['pairs_per_query']:.0f}).")
    return out


def large_nearest(d: dict) -> list[str]:
    """The paired comparisons the issue asks for: the flat system nearest in AR@4, nearest in time, best."""
    c, rows = d["comparison"], d["systems_dev_a"]
    out = [f"Against {label}, {_system(c[key])}, the funnel {_system(c[key], 'funnel', c['funnel'])}: "
           f"{_diff(c[key])} at **{c[key]['time_ratio_funnel_over_flat']:.2f}x** the time."
           for key, label in (("nearest_in_AR@4", "the flat system nearest in AR@4"),
                              ("nearest_in_time", "the flat system nearest in time"),
                              ("best_flat", "the most accurate flat system")) if key in c]

    def best(kind: str) -> str:
        name, r = max(of_kind(rows, kind).items(), key=lambda item: item[1]["AR@4"])
        return f"`{name}` {f3(r['AR@4'])} {ci(r['AR@4_ci95'])}"

    return out + [f"Highest AR@4 of any flat system: {best('flat')}; of any funnel: {best('funnel')}."]


def timing_note(d: dict) -> str:
    """How the seconds of the large benchmark were measured (after "time: ")."""
    s, run = d["samples"], d["timing_run"]
    lq = d.get("load_average_per_question") or {}
    per_q = (f"; 1-minute load average over the timed questions: median {lq['median']:.1f}, range "
             f"{lq['min']:.1f}-{lq['max']:.1f}" if lq else "")
    where, fmt = (f"{run['cores']} cores", ".1f") if "cores" in run else ("the 2 shared cores", ".0f")
    return (f"median (p50) and p95 over {s['dev_a_timing']} dev-a questions, systems run round-robin per "
            f"question, warm models, `{run['command']}` (load average {d['load_average_before_timing'][0]:{fmt}} "
            f"before and {d['load_average_after_timing'][0]:{fmt}} after on {where}{per_q})")


@block("large-summary")
def block_large_readme() -> str:
    d = large()
    s = d["samples"]
    return "\n\n".join(f"- {x}" for x in large_plain(d)) + (
        f"\n\n(SQuAD train + dev-a corpus, {d['corpus']['passages']:,} passages; AR@4 on {s['dev_a_report']:,} dev-a "
        f"questions; time: {timing_note(d)}; choices tuned on {s['train_tuning']} train questions; full table, plot "
        "and method in [docs/benchmarks.md](docs/benchmarks.md).)")


@block("large-comparison")
def block_large_comparison() -> str:
    d = large()
    return "\n".join(f"- {s}" for s in large_plain(d) + large_nearest(d))


KINDS = ["first stage", "flat", "funnel"]


def large_systems_in_order(d: dict) -> dict:
    """The systems of the large benchmark: first stages, flat systems, then funnels, each in natural order."""
    rows = d["systems_dev_a"]

    def natural(name: str) -> list:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]

    return {n: rows[n] for n in sorted(rows, key=lambda n: (KINDS.index(rows[n]["kind"]), natural(n)))}


block("large-systems")(Table(
    large, ["system", "kind", "AR@1", "AR@2", "AR@3", "AR@4", "AR@4 95% CI (bootstrap)", "AR@10", "AR@20",
            "CE pairs/query", "s/query p50", "s/query p95"],
    [["`{key}`", "{kind}", "{AR@1:.3f}", "{AR@2:.3f}", "{AR@3:.3f}", "{AR@4:.3f}", "{AR@4_ci95:ci}", "{AR@10|:.3f}",
      "{AR@20|:.3f}", "{pairs_per_query:.0f}", "{seconds_p50|:.3f}", "{seconds_p95|:.3f}"]],
    each=large_systems_in_order, names=lambda d: {"timing": timing_note(d)},
    note="{samples.dev_a_report:,} dev-a questions (AR); command: `{command}` (see docs/benchmarks.md). Best funnel "
         "chosen on {samples.train_tuning} train questions: `{best_funnel_chosen_on_train}`. Hybrid alpha (train): "
         "{hybrid.alpha}. HNSW recall@100 vs exact search: {dense.recall@100_hnsw_vs_exact:.3f}. Time: {timing}; "
         "systems with no time were not timed."))


@block("large-cluster-recall")
def block_large_cluster_recall() -> str:
    """Answer recall of the documents in the top-K clusters against as many from flat retrieval, per S."""
    d = large()
    tables = [table(["K clusters", "documents", "answer recall, clusters", "95% CI (bootstrap)",
                     "flat BM25, same #docs", "flat dense, same #docs", "clusters - BM25 (paired 95% CI)"],
                    [[fill(t, r) for t in ("{K}", "{mean_documents:.1f}", "{clusters:.3f}", "{clusters_ci95:ci}",
                                           "{flat_bm25_documents:.3f}", "{flat_dense_documents:.3f}",
                                           "{clusters_minus_bm25:diff}")] for r in rows],
                    fill("**S = {S}** ({clusters|?} clusters, {mean_documents_per_cluster|nan:.2f} documents each on "
                         "average)", d["corpus"]["clusters"].get(s, {}), S=s))
              for s, rows in d["cluster_recall_dev_a"].items()]
    return (f"Answer recall of the documents inside the top-K clusters vs the same number of documents from flat "
            f"BM25 over documents and from dense MiniLM (documents ranked by their best passage), "
            f"{d['samples']['dev_a_report']:,} dev-a questions; command: {large_cmd(d)}.\n\n" + "\n\n".join(tables))


def squad_large_rows() -> list[Row]:
    """The README rows of the large benchmark: the best flat system, two cheap ones, the funnel chosen on
    train and the preset; the answer recall of the top-5 clusters."""
    d = large()
    r, s = d["systems_dev_a"], d["samples"]
    best_flat = max(of_kind(r, "flat"), key=lambda k: r[k]["AR@4"])
    preset = next(k for k in r if "preset" in k)
    out = []
    for name in dict.fromkeys([best_flat, "hybrid -> CE@10", "bm25 -> CE@20", d["best_funnel_chosen_on_train"],
                               preset]):
        if name in r:
            x = r[name]
            t = f", {x['seconds_p50']:.2f} s/query p50" if "seconds_p50" in x else ""
            out.append((f"large SQuAD corpus ({d['corpus']['passages']:,} passages): `{name}`",
                        f"AR@4 **{f3(x['AR@4'])}**, AR@1 {f3(x['AR@1'])}, {x['pairs_per_query']:.0f} CE pairs/query{t}",
                        f"{s['dev_a_report']:,} dev-a q ({s['dev_a_timing']} timed)",
                        ci(x["AR@4_ci95"]) + " (bootstrap)", large_cmd(d)))
    k5 = next((row for row in d["cluster_recall_dev_a"].get("4096", []) if row["K"] == 5), None)
    if k5:
        out.append(("large SQuAD corpus: answer recall in top-5 clusters (S=4096) vs flat BM25 documents",
                    f"{f3(k5['clusters'])} at {k5['mean_documents']:.1f} documents vs {f3(k5['flat_bm25_documents'])}",
                    f"{s['dev_a_report']:,} dev-a q", ci(k5["clusters_ci95"]) + " (bootstrap)", large_cmd(d)))
    return out


block("large-ce")(Table("squad_ce_training.json", ["what", "value"], [
    ["init", "{init}"],
    ["training questions", "{groups:,} groups from {train_questions_sampled:,} sampled SQuAD train questions (the "
                           "400 tuning questions excluded)"],
    ["positives / negatives", "{positives}; {negatives}"],
    ["steps, time", "{steps:,} steps, {train_seconds:.0f} s ({gpu|CPU}, {dtype})"],
    ["listwise loss, first / last 50 steps", "{loss_first50:.3f} / {loss_last50:.3f} (chance ln 6 = 1.792)"],
    ["loss curve (step: loss)", "{loss_curve|:curve}"], ["where", "{where_trained|}"],
    ["command", "{commands|:commands}"]]))


# -- clustering at scale (bench_cluster_scale.py) ------------------------------------------------------
def cluster_rows(c: dict) -> list[dict]:
    """Every row of cluster_scale.json (the runs squad, before and after first) with its run's name, its
    command (rebuilt from the arguments the run recorded), its peak RSS in GiB and the seconds of
    Algorithm 1 and the cluster units together."""
    order = ["squad", "before", "after"]
    out = []
    for name in sorted(c["runs"], key=lambda n: order.index(n) if n in order else len(order)):
        a = c["runs"][name].get("args", {})
        for r in c["runs"][name]["rows"]:
            steps = r.get("step_seconds", {})
            command = ["python benchmarks/bench_cluster_scale.py",
                       "--squad" if a.get("squad") else f"--sizes {r['n_documents']}"]
            command += [f"--label {a['label']}"] if a.get("label") else []
            if a.get("code_root"):
                old = f"a worktree at {a['code_commit']}" if a.get("code_commit") else "older code"
                command.append(f"--code-root OLD_CODE ({old})")
            units = steps["algorithm1"] + steps["cluster_units"] if "algorithm1" in steps else None
            out.append({**r, "run": name, "command": " ".join(command), "peak_rss_gib": r["peak_rss_mib"] / 1024,
                        "units_seconds": units})
    return out


def cluster_full_rows(c: dict) -> list[dict]:
    """The rows that ran the target size end to end."""
    return [r for r in cluster_rows(c) if r["n_documents"] == c["target"]["n_documents"] and r.get("pipeline_seconds")]


def cluster_scale_statements() -> str:
    """Whether each end-to-end run at the target size met the target, then each run's power-law fits and
    its estimate of the Ray engine at FunnelRAG's 21M documents."""
    c = load("cluster_scale.json")
    tgt = c["target"]
    out = []
    for r in cluster_full_rows(c):
        steps = r["step_seconds"]
        slowest = max(steps, key=steps.get)
        out.append(f"At {r['n_documents']:,} documents (`{r['run']}`) the pipeline ran end to end in "
                   f"**{r['pipeline_seconds']:.0f} s** wall "
                   f"({'meets' if r['pipeline_seconds'] <= tgt['seconds'] else 'misses'} the {tgt['seconds']} s "
                   f"target; {r['cpu_seconds']:.0f} CPU seconds) with **{r['peak_rss_gib']:.1f} GiB** peak RSS "
                   f"({'meets' if r['peak_rss_gib'] <= tgt['peak_rss_gib'] else 'misses'} the {tgt['peak_rss_gib']} "
                   f"GiB target); the slowest step is `{slowest}` ({steps[slowest]:.0f} s, "
                   f"{steps[slowest] / r['pipeline_seconds']:.0%}).")
    for name, run in c["runs"].items():
        fits, ex = run.get("cpu_fits") or {}, run.get("extrapolation_21M_cpu") or {}
        fits = {k: v for k, v in fits.items() if v}
        if fits and ex:
            sizes = sorted({n for v in fits.values() for n in v["sizes"]})
            out.append(f"Power-law fits of CPU seconds `t = a * n^b` over {' and '.join(f'{n:,}' for n in sizes)} "
                       f"documents (`{name}`): " + ", ".join(f"`{k}` b = {v['exponent']:.2f}" for k, v in fits.items())
                       + f". Extrapolated to FunnelRAG's 21M documents: **{ex['cpu_hours_fitted_steps']:,.0f} CPU "
                       f"hours**, dominated by `{ex['dominant_step']}` ({len(sizes)} sizes per fit: a rough "
                       "extrapolation).")
        if ray := run.get("ray_21M"):
            measured = ", ".join(f"{int(n):,} documents {s:.2f} s" for n, s in
                                 sorted(ray["measured_cpu_seconds_per_block"].items(), key=lambda x: int(x[0])))
            hours = ", ".join(f"{h:,.1f} h on {int(w):,} workers" for w, h in
                              sorted(ray["wall_hours_by_workers"].items(), key=lambda x: int(x[0])))
            out.append(f"The Ray engine at 21M documents (`{name}`): its kNN tasks run the same kernel on blocks of "
                       f"{ray['rows_per_block']:,} rows. CPU seconds per block, measured: {measured}; fitted "
                       f"`a * n^b` over the documents (total kNN CPU seconds b = {ray['fit_exponent']:.2f}) and taken "
                       f"at 21M: **{ray['cpu_seconds_per_block_at_21M']:,.1f} CPU s per block** x {ray['blocks']:,} "
                       f"blocks = {hours} (one core per worker; scheduling and shipping the weight matrix to the "
                       "workers not counted; the synthetic corpus has a fixed vocabulary, so posting lists grow with "
                       "n: the worst case for this step).")
    return "\n\n".join(out)


block("cluster-scale")(joined(Table(
    "cluster_scale.json", ["run", "corpus", "documents", "BM25 index s", "kNN graph s", "Algorithm 1 + units s",
                           "cluster index s", "pipeline s (wall)", "CPU s", "peak RSS GiB", "load avg", "clusters",
                           "command"],
    [["`{run}`", "{corpus|synthetic}", "{n_documents:,}", "{step_seconds.bm25_index|:.0f}",
      "{step_seconds.knn_graph|:.0f}", "{units_seconds|:.0f}", "{step_seconds.cluster_index|:.0f}",
      "{pipeline_seconds|not run in full:.0f}", "{cpu_seconds|:.0f}", "{peak_rss_gib:.2f}",
      "{load_average_at_start.0:.1f}", "{n_clusters|:,}", "`{command}`"]], each=cluster_rows,
    note="The real clustering pipeline (BM25 index -> BM25 kNN graph -> Algorithm 1 + cluster units -> cluster BM25 "
         "index), one subprocess per row, wall-clock seconds per step on the 2 shared cores (the 1-minute load "
         "average at the start is in the table; the process CPU seconds do not depend on it), one run per row, so no "
         "interval. `before` rows run the code as it was before the clustering speed work (`--code-root`, a worktree "
         "at the commit the command names), `after` rows the current code. Target: {target.n_documents:,} documents "
         "in under {target.seconds} s and {target.peak_rss_gib} GiB peak RSS."), cluster_scale_statements))


# -- backends: Milvus Lite against the in-memory indexes (docs/scaling_out.md, bench_milvus.py) ------------
def pair(label: str, left: str, right: str, spec: str = ".3f") -> list[str]:
    """A row of the two engines' values: the fields ``left`` and ``right`` ("": an empty cell; null: n/a)."""
    return [label, *(f"{{{key}:na{spec}}}" if key else "" for key in (left, right))]


def per_framework(label: str, field: str, spec: str = ".3f", missing: str = "n/a") -> list[str]:
    """A row of ``field`` for LlamaIndex and LangChain, each in memory and on Milvus Lite."""
    return [label, *(f"{{{fw}.{where}_{field}|{missing}:{spec}}}" for fw in ("llamaindex", "langchain")
                     for where in ("memory", "milvus"))]


def overlap(part: str = "") -> str:
    """The template of the mean top-10 overlap and the share of identical top-10 lists (of ``part``)."""
    return f"{{{part}mean_top10_overlap:na.3f}} / {{{part}identical_top10_share:na.3f}}"


MILVUS_HEAD = ["", "bm25s (in memory)", "Milvus Lite"]
LOADS = "load average {load_average_before.0:na.1f} -> {load_average_after.0:na.1f}"
MILVUS_SCIFACT = Table("milvus.json", MILVUS_HEAD, [
    pair("flat BM25 nDCG@10", "bm25s.ndcg@10", "milvus.ndcg@10"),
    pair("flat BM25 Recall@100", "bm25s.recall@100", "milvus.recall@100"),
    ["flat top-10 overlap (mean / identical lists)", "", overlap("flat.")],
    ["largest relative score difference", "", "{flat.max_relative_score_difference:.1e}"],
    ["clustered: top-10 cluster overlap (mean / identical lists), {n_clusters} clusters", "",
     overlap("clusters.")],
    pair("clustered: documents of top-2 clusters nDCG@10", "clustered_docs_top2_clusters.bm25s.ndcg@10",
         "clustered_docs_top2_clusters.milvus.ndcg@10"),
    pair("flat build seconds", "bm25s_build_seconds", "milvus_build_seconds", ".1f"),
    pair("clustered build (bm25s: cluster + index; Milvus: upload) seconds", "clustered_bm25s_build_seconds",
         "clustered_milvus_upload_seconds", ".1f"),
    pair("flat queries/s, one query per call", "bm25s_qps_single", "milvus_qps_single", ".0f"),
    pair("flat queries/s, batched", "bm25s_qps_batched", "milvus_qps_batched", ".0f"),
    pair("clustered queries/s (top-10 clusters opened)", "clustered_bm25s_qps", "clustered_milvus_qps", ".0f"),
    *(pair(f"{kind} queries/s with a {n}-value dict filter", f"{kind}_bm25s_filtered_qps_{n}_values",
           f"{kind}_milvus_filtered_qps_{n}_values", ".1f") for n in (1, 10) for kind in ("flat", "clustered"))],
    at="scifact", note=f"SciFact test, {{n_queries}} queries, {{n_documents}} documents ({LOADS} on 2 cores):")


def milvus_synthetic(part: str, memtable_mib: int | None) -> Table:
    """The synthetic-corpus table of one part of milvus.json (a run with a larger write buffer says so)."""
    raised = ("Same, with Milvus Lite's write buffer raised to {args.memtable_mib} MiB (`--memtable-mib "
              "{args.memtable_mib}`; data files: {milvus_lite_segments|None}):\n\n" if memtable_mib else "")
    return Table("milvus.json", MILVUS_HEAD, [
        pair("build seconds", "bm25s_build_seconds", "milvus_build_seconds", ".1f"),
        pair("queries/s, one query per call", "bm25s_qps_single", "milvus_qps_single", ".1f"),
        pair("queries/s, batches of 25", "", "milvus_qps_batched", ".1f"),
        ["top-10 overlap (mean / identical lists)", "", overlap()],
        ["largest relative score difference", "", "{max_relative_score_difference:.1e}"],
        ["Milvus Lite data files (segments; BM25 statistics are per segment)", "", "{milvus_lite_segments|None}"]],
        at=part, note=raised + f"{{n_documents:,}} synthetic documents of {{words_per_document}} words, "
                               f"{{n_queries}} queries ({LOADS}):")


MILVUS_DENSE = Table("milvus.json", ["", "numpy exact (in memory)", "Milvus Lite HNSW"], [
    pair("nDCG@10", "numpy_exact.ndcg@10", "milvus_hnsw.ndcg@10"),
    pair("Recall@100", "numpy_exact.recall@100", "milvus_hnsw.recall@100"),
    ["top-10 overlap (mean / identical lists)", "", overlap()],
    pair("insert seconds (embeddings precomputed)", "", "milvus_hnsw_insert_seconds", ".1f"),
    pair("queries/s, one query per call", "numpy_qps_single", "milvus_qps_single", ".0f")],
    at="dense", note="Dense ({model}), SciFact test, {n_queries} queries, {n_documents} documents{subset:if| (a "
                     f"subset: the judged documents plus others)|}} ({LOADS}):")
MILVUS_FRAMEWORKS = Table("milvus.json", ["", "LlamaIndex in memory", "LlamaIndex on Milvus Lite",
                                          "LangChain in memory", "LangChain on Milvus Lite"], [
    per_framework("nDCG@10", "ndcg@10"),
    ["identical top-10 lists (Milvus vs memory)", "", "{llamaindex.identical_top10_share|n/a:.3f}", "",
     "{langchain.identical_top10_share|n/a:.3f}"],
    per_framework("build seconds", "build_seconds", ".1f"),
    per_framework("queries/s (retrieve / invoke)", "qps", ".0f"),
    per_framework("persist / save: seconds", "persist_seconds", ".2f"),
    per_framework("persist / save: bytes written", "persisted_bytes", ",", missing="0"),
    per_framework("re-open (from_persist_dir / load) + first query: seconds", "reopen_seconds", ".2f")],
    at="frameworks", note="Through the frameworks: the BM25 retrievers of both adapters on SciFact test ({n_queries} "
                          "queries, {n_documents} documents, top 10), built in memory or with "
                          f"`backend=MilvusBackend(...)` ({LOADS}):")


@block("milvus")
def block_milvus() -> str:
    """The Milvus Lite backends against the in-memory ones: a table per part the run measured, then the
    command of each part."""
    r = load("milvus.json")
    synthetic = [milvus_synthetic(k, r[k].get("args", {}).get("memtable_mib")) for k in r if k.startswith("synthetic")]
    cmds = []
    for key in [k for k in r if k.split("_memtable")[0] in ("scifact", "synthetic", "dense", "frameworks")]:
        a = r[key].get("args", {})
        cmds.append(f"`python benchmarks/bench_milvus.py --data ../shared/data --parts {key.split('_memtable')[0]}"
                    + (f" --memtable-mib {a['memtable_mib']}" if a.get("memtable_mib") else "")
                    + (f" --dense-docs {a['dense_docs']}" if a.get("dense_docs") and key.startswith("dense") else "")
                    + "`")
    v = r.get("versions", {})
    return joined(MILVUS_SCIFACT, *synthetic, MILVUS_DENSE, MILVUS_FRAMEWORKS)() + (
        f"\n\npymilvus {v.get('pymilvus')}, milvus-lite {v.get('milvus_lite')}; one run each of {', '.join(cmds)}.")


# -- BM25 (bench_bm25.py), runtimes, engines, ANN, the demo, dtypes ------------------------------------------
#: our BM25 index, llama-index-retrievers-bm25 and LangChain's community BM25, as bench_bm25.py names them
BM25_SYSTEMS = ("ours", "llama_index_bm25", "langchain_community")


@block("clustering-scifact")
def block_clustering_scifact() -> str:
    """docs/clustering.md: flat BM25 on SciFact (its harness report), our BM25 index against
    llama-index-retrievers-bm25 and LangChain's community BM25, and the clusters of SciFact."""
    b, f = load("bm25.json"), harness("scifact_fusion")
    c, rec, docs = b["clustered"], b["clustered"]["recall_at_k_clusters"], b["speed_synthetic"]["n_documents"]

    def three(part: str, field: str) -> str:  # ours / llama-index-retrievers-bm25 / LangChain community
        return " / ".join(fill(f"{{{field}}}", b[part]["systems"][s]) for s in BM25_SYSTEMS)

    rows = [["flat BM25, SciFact test nDCG@10 / Recall@100 (95% bootstrap intervals)",
             fill("{ndcg@10.mean:.3f} {ndcg@10.ci:ci} / {recall@100.mean:.3f} {recall@100.ci:ci}", f["summary"]["bm25"])
             + f" ({f['dataset']['questions']} test queries, {harness_command(f)})"],
            [f"queries/s, SciFact ({b['speed_scifact']['n_documents']:,} docs): ours / llama-index-retrievers-bm25 / "
             "LangChain community", f"{three('speed_scifact', 'qps:qps')} "
                                    f"({three('speed_scifact', 'queries_timed')} queries timed, one run)"],
            [f"queries/s, {docs:,} synthetic docs", three("speed_synthetic", "qps:qps")],
            [f"peak memory building the {docs:,}-doc index (tracemalloc)",
             three("speed_synthetic", "peak_build_mib:.0f") + " MiB"],
            ["SciFact clusters (S = 4096)", f"{c['n_clusters']} clusters for {c['n_documents']:,} docs "
             f"({c['compression']:.1f}x), {c['tokens_per_cluster']['mean']:,.0f} tokens each on average"],
            [f"recall of relevant docs in the top-{' / '.join(str(r['k_clusters']) for r in rec)} clusters (interval "
             "not recorded)", " / ".join(f"{r['recall_clustered']:.3f}" for r in rec) + " (flat BM25 at the same "
             "number of docs: " + " / ".join(f"{r['recall_flat_same_docs']:.3f}" for r in rec) + ")"]]
    rows += [[f"clustering time, {r['n_documents']:,} synthetic docs (BM25 index + kNN graph + Algorithm 1)",
              f"{r['total_seconds']:.1f} s"] for r in b.get("clustering_scale", [])]
    return table(["measurement", "result"], rows)


CE_BACKENDS_NOTES = """\
Speed: the first {settings.timing_queries} SciFact test queries (sorted ids), BM25 top-{settings.timing_depth} each, \
every runtime, interleaved per query. nDCG@10: BM25 top-{settings.depth} reranked (rest of the top-100 in BM25 \
order), over the test queries counted in the table (of {queries}), for {settings.ndcg_runtimes:join}; loss measured \
against {ndcg_reference}. BM25 alone on all {queries} queries: {bm25_ndcg@10:.4f}{below}. Loss intervals: paired \
bootstrap over queries (2,000 resamples). {complete:if|Complete.|Run cut short: nDCG covers the queries counted in \
the table.}

Model: `{model.path}` — {model.note:removed}. max_length {settings.max_length}, batch {settings.batch_size}, \
{settings.backend}; OpenVINO inference precision {settings.openvino_inference_precision}.

Machine: {hardware.cpu_model}, {hardware.cpus} cores shared with other jobs, flags {hardware.cpu_flags:join}; torch \
CPU capability {hardware.torch_cpu_capability|None}; load average before {load_average_before.0:.1f}, after \
{load_average_after.0:.1f}.

Target (>= {target.speedup_vs_torch_fp32:g}x torch fp32 pairs/s at <= {target.max_ndcg@10_loss} nDCG@10 loss): \
{target.met_by:if|met by {target.met_by:join}.|not met by any runtime in this run.} `runtime="auto"` picks \
`{cpu_auto_runtime}` on this machine.

Reproduce: `{command}`"""


def ce_backends_notes() -> str:
    """What ce_backends.json measured, on what, and whether the model reranks below BM25 alone."""
    d = load("ce_backends.json")
    below = max(r.get("ndcg@10", 0) for r in d["runtimes"].values()) < d["bm25_ndcg@10"]
    return fill(CE_BACKENDS_NOTES, d, d, below=" (this model reranks below BM25 at this depth: the table compares "
                                               "runtimes, not models)" if below else "")


block("ce-backends")(joined(Table(
    "ce_backends.json", ["runtime", "pairs/s", "vs torch fp32", "p50 s/query", "p95 s/query", "max abs score diff",
                         "nDCG@10", "nDCG loss", "loss 95% CI", "nDCG queries", "target met"],
    [["{key}", "{pairs_per_s|—:.1f}", "{speedup_vs_torch_fp32|—:.2f}x", "{p50_query_seconds|—:.2f}",
      "{p95_query_seconds|—:.2f}", "{max_abs_score_diff_vs_torch_fp32|—:.2g}", "{ndcg@10|—:.4f}",
      "{ndcg@10_loss_vs_fp32|—:+.4f}", "{ndcg@10_loss_ci95|—:ci+.4f}", "{per_query_ndcg@10|—:len}",
      "{meets_target:if|yes|no}"]], each="runtimes"), ce_backends_notes))


def first_call_cells(d: dict) -> list[dict]:
    """A row per runtime and export-folder state: its median seconds and what its first process imported
    (the same in every repeat)."""
    imported = {(r["runtime"], r["state"]): ", ".join(r["imported"]) or "neither"
                for r in d["runs"] if r["mode"] == "e2e"}
    return [{"runtime": rt, "state": st, "imported": imported[rt, st], **v}
            for rt, states in d["median_seconds"].items() for st, v in states.items()]


FIRST_CALL_STEPS = ["import", "export", "load", "compile_or_load", "tokenizer", "first_batch"]
block("first-call")(joined(  # a cross-encoder's first call per runtime, and where its seconds go
    Table("first_call.json", ["runtime", "export folder", "first call (s)", "warm call (s)", "whole process (s)",
                              "imported torch / transformers"],
          [["{runtime}", "{state}", "{e2e.first_call:.2f}", "{e2e.warm_call:.3f}", "{e2e.process_seconds:.1f}",
            "{imported}"]], each=first_call_cells,
          names=lambda d: {"model_name": Path(d["model"]).name, "loads": [r["load_before"][0] for r in d["runs"]]},
          note="Median of {repeats} fresh processes per cell, {pairs} pairs of up to {max_length} tokens, model "
               "`{model_name}` (MiniLM-L6 size); `cold`: an empty export folder, `cached`: the folder a previous "
               "process left. 1-minute load average before a process: {loads:range.2f} on {machine.cpus} cores. "
               "Runtimes installed ({install|with `[all]`}): {runtimes_installed:join}; `runtime=\"auto\"` picks "
               "`{auto_runtime_on_this_cpu}` on this CPU. Command: `python benchmarks/bench_first_call.py --repeats "
               "{repeats}`{install|:if| (run with that environment's Python)|}."),
    Table("first_call.json", ["runtime", "export folder", *(f"{step} (s)" for step in FIRST_CALL_STEPS)],
          [["{runtime}", "{state}", *(f"{{phases.{step}|—:.2f}}" for step in FIRST_CALL_STEPS)]],
          each=first_call_cells,
          note="The same first call, step by step (`phases`): `import` is funnel_core's scorer module, plus "
               "transformers (which imports torch) for the torch runtime; ONNX Runtime and OpenVINO tokenize with the "
               "export's own tokenizer (`PairTokenizer`) and import transformers only to export; `load` the torch "
               "weights, `compile_or_load` the ONNX Runtime session or OpenVINO's compile (or its cached model).")))


ENGINES = {("local", 1): "local, 1 thread", ("local", 2): "local, 2 threads", ("ray", 1): "ray, 1 worker",
           ("ray", 2): "ray, 2 workers"}


def engine_rows(rows: list[dict]) -> list[dict]:
    """``rows`` with each engine named with its workers (``name``) and whether its graph equals the local
    one's (``same``; the local reference run itself says "reference")."""
    return [{**r, "name": ENGINES[r["engine"], r["workers"]],
             "same": r.get("equal_to_local", r.get("equal_to_first", "reference"))} for r in rows]


def offline_engines(source: str, **command: Any) -> Callable[[], str]:
    """docs/offline_build.md: the local and Ray engines (bench_offline_engines.py); a run without 1-vs-2 worker
    pairs gives the first table only. ``command``: the ``note`` and ``names`` of the first table."""
    versus = ["1 worker (s)", "2 workers (s)", "speed-up", "parallel efficiency"]
    speedup = ["{seconds_1:.1f}", "{seconds_2:.1f}", "{speedup:.2f}", "{parallel_efficiency:.2f}"]
    return joined(
        Table(source, ["documents", "rows computed", "engine", "seconds", "same graph as local",
                       "load avg (1 min) before"],
              [["{n_documents:,}", "{rows_computed:,}", "{name}", "{seconds:.1f}", "{same}", "{load_before.0}"]],
              each=lambda d: engine_rows(d["knn"]), **command),
        Table(source, ["documents", "rows computed", "engine", *versus],
              [["{n_documents:,}", "{rows_computed:,}", "{engine}", *speedup]], each="knn_efficiency"),
        Table(source, ["texts", "engine", "seconds", "texts/s", "max abs diff to local", "load avg (1 min) before"],
              [["{n_texts:,}", "{name}", "{seconds:.1f}", "{texts_per_second:.1f}", "{max_abs_diff_to_local|-:.1e}",
                "{load_before.0}"]], each=lambda d: engine_rows(d["embeddings"])),
        Table(source, ["texts", "engine", *versus], [["{n_texts:,}", "{engine}", *speedup]],
              each="embeddings_efficiency"))


block("offline-engines")(offline_engines("offline_engines.json"))
block("offline-engines-1m-full")(offline_engines(
    "offline_engines_1m_full.json", names=lambda d: {"loads": "; ".join(
        f"{r['engine']}: load average {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after"
        for r in d["knn"])},
    note="Command: `python benchmarks/bench_offline_engines.py --sizes 1000000 --local-threads 2 --ray-workers 2 "
         "--embed-n 0 --out benchmarks/results/offline_engines_1m_full.json` ({loads}; the Ray row excludes "
         "`ray.init` and the per-worker warm-up, which the JSON records):"))


@block("bm25-vs-raw")
def block_bm25_vs_raw() -> str:
    """Our BM25Index against raw bm25s on the same index (bm25.json, vs_raw_bm25s)."""
    d = load("bm25.json")["vs_raw_bm25s"]
    ks = sorted(d["k"], key=int)
    pairs = [("`search` / raw bm25s `retrieve` (numpy)", "ours_vs_raw_bm25s"),
             ("`search_many` / `search`, per query (numpy)", "ours_batched_vs_ours_single"),
             ("`search_many` / raw bm25s batched (numpy)", "ours_batched_vs_raw_bm25s_batched"),
             ("`search_many` / `search`, per query (numba: the default where installed)",
              "ours_numba_batched_vs_ours_numba_single"),
             ("numba: ours / raw bm25s numba", "ours_numba_vs_raw_bm25s_numba"),
             ("ours: numba / numpy", "ours_numba_vs_ours_numpy")]
    rows = [[label] + [f"{d['k'][k]['time_ratios'][key]:.2f}x" for k in ks] for label, key in pairs
            if key in d["k"][ks[0]]["time_ratios"]]
    ms = [[name] + [f"{d['k'][k]['systems'][name]['median_ms_per_query']:.2f}" for k in ks]
          for name in d["k"][ks[0]]["systems"]]
    loads = [s["latency"]["load_average_before"][0] for k in ks for s in d["k"][k]["systems"].values()]
    return (table(["time ratio (< 1: ours faster)"] + [f"k={k}" for k in ks], rows,
                  f"{d['n_documents']:,} synthetic documents, {d['n_queries']} queries, {d['rounds']} interleaved "
                  f"rounds, median ms per query; ours and raw bm25s query the same built index (first numba "
                  f"calls {d['numba_compile_seconds']:.1f} s, not timed); 1-minute load average {min(loads):.1f}-"
                  f"{max(loads):.1f} on 2 cores. Command: `python benchmarks/bench_bm25.py --parts raw --rounds "
                  f"{d['rounds']}`.")
            + "\n\n" + table(["system (ms per query)"] + [f"k={k}" for k in ks], ms))


@block("dense-ann")
def block_dense_ann() -> str:
    """Faiss HNSW against exact search (dense_ann.json)."""
    d = load("dense_ann.json")
    rows = []
    for s in d["sizes"].values():
        setting = f"M={s['hnsw_m']}, efC={s['ef_construction']}"
        ex = s["exact"]["10"]
        rows.append([f"{s['n_vectors']:,}", "exact", "—", "1.000", "1.000", f"{s['exact']['source@10']:.3f}",
                     "1.000", secs(ex["p50_s"]), secs(ex["p95_s"])])
        for ef, h in s["hnsw"].items():
            rows.append([f"{s['n_vectors']:,}", f"HNSW {setting}, {ef}", f"{s['hnsw_build_seconds']:.0f}",
                         f"{h['10']['recall@10']:.3f}", f"{h['100']['recall@100']:.3f}",
                         f"{h['10']['source@10']:.3f}", f"{h['10']['sim_ratio@10']:.4f}",
                         secs(h["10"]["latency"]["p50_s"]), secs(h["10"]["latency"]["p95_s"])])
    first = next(iter(d["sizes"].values()))
    sims = "; ".join(f"{s['n_vectors']:,}: " + ", ".join(f"{v:.2f}" for v in s["exact_sim"].values())
                     for s in d["sizes"].values())
    commands = "; ".join(dict.fromkeys(f"`{s['command']}`" for s in d["sizes"].values()))
    return table(["vectors", "search", "build s", "recall@10", "recall@100", "source@10", "sim ratio@10",
                  "p50 s (k=10)", "p95 s (k=10)"], rows,
                 f"{first['vectors']}, {first['dimension']} dimensions, {first['n_queries']} queries, each a "
                 f"corpus vector plus a perturbation of norm {first['query_noise']}; recall against exact "
                 f"search; source@10: the query's own corpus vector is in the top 10; sim ratio@10: summed "
                 f"similarity of the top 10 over the exact top 10. Exact similarity at ranks 1, 2, 10, 100 "
                 f"({sims}). Load average {first['exact']['10']['load_average_before'][0]:.1f} on 2 cores "
                 f"at the start. Commands: {commands}.")


def demo_runs(d: dict) -> dict:
    """The demo's runs by embedding cache (this run and the previous one), each with its slowest later question."""
    runs = {d["embedding_cache"]: d, **d.get("previous_runs", {})}
    return {cache: {**r, "slowest": max(q["seconds"] for rd in r["rounds"] for q in rd["questions"])}
            for cache, r in runs.items()}


block("demo-timing")(Table(  # the offline demo's seconds per question
    "demo_timing.json", ["embedding cache", "build s", "first question s", "slowest later question s", "all < 0.5 s",
                         "load average at start"],
    [["{label}", "{build_seconds:.1f}", "{first_question_seconds:.2f}", "{slowest:.3f}", "{slowest:below0.5}",
      "{machine.load_average_at_start.0:.1f}"]], each=demo_runs,
    labels={"miss": "miss (one-time embedding of every document and passage)", "hit": "hit (cache read)"},
    note="`python -m funnel_core demo`'s funnel over {n_documents:,} stdlib docstrings ({n_clusters} clusters); later "
         "questions asked with warm models, twice each; command: `python benchmarks/bench_demo.py --repeats 2` (run "
         "once on an empty cache, once again)."))
block("dtype-agreement")(Table(
    "dtype_agreement.json", ["stage", "Spearman min", "Spearman mean", "top-1 agreement",
                             "max abs(fp32 - bf16) / fp32 range", "gold top-1 fp32 / bf16",
                             "median s per question fp32 / bf16"],
    [["`{key}`", "{spearman_min:.4f}", "{spearman_mean:.4f}", "{top1_agreement:.2f}", "{max_abs_diff_over_range:.4f}",
      "{gold_top1_fp32:.2f} / {gold_top1_bf16:.2f}",
      "{seconds_per_question_median.float32:.3f} / {seconds_per_question_median.bfloat16:.3f}"]], each="stages",
    note="{n_questions} SQuAD train questions x {n_candidates} candidates (the gold paragraph and others of its "
         "article), scored in each precision on the CPU ({hardware.cpu_model}, flags {hardware.cpu_flags:join}; "
         "auto = {hardware.auto_dtype_cpu}), timed alternately on the same question; load average "
         "{machine.load_average_at_start.0:.1f} at start, {machine.load_average_at_end.0:.1f} at the end. Command: "
         "`python benchmarks/bench_dtype.py --questions {args.questions} --candidates {args.candidates}`."))


# -- post-ranking (docs/postrank.md) and FB-RAG ----------------------------------------------------------
block("fid-speed")(Table(
    "fid.json", ["scorer", "parameters", "seconds / {speed.passages} passages", "passages / s",
                 "cross-encoder is faster by"],
    [["{label}", "{speed.parameters.*:mega}", "{speed.seconds_median.*:.1f}", "{speed.passages_per_second.*:.2f}",
      "{speed.cross_encoder_speedup_over.*|—:times.1f}"]],
    labels={"cross_encoder_minilm": "MiniLM cross-encoder",
            "t5-small-sized": "FiD attention, t5-small-sized (512, 6+6 layers, 8 heads)",
            "t5-base-sized": "FiD attention, t5-base-sized (768, 12+12 layers, 12 heads)"}))


FID_LABELS = {"fid_mean": "FiD eq. 3 (i): top-4 tokens per layer and head, mean",
              "fid_max_layers": "FiD (ii) max over layers", "fid_max_heads": "FiD (iii) max over heads",
              "fid_max_tokens": "FiD (iv) top-1 token", "fid_last_2_layers": "FiD (v) last 2 layers",
              "fid_last_3_layers": "FiD (v) last 3 layers", "fid_all_tokens": "FiD all passage tokens",
              "fid_averaged_map_top4": "FiD averaged map, then top-4 (earlier implementation)",
              "fid_log_mean": "FiD eq. 3 on log-attention (rank-equivalent to raw alpha): top-4 tokens",
              "fid_log_max_tokens": "FiD log-attention, top-1 token",
              "fid_log_all_tokens": "FiD log-attention, all passage tokens (mean alpha)",
              "random": "random order (seeded)", "bm25": "BM25 order",
              "cross_encoder": "SQuAD cross-encoder (MiniLM, bench15)",
              "oracle_any_of_n": "answer anywhere in the candidates (ceiling)"}
AR_1_TO_4 = ["AR@1", "AR@2", "AR@3", "AR@4"]
block("postrank-fid-ce")(joined(  # post-rankers with the cross-encoder on the first questions
    Table("postrank_fid_minilm.json", ["ranking of the candidates", *AR_1_TO_4],
          [["{label}", *(f"{{{m}:arci}}" for m in AR_1_TO_4)]], each="with_cross_encoder.results",
          labels={s: FID_LABELS[s] for s in ("random", "bm25", "cross_encoder", "fid_mean", "fid_max_tokens",
                                             "oracle_any_of_n")},
          note="**Post-rankers on the same candidates** ({with_cross_encoder.questions} dev-a questions):"),
    Table("postrank_fid_minilm.json", ["paired difference", *AR_1_TO_4],
          [["{label}", *(f"{{{m}:arci}}" for m in AR_1_TO_4)]], each="with_cross_encoder.paired_vs_cross_encoder",
          labels={f"{s} - cross_encoder": f"{label} - cross_encoder" for s, label in (
              ("fid_mean", "FiD eq. 3"), ("fid_max_tokens", "FiD top-1 token"),
              ("fid_averaged_map_top4", "FiD averaged map"), ("bm25", "BM25"))})))
block("postrank-fid-schemes")(Table(  # FiD Table 7 schemes x Table 8 query ablation, on all questions
    "postrank_fid_minilm.json", ["FiD scheme", "AR@1", "AR@1 + query", "AR@4", "AR@4 + query"],
    [["{label}", "{AR@1.mean:.3f}", "{^results_all_questions.*+query.AR@1.mean|:.3f}",
      "{AR@4.mean:.3f}", "{^results_all_questions.*+query.AR@4.mean|:.3f}"]],
    each="results_all_questions", labels=FID_LABELS,
    note='**Table 7 schemes and Table 8 query ablation** ({questions} dev-a questions; "+ query" = the question\'s '
         'tokens may be selected too):'))


FID_ALPHA_LABELS = {"fid_alpha_mean": "(i) eq. 3 on alpha: top-4 tokens per layer and head",
                    "fid_alpha_max_layers": "(ii) mean over heads and all tokens of the max over layers",
                    "fid_alpha_max_heads": "(iii) mean over layers and all tokens of the max over heads",
                    "fid_alpha_max_tokens": "(iv) the top token per layer and head",
                    "fid_alpha_last_k_layers": "(v) eq. 3 on the last 6 layers (all of MiniLM's)",
                    "fid_alpha_with_query": "Table 8 w/ query: mean alpha over all question + passage tokens",
                    "cross_encoder": "SQuAD cross-encoder (same candidates)", "bm25": "BM25 order"}


block("postrank-fid-alpha")(Table(  # Table 7 / Table 8 as written, on alpha, with the trained reader
    "fid_table7_alpha.json", ["scheme", "AR@1", "AR@4", "AR@1 - cross-encoder (paired)"],
    [["{label}", "{results.*.AR@1:arci}", "{results.*.AR@4:arci}",
      "{paired_vs_cross_encoder.* - cross_encoder.AR@1|:diff}"]],
    labels=FID_ALPHA_LABELS,
    note="**Table 7 / Table 8 as the paper writes them, on alpha** ({questions} dev-a questions, {seconds:.0f} s on "
         "the CPU; the former `benchmarks/fid_table7_cpu.py`, removed when model building moved to `funnel train` with "
         "the GPU reader's scripts, see git history):"))


block("fbrag-squad")(Table(  # FB-RAG answer recall of the kept chunks on SQuAD
    "bench_fbrag.json", ["kept {setup.kept_chunks} chunks ({mean_words_kept:about} words)", "answer recall"],
    [["{label}", "{answer_recall_at_kept.*:.2f}"]], bold=[1],
    labels={"backward_only_bm25": "backward only (BM25 with the question)", "ours_fb": "Ours-FB (0.5 / 0.5)",
            "ours_f": "Ours-F (0 / 1)"}))


# -- reliability (`make reliability`) and the trained models (`funnel train`; the cards in models/) -----------
def reliability_rows(d: dict) -> dict[str, dict]:
    """Per persisted object: the trials and bad outcomes of each experiment kind (both kill kinds together)."""
    ex = d["experiments"]
    rows = {}
    for obj in d["summary"].get("objects") or ["bm25", "clustered"]:
        kills = [ex.get(f"{kind}_{obj}") or {} for kind in ("kill_at_every_step", "kill_random")]
        io = ex.get(f"io_errors_{obj}") or {}
        rows[obj] = {"kills": sum(k.get("trials", 0) for k in kills),
                     "kills_bad": sum(k.get("neither", 0) + k.get("orphans_after_next_save", 0) for k in kills),
                     "flips": ex.get(f"bit_flips_{obj}") or {}, "loads": ex.get(f"concurrent_save_load_{obj}") or {},
                     "io": io.get("trials", 0), "io_bad": io.get("neither", 0) + io.get("raised_but_committed", 0)
                     if io else "-"}
    return rows


RELIABILITY_NOTES = """\
Queries during add/delete: {queries_during_updates.trials:,} queries during {queries_during_updates.updates:,} \
updates, {queries_during_updates.wrong} wrong, {queries_during_updates.errors} errors. Fuzz: {fuzz.trials:,} examples, \
{fuzz.failures} failures. Tenant isolation: {tenant_isolation.probes|-} probes, \
{tenant_isolation.leaks_or_failures|-} leaks or unraised misspellings. "bad" after a kill: the folder loaded as \
neither index, or the next save left an orphan; after an I/O error: neither loads, or the save raised although it \
had committed."""
RELIABILITY_READ_BACK = """\
What is read back but was not written by this run: evaluation output and score cache {eval_cache.trials:,} trials \
(planted links/FIFOs/`../`, damaged or forged records, changed inputs), {eval_cache.bad} bad ({eval_cache.silent} \
silent, {eval_cache.raw_errors} raw errors, {eval_cache.outside_touched} outside writes, {eval_cache.blocked} \
blocked); ONNX export cache {export_cache.trials:,} trials (swapped or linked model.onnx, edited tokenizers, \
same-size same-mtime weights), {export_cache.bad} bad ({export_cache.silent} stale scores); filters \
{filters.trials:,} floor x per-call trials and {filters.save_trials} saves, {filters.widened} widenings, \
{filters.bad} bad."""


def reliability_notes() -> str:
    """What the reliability table's totals mean, the totals that must be zero, and the machine."""
    d = load("reliability.json")
    sm, m = d["summary"], d.get("machine_before", {})
    unread = (".funnel-rag", ".funnel-rag.journal")
    harmless = [(f, c["harmless"]) for k, v in d["experiments"].items() if k.startswith("bit_flips")
                for f, c in v.get("by_file", {}).items() if c["harmless"]]
    read_back = all(sm.get(k) for k in ("eval_cache", "export_cache", "filters"))
    return "\n\n".join([
        "A bit flip is *harmless* when the load gives the original index: "
        + (f"all {sum(h for _, h in harmless):,} were in files a load does not read (the marker and the save "
           "journal)." if all(f in unread for f, _ in harmless)
           else "some were in files a load reads: " + ", ".join(sorted({f for f, _ in harmless}))),
        fill(RELIABILITY_NOTES, sm), *([fill(RELIABILITY_READ_BACK, sm)] if read_back else []),
        f"`{d.get('command', 'make reliability')}`: {d.get('seconds', '?')} s on {m.get('cpu', '?')} "
        f"({m.get('cpu_count', '?')} CPUs, load average {round(float((m.get('load_average') or [0])[0]), 1)}), "
        f"Python {m.get('python', '?')}."])


block("reliability")(joined(Table(  # `make reliability`: a row per persisted object, then the totals that must be 0
    "reliability.json", ["object", "kill -9: trials / bad", "bit flips: trials / silent", "concurrent loads / mixed",
                         "I/O errors: trials / bad"],
    [["`{key}`", "{kills:,} / {kills_bad}", "{flips.trials|0:,} / {flips.silent|-}",
      "{loads.loads|0:,} / {loads.mixed|-}", "{io:,} / {io_bad}"]], each=reliability_rows), reliability_notes))


KEPT_MODELS = ("minilm-squad-ce", "minilm-squad-fid", "minilm-squad-l2g", "rankrag-smollm2-135m",
               "query-classifier")


def model_card(name: str) -> dict:
    """The card (``funnel_model.json``) of the kept model ``models/<name>``."""
    from funnel_core.train.card import read_card

    return read_card(ROOT / "models" / name)


def card_dtype(card: dict) -> str:
    """The precision a model trained in: the card's ``dtype``, else what its hardware resolved."""
    return card.get("dtype") or ", ".join(sorted({r["dtype"] for r in card["hardware"].get("dtypes_resolved", [])})) \
        or "?"


def card_rows(cards: dict[str, Path]) -> list[list[str]]:
    """A row per model card (``funnel_model.json``, by model name): its command, data, steps, minutes,
    machine, size (of the folder beside a kept model's card) and held-out metrics."""
    rows = []
    for name, path in cards.items():
        if not path.is_file():
            print(f"warning: {path} missing; its row is left out", file=sys.stderr)
            continue
        c = json.loads(path.read_text(encoding="utf-8"))
        kept = path.parent == ROOT / "models" / name
        size = sum(f.stat().st_size for f in path.parent.rglob("*") if f.is_file() and "funnel_onnx" not in f.parts)
        held = c.get("held_out_metrics", {})
        ar = "; ".join(f"{m} {held[m]['first_stage']:.3f} -> {held[m]['reranked']:.3f} (paired "
                       f"{held[m]['paired_difference']['difference']:+.3f} "
                       f"{ci(held[m]['paired_difference']['ci'])})" for m in ("AR@1", "AR@4") if m in held)
        ds, hw = c["dataset"], c["hardware"]
        prep = c.get("prep_seconds", 0) + c.get("encode_seconds", 0) + c.get("teacher_seconds", 0)
        loss = c.get("loss_curve") or []
        w = max(1, min(50, len(loss) // 2))
        rows.append([f"`{name}` ({c['kind']})", f"`{c['command']}`",
                     f"{ds['trained_on']:,} questions of `{Path(ds['path']).name}` ({ds['split']})",
                     f"{c['steps']:,} steps{' (time cap)' if c.get('stopped_early') else ''}, loss "
                     f"{sum(loss[:w]) / w:.2f} -> {sum(loss[-w:]) / w:.2f} (first / last {w} steps)" if "steps" in c
                     else c["objective"],
                     f"{c['train_seconds'] / 60:.1f} min training"
                     + (f" + {prep / 60:.1f} min mining" if "prep_seconds" in c else "")
                     + (" and encoding" if c.get("encode_seconds") else "")
                     + (" and teacher scoring" if c.get("teacher_seconds") and "no teacher" not in c["objective"]
                        else "")
                     + f"; {c['seconds_total'] / 60:.1f} min in all",
                     f"{card_dtype(c)}, {hw.get('cpus', '?')} CPUs, load {c['load_average_at_end'][0]:.1f} at the end"
                     if c.get("load_average_at_end") else card_dtype(c),
                     (f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB") if kept
                     else "not kept (its command rebuilds it)",
                     f"{ar} on {held.get('questions', 0)} held-out train questions"
                     f" ({held.get('candidates', 'first stage')})" if ar else
                     fill("{folds}-fold cross-validated accuracy {cv_accuracy_mean:.3f}", c.get("cross_validation"))
                     if "cross_validation" in c else ""])
    return rows


CARD_HEAD = ["model", "command", "data", "steps and loss", "minutes", "precision, machine", "size on disk",
             "held-out (first stage -> reranked by the model, 95% paired interval)"]


@block("training")
def training_costs() -> str:
    """What each kept model cost to train here, from its model card (``funnel_model.json``)."""
    return table(CARD_HEAD, card_rows({n: ROOT / "models" / n / "funnel_model.json" for n in KEPT_MODELS}),
                 "From each model's card (`models/<name>/funnel_model.json`); the held-out questions are train "
                 "questions kept out of training, their candidates the first stage's top-k named in the cell (FiD: "
                 "its top-10 reranked). The load column says whether other work shared the 2 cores.")


@block("query-classifier")
def query_classifier() -> str:
    """docs/best_practices.md: the kept query classifier's cross-validation, from its card."""
    c = model_card("query-classifier")
    cv, tasks = c["cross_validation"], c["dataset"]["task_types"]
    worst = sorted(cv["leave_one_task_out_accuracy"].items(), key=lambda x: x[1])[:3]
    return (f"**Query classifier** on the packaged {c['dataset']['questions']}-query set (`{c['command']}`, the "
            f"model in `models/query-classifier`): stratified {cv['folds']}-fold cross-validated accuracy "
            f"**{cv['cv_accuracy_mean']:.3f} +- {cv['cv_accuracy_std']:.3f}** (folds "
            + ", ".join(f"{x:.3f}" for x in cv["cv_accuracy_per_fold"]) + "). Leaving a whole task type out (trained "
            f"on the other {tasks - 1}) gives {cv['leave_one_task_out_accuracy_mean']:.3f} on average; the hardest "
            "held-out types are " + ", ".join(f"{t.replace('_', ' ')} ({a:.2f})" for t, a in worst) + ".")


# -- statements below a harness table, derived from the same report ------------------------------------
def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """The names whose (cost, quality) no other point matches or beats on both and beats on one."""
    return [n for n, (c, q) in points.items() if not any(
        c2 <= c and q2 >= q and (c2 < c or q2 > q) for m, (c2, q2) in points.items() if m != n)]


#: the costs a Pareto front is drawn against, in words
COSTS = {"pairs_scored_per_query": "pairs scored per query (cross-encoder pairs + FiD passages)",
         "seconds_p50": "seconds per query (p50)"}


def fronts(d: dict, names: Sequence[str], timed: bool) -> dict[tuple[str, str], list[str]]:
    """(metric, cost) -> the Pareto front of ``names`` at AR@1 and AR@4 against each cost (seconds if ``timed``)."""
    summ, cost = d["summary"], d["cost"]
    return {(m, key): pareto_front({s: (cost[s][key], summ[s][m]["mean"]) for s in names})
            for m in ("AR@1", "AR@4") for key in COSTS if timed or key != "seconds_p50"}


def best_system(d: dict, names: Sequence[str], m: str) -> str:
    """The system of ``names`` with the highest mean ``m`` (ties: fewer pairs scored per query)."""
    summ, cost = d["summary"], d["cost"]
    return max(names, key=lambda s: (round(summ[s][m]["mean"], 6), -cost[s]["pairs_scored_per_query"]))


def paired_values(d: dict, a: str, b: str, m: str) -> tuple[list[float], list[float]]:
    """``a``'s and ``b``'s per-question values of metric ``m``, on the same questions (in id order)."""
    per_q = {s: {r["id"]: r["metrics"][m] for r in d["per_question"][s]} for s in (a, b)}
    ids = sorted(per_q[a])
    return [per_q[a][q] for q in ids], [per_q[b][q] for q in ids]


def paired_difference(d: dict, a: str, b: str, m: str) -> dict:
    """``a`` minus ``b`` at metric ``m``, a paired bootstrap over the report's questions."""
    from funnel_core.evaluation.stats import paired_bootstrap

    return paired_bootstrap(*paired_values(d, a, b, m))


def verdict(interval: Sequence[float], above: str, below: str, neither: str = "not distinguishable from") -> str:
    """``above`` where a difference's 95% interval lies above 0, ``below`` where below 0, else ``neither``."""
    return above if interval[0] > 0 else below if interval[1] < 0 else neither


MOG_METHODS = {"level_1": "level_1 (BM25 on one level)", "level_2": "level_2", "level_3": "level_3",
               "level_4": "level_4", "level_5": "level_5", "mog": "**MoG** (trained router)",
               "mog_uniform": "MoG, uniform weights", "auto_merging": "AutoMergingRetriever (LlamaIndex)",
               "mogg_hop_1": "MoGG hop 1 alone", "mogg_hop_3": "MoGG hop 3 alone",
               "mogg_hop_5": "MoGG hop 5 alone", "mogg": "**MoGG** (trained router)"}
MOG_METRICS = ["AR@1", "words@1", "AR@3", "words@3"]


def mog_auto_merging(d: dict) -> str:
    """docs/mix_of_granularity.md: AutoMergingRetriever over all the nodes it returned (results/mog)."""
    am, per_q = d["summary"]["auto_merging"], d["per_question"]["auto_merging"]
    return (f"AutoMergingRetriever over all its returned nodes ({sum(r['n_results'] for r in per_q) / len(per_q):.1f}"
            f" on average): AR {f3(am['AR@10']['mean'])} {ci(am['AR@10']['ci'])} with {am['words@10']['mean']:.1f} "
            "words.")


def mog_router_training(d: dict) -> dict:
    return {k: v for k, v in d["router_training"].items() if "chosen_level_counts" in v}


def mog_router_labels(d: dict) -> dict[str, str]:
    """docs/mix_of_granularity.md: router label variants x selection variants (results/mog)."""
    tr = mog_router_training(d)
    sel = list(next(iter(tr.values()))["chosen_level_counts"])
    labels = {f"level_{j}": f"BM25 on level_{j} alone" for j in range(1, 6)}
    labels.update({f"uniform / {s}": f"uniform weights, selection `{s}`" for s in sel})
    labels.update({f"router {lab} / {s}": f"router `{lab}`, selection `{s}` (chosen levels 1-5: "
                   + " / ".join(map(str, r["chosen_level_counts"][s])) + ")" for lab, r in tr.items() for s in sel})
    return labels


def mog_label_distribution(d: dict) -> str:
    return "Best-level label distribution (levels 1-5) of the training questions: " + "; ".join(
        f"`{lab}` " + " / ".join(map(str, r["best_level_label_distribution"].values()))
        + f" ({r['n_labelled']:,} of {r['n_train_questions']:,} labelled)"
        for lab, r in mog_router_training(d).items()) + "."


FUSION_SYSTEMS = {"bm25": "BM25 (`BM25Index()` defaults: Lucene BM25, English stemmer + stopwords, title + abstract)",
                  "dense": "dense all-MiniLM-L6-v2 (`DenseIndex`)",
                  "hybrid_paper": "hybrid, alpha = 0.3, min-max (paper)", "hybrid_tuned": "hybrid, min-max",
                  "hybrid_zscore_tuned": "hybrid, z-score", "rrf60": "RRF, k = 60", "rrf_tuned": "RRF"}


def tuning_curves(d: dict) -> str:
    """docs/best_practices.md: every tuned value's train score (results/scifact_fusion)."""
    tuning = d.get("tuning", {})
    curves = "; ".join(f"{FUSION_SYSTEMS[n]}: " + ", ".join(f"{t['setting']} {v} {x:.4f}"
                                                            for v, x in zip(t["values"], t["scores"]))
                       for n, t in tuning.items())
    return f"Tuning (train {next(iter(tuning.values()))['metric']} of every value): {curves}." if tuning else ""


HYDE_SYSTEMS = {"bm25": "BM25", "dense": "dense all-MiniLM-L6-v2", "hybrid": "hybrid, alpha = 0.3, min-max (paper)",
                "dense_hyde": "dense with HyDE (N = 1, query included)",
                "hybrid_hyde": "hybrid with HyDE (BM25 over the question, dense over the HyDE vector)"}
HYDE_METRICS = ["AR@1", "AR@5", "AR@10"]


def hyde_pairs(d: dict) -> str:
    """docs/best_practices.md: each HyDE system against the same system without HyDE, paired over the
    same questions (bootstrap interval and exact McNemar test from the per-question results)."""
    from funnel_core.evaluation.stats import mcnemar_exact, paired_bootstrap

    rows = []
    for with_hyde, without in (("dense_hyde", "dense"), ("hybrid_hyde", "hybrid")):
        if with_hyde in d["per_question"] and without in d["per_question"]:
            row = [f"{HYDE_SYSTEMS[with_hyde]} minus {HYDE_SYSTEMS[without]}"]
            for m in HYDE_METRICS:
                a, b = paired_values(d, with_hyde, without, m)
                diff, test = paired_bootstrap(a, b), mcnemar_exact(a, b)
                row.append(f"{diff['difference']:+.3f} {ci(diff['ci'])}, McNemar p = {test['p_value']:.2g} "
                           f"({test['a_only']} vs {test['b_only']})")
            rows.append(row)
    tokens = d["cost"].get("dense_hyde", {}).get("llm_completion_tokens_per_query")
    return table(["paired difference", *HYDE_METRICS], rows,
                 "Paired over the same questions: difference of means, 95% bootstrap interval, exact McNemar test "
                 "(questions only the HyDE system answers vs only the system without it)"
                 + (f"; the HyDE systems share one writer: {tokens:.0f} generated tokens per question on average"
                    if isinstance(tokens, (int, float)) else "") + ".")


RANKRAG_SYSTEMS = {"bm25": "BM25 (no reranking)", "bm25_ce": "cross-encoder (MiniLM, SQuAD-trained)",
                   "smollm2_zeroshot": "SmolLM2-135M zero-shot, P(True)",
                   "smollm2_rankrag": "SmolLM2-135M RankRAG-tuned, P(True)",
                   "smollm2_generate": "SmolLM2-135M zero-shot, generate and parse"}


def rankrag_statement(metric: str, training: bool = False) -> Callable[[dict], str]:
    """What the RankRAG tuning changed at ``metric`` (tuned minus zero-shot, paired), where the tuned
    model stands against BM25 and the cross-encoder, and with ``training`` the tuning run (its card,
    ``models/rankrag-smollm2-135m/funnel_model.json``)."""
    def after(d: dict) -> str:
        summ = d["summary"]
        parts = []
        for a, b in (("smollm2_rankrag", "smollm2_zeroshot"), ("smollm2_rankrag", "bm25"),
                     ("smollm2_rankrag", "bm25_ce"), ("bm25_ce", "bm25"), ("smollm2_generate", "smollm2_zeroshot")):
            if a in summ and b in summ:
                c = paired_difference(d, a, b, metric)
                parts.append(f"{RANKRAG_SYSTEMS[a]} is {verdict(c['ci'], 'better than', 'worse than')} "
                             f"{RANKRAG_SYSTEMS[b]} at {metric} ({summ[a][metric]['mean']:.3f} vs "
                             f"{summ[b][metric]['mean']:.3f}; paired difference {c['difference']:+.3f} {ci(c['ci'])})")
        ranked = {s: {r["id"]: r["ranked"] for r in rows} for s, rows in d["per_question"].items()}
        kept = ", ".join(f"{RANKRAG_SYSTEMS[s]} {sum(ranked[s][q] == ranked['bm25'][q] for q in ranked['bm25'])}"
                         for s in RANKRAG_SYSTEMS if s != "bm25" and s in ranked)
        top = len(next(iter(ranked["bm25"].values())))
        text = "; ".join(parts) + (f". Questions whose top {top} (as the report keeps it) is BM25's top {top} in "
                                   f"BM25's order, of {len(ranked['bm25'])}: {kept}.")
        if not training:
            return text
        card = model_card("rankrag-smollm2-135m")
        return (text + f" The tuned model: {card['steps']} LoRA steps"
                f"{' (stopped by the time cap)' if card.get('stopped_early') else ''} over {card['examples']} blend "
                f"examples from {card['dataset']['trained_on']} SQuAD train questions, "
                f"{card['train_seconds'] / 60:.0f} min in {card_dtype(card)} on {card['hardware']['cpus']} CPU cores "
                f"at load {card['load_average_at_end'][0]:.1f} (`{card['command']}`; its card: "
                f"`models/rankrag-smollm2-135m/funnel_model.json`).")
    return after


# -- FunnelRAG measured whole (benchmarks/configs/funnelrag_whole.toml) -------------------------------
WHOLE_FLAT = {"bm25": "BM25 top-10", "hybrid": "hybrid (BM25 + MiniLM, alpha 0.3)", "hybrid_tuned": "hybrid",
              "clustered_s1024": "clustered BM25, 4 clusters of <= 1024 tokens, opened",
              "clustered_s4096": "clustered BM25, 1 cluster of <= 4096 tokens, opened",
              "hybrid_ce10": "hybrid top-30 -> SQuAD CE, top 10",
              "hybrid_ce100": "hybrid top-100 -> SQuAD CE, top 10",
              "hybrid_ce_fid": "hybrid top-30 -> SQuAD CE top 10 -> FiD post-ranking"}
WHOLE_FUNNELS = {"funnel_s1024_fid": "funnel S=1024: 4 clusters -> L2G % 8 -> 100 words -> FiD % 4",
                 "funnel_s1024_fid_paper": "funnel S=1024, the paper's cut-offs: 80 clusters -> L2G % 8 -> 100 words "
                                           "-> FiD % 4",
                 "funnel_s1024_fid_tuned": "funnel S=1024: clusters -> L2G % 8 -> 100 words -> FiD % 4",
                 "funnel_s1024_fid_exit": "funnel S=1024: 4 clusters -> L2G % 8 -> 100 words -> FiD % 4, skipped "
                                          "when L2G is confident",
                 "funnel_s1024_ce": "funnel S=1024: 4 clusters -> L2G % 8 -> 100 words -> CE % 4",
                 "funnel_s1024_ce_tuned": "funnel S=1024: clusters -> L2G % 8 -> 100 words -> CE % 4",
                 "funnel_s1024_ce_exit": "funnel S=1024: 4 clusters -> L2G % 8 -> 100 words -> CE % 4, skipped "
                                         "when L2G is confident",
                 "funnel_s1024_ce_ce": "funnel S=1024: 4 clusters -> CE % 8 -> 100 words -> CE % 4 (no L2G)",
                 "funnel_s4096_fid": "funnel S=4096: 1 cluster -> L2G % 8 -> 100 words -> FiD % 4",
                 "funnel_s4096_ce": "funnel S=4096: 1 cluster -> L2G % 8 -> 100 words -> CE % 4"}


def whole_statement(d: dict, flat: Sequence[str], funnels: Sequence[str]) -> str:
    """The plain statement of a whole-funnel report: the best funnel minus the best flat system at
    AR@1 and AR@4 (paired bootstrap over questions), at equal cost and equal quality, the Pareto fronts
    against pairs scored per query (cross-encoder pairs + FiD passages) and seconds, and per funnel stage
    the share of questions whose answer survived it."""
    summ, cost = d["summary"], d["cost"]
    flat = [s for s in flat if s in summ]
    funnels = [s for s in funnels if s in summ]

    def at(s: str, m: str) -> str:
        return f"`{s}`, {summ[s][m]['mean']:.3f} at {cost[s]['pairs_scored_per_query']:.0f} pairs/query" + (
            f", {secs(cost[s]['seconds_p50'])} s/query" if cost[s].get("seconds_p50") is not None else "")

    n = len(d["per_question"][flat[0]])
    lines = []
    for m in ("AR@1", "AR@4"):
        bf, bu = best_system(d, flat, m), best_system(d, funnels, m)
        c = paired_difference(d, bu, bf, m)
        lines.append(f"At {m} the best funnel ({at(bu, m)}) minus the best flat system ({at(bf, m)}): "
                     f"{c['difference']:+.3f} {ci(c['ci'])} (paired bootstrap over {n} questions): "
                     f"the funnel is {verdict(c['ci'], 'above', 'below')} the flat system.")
        cheap = [s for s in flat if cost[s]["pairs_scored_per_query"] <= cost[bu]["pairs_scored_per_query"]]
        if cheap:  # equal cost: the best flat system that scores no more pairs than the funnel
            bc = best_system(d, cheap, m)
            c = paired_difference(d, bu, bc, m)
            lines.append(f"At equal cost ({m}; flat systems scoring no more pairs per query than `{bu}`): "
                         f"the best is `{bc}`; funnel minus it {c['difference']:+.3f} {ci(c['ci'])}.")
        good = [s for s in flat if summ[s][m]["mean"] >= summ[bu][m]["mean"]]
        if good:  # equal quality: the cheapest flat system at least as good as the funnel
            bq = min(good, key=lambda s: (cost[s]["pairs_scored_per_query"], cost[s].get("seconds_p50") or 0))
            t_f, t_q = cost[bu].get("seconds_p50"), cost[bq].get("seconds_p50")
            ratio = f", {t_f / t_q:.1f}x its seconds per query" if t_f and t_q else ""
            lines.append(f"At equal quality ({m}): the cheapest flat system at least as good as `{bu}` is "
                         f"{at(bq, m)}; the funnel scores {cost[bu]['pairs_scored_per_query']:.0f} pairs per "
                         f"query{ratio}.")
        else:
            lines.append(f"At equal quality ({m}): no flat system reaches `{bu}`.")
    if all("CI@4" in summ[s] for s in flat + funnels):
        bf, bu = best_system(d, flat, "AR@4"), best_system(d, funnels, "AR@4")
        c = paired_difference(d, bu, bf, "CI@4")
        lines.append(f"CI@4 (contextual integrity) of the best funnel at AR@4 (`{bu}`, {summ[bu]['CI@4']['mean']:.3f}) "
                     f"minus the best flat system at AR@4 (`{bf}`, {summ[bf]['CI@4']['mean']:.3f}): "
                     f"{c['difference']:+.3f} {ci(c['ci'])}.")
    timed = all(cost[s].get("seconds_p50") is not None for s in flat + funnels)
    for (m, key), front in fronts(d, flat + funnels, timed).items():
        on = [s for s in front if s in funnels]
        lines.append(f"Pareto front of {m} against {COSTS[key]}: "
                     + ", ".join(f"`{s}`" for s in sorted(front, key=lambda s: cost[s][key]))
                     + (f"; funnel configuration(s) on it: {', '.join(f'`{s}`' for s in on)}." if on else
                        "; no funnel configuration is on it (each is matched or beaten at no more cost)."))
    for s in funnels:
        steps, prev, losses = [], None, []
        for x in d.get("stages", {}).get(s) or []:
            r = x["answer_recall"]
            steps.append(f"{x['stage']} {x['units_out_mean']:.1f} units ({r:.3f})")
            if prev is not None and r is not None and prev - r > 0:
                losses.append((prev - r, x["stage"]))
            prev = r if r is not None else prev
        if steps:
            worst = max(losses) if losses else None
            lines.append(f"`{s}` per stage (units out; share of questions whose answer is still among them): "
                         + " -> ".join(steps) + "; " + (f"the largest loss is at {worst[1]} ({worst[0]:.3f})."
                                                       if worst else "no stage loses an answer."))
    for s in flat:
        if trace := d.get("stages", {}).get(s):
            lines.append(f"For comparison, `{s}`'s first stage ({trace[0]['stage']}, "
                         f"{trace[0]['units_out_mean']:.1f} units) holds the answer for "
                         f"{trace[0]['answer_recall']:.3f} of the questions.")
    return "\n".join(f"- {line}" for line in lines)


@block("funnelrag-whole-summary")
def funnelrag_whole_readme() -> str:
    """The README's answer to "is the paper's funnel, whole, on the Pareto front here?": the front of
    AR@1 and AR@4 against pairs scored and (when timed) seconds; for a funnel on it, by how much it
    differs from the best flat system at that metric, here and on the held-out questions."""
    d = harness("funnelrag_whole")
    summ, cost = d["summary"], d["cost"]
    names = [s for s in [*WHOLE_FLAT, *WHOLE_FUNNELS] if s in summ]
    flat = [s for s in WHOLE_FLAT if s in summ]
    timed = all(cost[s].get("seconds_p50") is not None for s in names)
    on: dict[str, list[str]] = {}  # funnel -> the metrics at whose front it is
    for (m, _), front in fronts(d, names, timed).items():
        for s in front:
            if s in WHOLE_FUNNELS and m not in on.setdefault(s, []):
                on[s].append(m)
    ds = d["dataset"]
    against = "pairs scored and seconds per query" if timed else "pairs scored per query"
    where = (f"{ds['questions']:,} SQuAD dev-a questions over {ds['corpus']:,} paragraphs, "
             "`benchmarks/configs/funnelrag_whole.toml`; the table, the trace of which stage loses what and the "
             "held-out replication are in [docs/funnel.md](docs/funnel.md)")
    if not on:
        return (f"- **The paper's funnel, measured whole, is not on the Pareto front here**: no funnel configuration "
                f"(clustered BM25 -> the L2G pre-ranker -> 100-word passages -> FiD or cross-encoder post-ranking, "
                f"models that `funnel train` keeps) is on the front of AR@1 or AR@4 against {against} ({where}).")
    held = harness("funnelrag_whole_heldout")
    held_flat = [s for s in WHOLE_FLAT if s in held["summary"]]
    parts = []
    for s, metrics in on.items():
        for m in metrics:
            bf = best_system(d, flat, m)
            c = paired_difference(d, s, bf, m)
            text = (f"`{s}` at {m}: {summ[s][m]['mean']:.3f} at {cost[s]['pairs_scored_per_query']:.0f} pairs/query"
                    + (f" and {secs(cost[s]['seconds_p50'])} s/query" if timed else "")
                    + f", {c['difference']:+.3f} {ci(c['ci'])} against the best flat system `{bf}` "
                    f"({summ[bf][m]['mean']:.3f} at {cost[bf]['pairs_scored_per_query']:.0f} pairs/query)")
            if s in held["summary"] and held_flat:
                hf = best_system(held, held_flat, m)
                h = paired_difference(held, s, hf, m)
                text += f"; on the held-out questions {h['difference']:+.3f} {ci(h['ci'])} against `{hf}`"
            parts.append(text)
    return (f"- **A funnel configuration is on the Pareto front here** (AR@1 or AR@4 against {against}): "
            + "; ".join(parts) + f" (paired bootstrap 95% intervals; {where}).")


# -- every block that is a harness report: one harness_table each --------------------------------------
#: how a harness benchmark runs: its config, results folder and score cache all carry the benchmark's name
EVAL_COMMAND = "`funnel eval benchmarks/configs/{0}.toml --out benchmarks/results/{0} --cache-dir .cache/{0}`"
#: The SciFact cross-encoder's systems in benchmarks/configs/scifact.toml (pre-ranking, docs/prerank.md)
PRERANK_SYSTEMS = {"bm25_ce_fused": "BM25 top-100 -> CE, interpolated with BM25 (w = 0.3)",
                   "bm25_ce_top10": "BM25 top-10 -> CE alone", "bm25": "BM25"}
#: ... and the funnel against the flat systems with the same model (docs/funnel.md)
FUNNEL_SYSTEMS = {"bm25_ce_fused": "BM25 top-100 -> CE + BM25", "funnelrag": "funnel", "bm25": "BM25",
                  "clustered": "clustered BM25 (first stage alone)"}
#: The reader run (benchmarks/configs/squad_reader.toml)
READER_SYSTEMS = {"funnelrag": "funnel", "bm25_ce": "BM25 top-30 -> CE", "bm25": "BM25"}
READER_CMD = EVAL_COMMAND.format("squad_reader")
POSTRANK_SYSTEMS = {"bm25_ce": "BM25 top-10 -> the SQuAD cross-encoder",
                    "bm25_fid": "BM25 top-10 -> the CPU FiD reader's cross-attention (eq. 3)",
                    "bm25": "BM25 top-10 alone"}
L2G_SYSTEMS = {"bm25_l2g": "BM25 top-15 -> the L2G pre-ranker", "bm25_labels": "BM25 top-15 -> its label-only twin",
               "bm25": "BM25 top-15 alone", "bm25_ce": "BM25 top-15 -> the SQuAD cross-encoder (L2G's teacher)"}
L2G_LABELS = {"bm25_l2g": "L2G", "bm25_labels": "label-only", "bm25": "BM25", "bm25_ce": "its teacher"}


def l2g_training(_: dict) -> str:
    """The two pre-rankers' training, from their cards (the label-only model is not kept: its card is)."""
    return table(CARD_HEAD, card_rows({"minilm-squad-l2g": ROOT / "models" / "minilm-squad-l2g" / "funnel_model.json",
                                       "minilm-squad-l2g-labels": RESULTS / "squad_l2g_ablation" / "labels_card.json"}),
                 "How each was trained, from its card (the label-only model's card is kept as "
                 "`benchmarks/results/squad_l2g_ablation/labels_card.json`):")


ATTENTION_SYSTEMS = {"bm25": "BM25 order", "bm25_ce": "cross-encoder (MiniLM, SQuAD-trained)",
                     "attention_lm": 'SmolLM2-135M attention, calibrated with "N/A" (ICR)'}
WHOLE = dict(metrics=["AR@1", "AR@2", "AR@4", "CI@4", "EM@4", "F1@4"], labels={**WHOLE_FLAT, **WHOLE_FUNNELS},
             bold=["AR@1", "AR@4"], vs_baseline="AR@1",
             after=lambda d: whole_statement(d, list(WHOLE_FLAT), list(WHOLE_FUNNELS)))
#: block -> harness_table's arguments
HARNESS_BLOCKS: dict[str, dict[str, Any]] = {
    "mog-methods": dict(name="mog", metrics=MOG_METRICS, labels=MOG_METHODS, vs_baseline="AR@1",
                        after=mog_auto_merging),
    "mog-router": dict(name="mog", metrics=MOG_METRICS, labels=mog_router_labels, after=mog_label_distribution),
    "hybrid-scifact": dict(name="scifact_fusion", metrics=["ndcg@10", "recall@100"], labels=FUSION_SYSTEMS,
                           bold=["ndcg@10"], vs_baseline="ndcg@10", after=tuning_curves),
    "hyde-squad": dict(name="squad_hyde", metrics=HYDE_METRICS, labels=HYDE_SYSTEMS, bold=HYDE_METRICS,
                       vs_baseline="AR@5", after=hyde_pairs),
    "funnelrag-whole": dict(name="funnelrag_whole", command=EVAL_COMMAND.format("funnelrag_whole"), **WHOLE),
    "funnelrag-whole-heldout": dict(name="funnelrag_whole_heldout", **WHOLE,
                                    command=EVAL_COMMAND.format("funnelrag_whole_heldout")),
    "prerank-scifact": dict(name="scifact", metrics=["ndcg@10", "recall@10", "recall@100"], labels=PRERANK_SYSTEMS,
                            bold=["ndcg@10"], vs_baseline="ndcg@10"),
    "funnel-scifact": dict(name="scifact", metrics=["ndcg@10", "recall@10", "recall@100"], labels=FUNNEL_SYSTEMS,
                           bold=["ndcg@10"], vs_baseline="ndcg@10"),
    "squad-reader": dict(name="squad_reader", metrics=["AR@1", "AR@2", "EM@2", "F1@2"], labels=READER_SYSTEMS,
                         bold=["F1@2"], vs_baseline="F1@2", command=READER_CMD),
    "squad-postrank": dict(name="squad_postrank", metrics=["AR@1", "AR@2", "AR@4"], labels=POSTRANK_SYSTEMS,
                           bold=["AR@1", "AR@4"], vs_baseline="AR@1", command=EVAL_COMMAND.format("squad_postrank")),
    "l2g-ablation": dict(name="squad_l2g_ablation", metrics=["AR@1", "AR@2", "AR@4"], labels=L2G_SYSTEMS,
                         bold=["AR@1", "AR@4"], vs_baseline="AR@1", command=EVAL_COMMAND.format("squad_l2g_ablation"),
                         after=l2g_training),
    "fid-icr-squad": dict(name="squad_attention_lm", metrics=["AR@1", "AR@2", "AR@4"], labels=ATTENTION_SYSTEMS,
                          bold=["AR@1"], vs_baseline="AR@1", command=EVAL_COMMAND.format("squad_attention_lm")),
    "rankrag-squad": dict(name="squad_rankrag", metrics=["AR@1", "AR@2", "AR@3", "AR@4"], labels=RANKRAG_SYSTEMS,
                          bold=["AR@1", "AR@4"], vs_baseline="AR@4", command=EVAL_COMMAND.format("squad_rankrag"),
                          after=rankrag_statement("AR@4", training=True)),
    "rankrag-scifact": dict(name="scifact_rankrag", metrics=["ndcg@10", "recall@10"], labels=RANKRAG_SYSTEMS,
                            bold=["ndcg@10"], vs_baseline="ndcg@10", command=EVAL_COMMAND.format("scifact_rankrag"),
                            after=rankrag_statement("ndcg@10")),
    "compression-squad": dict(name="squad_compression", metrics=["AR@5", "words@5"], vs_baseline="AR@5", labels={
        "bm25": "BM25 top-5 paragraphs (before)", "embedding": "compressed, embedding (MiniLM cosine)",
        "bm25_sentences": "compressed, BM25 sentence scores", "random": "control: random sentences, same budget"}),
}
for _name, _kw in HARNESS_BLOCKS.items():
    block(_name)(functools.partial(harness_table, **_kw))  # type: ignore[arg-type]




# -- the README's results table: a row set per source -------------------------------------------------
def hrow(name: str, what: str, metrics: Sequence[str], labels: dict[str, str],
         command: str | None = None) -> Callable[[], list[Row]]:
    return lambda: [harness_row(name, what, metrics, labels, command)]


#: SciFact test nDCG@10 published for the systems the SciFact rows compare against
PUBLISHED_SCIFACT = {"bm25_beir": 0.665, "bm25_pyserini_flat": 0.679, "bm25_top100_ms_marco_minilm_ce_beir": 0.688}
P = PUBLISHED_SCIFACT
BENCH_BM25 = "`python benchmarks/bench_bm25.py`"
BM25_QPS = " vs ".join(f"{{systems.{s}.qps:qps}}" for s in BM25_SYSTEMS)
BM25_TIMED = " / ".join(f"{{systems.{s}.queries_timed}}" for s in BM25_SYSTEMS) + " queries"
BENCH_FID, BENCH_FBRAG = (f"`python benchmarks/{n}.py`" for n in ("bench_fid", "bench_fbrag"))
#: the README's results table, in order: (what, rows); a source that fails to render is left out with a warning
README_ROWS: list[tuple[str, Callable[[], list[Row]]]] = [
    ("squad_large", squad_large_rows),
    ("cluster_scale", Table("cluster_scale.json", (), [(
        "clustering pipeline end to end, {n_documents:,} synthetic docs (BM25 index + kNN graph + Algorithm 1 + "
        "cluster index)", "**{pipeline_seconds:.0f} s** wall, {cpu_seconds:.0f} CPU s, peak RSS {peak_rss_gib:.1f} "
        "GiB (target {^target.seconds} s, {^target.peak_rss_gib} GiB)", "one run", "not recorded (one run)",
        "`{command}`")],
        each=cluster_full_rows).rows),
    ("squad_ce_training", Table("squad_ce_training.json", (), [(
        "MiniLM cross-encoder trained on SQuAD train (listwise, BM25 hard negatives)",
        "{steps:,} steps, {train_seconds:.0f} s on {gpu|CPU} ({dtype}); loss {loss_first50:.2f} -> {loss_last50:.2f}",
        "{groups:,} train questions", "n/a (training run)", "{commands|:bare_commands}")]).rows),
    ("bm25", Table("bm25.json", (), [
        ("BM25 queries/s vs LlamaIndex BM25 / LangChain community BM25 (SciFact)", BM25_QPS, BM25_TIMED,
         "not recorded (one timing run)", BENCH_BM25)], at="speed_scifact").rows),
    ("bm25", Table("bm25.json", (), [("same, {n_documents:,} synthetic docs", BM25_QPS, BM25_TIMED,
                                      "not recorded (one timing run)", BENCH_BM25)], at="speed_synthetic").rows),
    ("bm25", Table("bm25.json", (), [(
        "clustering SciFact (Algorithm 1, BM25 kNN, S=4096): recall of relevant docs in top-5 clusters",
        "{n_documents:,} docs -> {n_clusters} clusters; {recall_at_k_clusters.k_clusters=5.recall_clustered:.3f} at "
        "{recall_at_k_clusters.k_clusters=5.mean_documents:.0f} docs vs "
        "{recall_at_k_clusters.k_clusters=5.recall_flat_same_docs:.3f} for flat BM25 at the same count",
        "SciFact test queries (count not recorded in bm25.json)", "not recorded", BENCH_BM25)], at="clustered").rows),
    ("bm25", Table("bm25.json", (), [(
        "clustering time, {n_documents:,} synthetic docs (BM25 index + kNN graph + Algorithm 1)",
        "{total_seconds:.1f} s ({bm25_index_seconds:.0f} + {knn_graph_seconds:.0f} + {algorithm1_seconds:.0f} s)",
        "one run", "not recorded (one run)", BENCH_BM25)], each="clustering_scale").rows),
    ("prerank", hrow("scifact", "SciFact-trained MiniLM cross-encoder reranking BM25, SciFact test (published BM25 + "
                     f"ms-marco MiniLM CE: {P['bm25_top100_ms_marco_minilm_ce_beir']})", ["ndcg@10"], PRERANK_SYSTEMS)),
    ("prerank", hrow("scifact", "FunnelRAG funnel (3 clusters -> CE on abstracts % 20 -> 60-word passages -> CE) vs "
                     "flat systems with the same CE, SciFact test", ["ndcg@10", "recall@100"], FUNNEL_SYSTEMS)),
    ("harness", hrow("scifact_fusion", f"flat BM25, SciFact test (published nDCG@10: BEIR {P['bm25_beir']}, Pyserini "
                     f"{P['bm25_pyserini_flat']})", ["ndcg@10", "recall@100"], {"bm25": "BM25"})),
    ("harness", hrow("scifact_fusion", "hybrid BM25 + MiniLM on SciFact test (alpha tuned on train)", ["ndcg@10"],
                     {"hybrid_tuned": "hybrid", "bm25": "BM25", "dense": "dense"})),
    ("harness", hrow("squad_compression", "extractive compression (SQuAD dev-a, BM25 top-5 paragraphs, 40% of the "
                     "words)", ["AR@5", "words@5"], {"bm25_sentences": "BM25 sentences", "bm25": "before",
                                                     "random": "random sentences"})),
    ("harness", hrow("mog", "Mix-of-Granularity on SQuAD dev-a (held-out half)", ["AR@1"],
                     {"mog": "MoG", "level_1": "level 1", "level_5": "level 5", "mogg": "MoGG",
                      "auto_merging": "AutoMerging"})),
    ("reader", hrow("squad_reader", "answer quality: SmolLM2-135M reads each system's top-2 paragraphs (SQuAD dev-a; "
                    "SQuAD token F1 / exact match)", ["F1@2", "EM@2", "AR@2"], READER_SYSTEMS, command=READER_CMD)),
    ("query_classifier", Table(lambda: model_card("query-classifier"), (), [(
        "query classifier (labelled queries, {dataset.task_types} task types; `models/query-classifier`)",
        "{cross_validation.folds}-fold accuracy {cross_validation.cv_accuracy_mean:.3f} +- "
        "{cross_validation.cv_accuracy_std:.3f} (sd over folds)", "{dataset.questions} queries", "sd over folds only",
        "`{command}`")]).rows),
    ("fid", Table("fid.json", (), [
        ("FiD attention scorer speed (50 passages x 130 tokens, CPU), passages/s",
         "MiniLM CE {speed.passages_per_second.cross_encoder_minilm:.2f}, FiD t5-small-sized "
         "{speed.passages_per_second.t5-small-sized:.2f}, t5-base-sized {speed.passages_per_second.t5-base-sized:.2f}",
         "{speed.repeats} repeats", "not recorded", BENCH_FID)]).rows),
    ("fid", hrow("squad_attention_lm", "decoder-only attention reranker (SmolLM2-135M, calibrated as in ICR) of BM25 "
                 "top-20, SQuAD dev-a", ["AR@1"], {"attention_lm": "attention", "bm25": "BM25 order", "bm25_ce": "CE"},
                 command=EVAL_COMMAND.format("squad_attention_lm"))),
    ("rankrag", hrow("squad_rankrag", "RankRAG P(True) reranking of BM25 top-20 with SmolLM2-135M, SQuAD dev-a "
                     "(tuned on SQuAD train by `funnel train`)", ["AR@1", "AR@4"],
                     {"smollm2_rankrag": "tuned", "smollm2_zeroshot": "zero-shot", "bm25": "BM25",
                      "bm25_ce": "CE"}, command=EVAL_COMMAND.format("squad_rankrag"))),
    ("fbrag", Table("bench_fbrag.json", (), [(
        "FB-RAG with SmolLM2-135M, SQuAD answer recall (3 chunks kept)",
        "BM25 backward-only {answer_recall_at_kept.backward_only_bm25:.2f}, Ours-FB "
        "{answer_recall_at_kept.ours_fb:.2f}, Ours-F {answer_recall_at_kept.ours_f:.2f}", "{setup.questions} questions",
        "Ours-FB {answer_recall_at_kept.ours_fb:wci{setup.questions}}", BENCH_FBRAG)]).rows),
    ("l2g", hrow("squad_l2g_ablation", "L2G (FunnelRAG 3.2) against its label-only twin, each pre-ranking BM25's "
                 "top-15 paragraphs, SQuAD dev-a", ["AR@1", "AR@4"], L2G_LABELS,
                 command=EVAL_COMMAND.format("squad_l2g_ablation"))),
    ("post-ranking with the models funnel train keeps (SQuAD dev-a, BM25 top-10 paragraphs)",
     hrow("squad_postrank", "post-ranking BM25 top-10 with the kept SQuAD cross-encoder and the CPU FiD reader "
          "(models/), SQuAD dev-a", ["AR@1", "AR@4"], {"bm25_ce": "CE", "bm25_fid": "FiD (CPU)", "bm25": "BM25"},
          command=EVAL_COMMAND.format("squad_postrank"))),
]


def rows_readme() -> list[Row]:
    rows: list[Row] = []
    for what, fn in README_ROWS:
        try:
            rows.extend(fn())
        except (FileNotFoundError, KeyError, TypeError, ValueError, StopIteration) as exc:
            print(f"report: left out {what}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return rows


block("readme-table")(lambda: table(["what", "result", "sample", "95% interval", "command"], rows_readme()))


FILES = [ROOT / "README.md"] + [ROOT / "docs" / f"{n}.md" for n in (
    "benchmarks", "clustering", "funnel", "prerank", "postrank", "llm_retrieval", "performance", "offline_build",
    "mix_of_granularity", "best_practices", "persistence", "training", "scaling_out")]
MARK = re.compile(r"(<!-- results:([a-z0-9-]+):begin -->\n)(.*?)(<!-- results:\2:end -->)", re.S)


def render(text: str, problems: list[str] | None = None) -> str:
    """Re-render every marked block of ``text``; a block whose renderer is unknown or fails is left as
    it is, with a warning (and a line in ``problems`` when given)."""
    def warn(msg: str) -> None:
        print(f"report: {msg}", file=sys.stderr)
        if problems is not None:
            problems.append(msg)

    def sub(m: re.Match) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            warn(f"unknown block {name!r}; left as is")
            return m.group(0)
        try:
            body = BLOCKS[name]()
        except (FileNotFoundError, KeyError, TypeError, ValueError, StopIteration) as exc:
            warn(f"block {name!r} left as is ({type(exc).__name__}: {exc})")
            return m.group(0)
        return m.group(1) + body.rstrip() + "\n" + m.group(4)

    return MARK.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a block is stale or cannot be rendered; write nothing")
    args = ap.parse_args(argv)
    stale: list[Path] = []
    problems: list[str] = []
    for path in FILES:
        if not path.is_file():
            continue
        old = path.read_text(encoding="utf-8")
        new = render(old, problems)
        if new != old:
            stale.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for p in stale:
        print(f"{'stale' if args.check else 'updated'}: {p.relative_to(ROOT)}")
    return 1 if (args.check and (stale or problems)) else 0


if __name__ == "__main__":
    sys.exit(main())
