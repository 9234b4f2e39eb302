"""Mutation testing of the paper algorithms with mutmut (``make mutate``; slow, not in CI).

Runs mutmut (configured in ``pyproject.toml`` under ``[tool.mutmut]``) on the functions that
implement the papers' algorithms only, then prints and saves (``mutants/scores.json``) each
module's mutation score: killed (or timed out) / mutants that some selected test reaches.

    python scripts/mutate.py                 # every module
    python scripts/mutate.py fid rankrag     # some modules
    python scripts/mutate.py --report        # only the table, from the last run's results
    python scripts/mutate.py --max-children 2
    python scripts/mutate.py --survivors     # re-run only the last run's survivors (after new tests)
    python scripts/mutate.py fid-model --unchecked   # resume a run cut short: only mutants without a verdict
    python scripts/mutate.py --widened --max-children 1   # the modules widened last, one by one
    python scripts/mutate.py rankrag --report --record    # merge the table into the results file

``--record`` merges each module's row (killed, survived, score, survivors, and ``complete``:
false when some mutants were never run, e.g. a run cut by ``timeout``) into
``benchmarks/results/mutation.json``. A row's hand-written ``equivalent`` list (survivors judged
equivalent, each reason in ``equivalent_or_not_paper``) is kept, and the row gets
``equivalent_count`` (listed mutants that still survive) and ``score_without_equivalent``
(killed / (checked - equivalent_count)).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module -> mutmut mutant-name globs (``x_<function>`` for functions, ``xǁClassǁmethod``).
MODULES: dict[str, list[str]] = {
    "clustering (Algorithm 1)": [
        "funnel_core.funnelrag.clustering.x__binary_symmetric__mutmut_*",
        "funnel_core.funnelrag.clustering.x_local_clustering_coefficient__mutmut_*",
        "funnel_core.funnelrag.clustering.x_cluster_documents__mutmut_*",
    ],
    "FiD aggregation (eq. 3, Table 7)": [
        "funnel_core.rerank.fid.x_aggregate_cross_attention__mutmut_*",
        "funnel_core.rerank.fid.x__cross_attention_modules__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁscore_with_titles__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁscored_map__mutmut_*",
    ],
    "FiD model path (inputs, encoder, decoder prefix, cross-attention)": [
        "funnel_core.rerank.fid.x__render__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁbuild_inputs__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁencode__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁ_decoder_prefix__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁ_cross_attentions__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁcross_attention__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁraw_scores__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁ_log_attention__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁscore__mutmut_*",
        "funnel_core.rerank.fid.xǁFiDAttentionScorerǁrank__mutmut_*",
    ],
    "L2G labels and losses (eqs. 4-6)": [
        "funnel_core.train.l2g.x_aggregate_passage_scores__mutmut_*",
        "funnel_core.train.l2g.x_l2g_partition__mutmut_*",
        "funnel_core.train.l2g.x_l2g_group__mutmut_*",
        "funnel_core.train.l2g.x_bpr_loss__mutmut_*",
        "funnel_core.train.l2g.x_listwise_loss__mutmut_*",
        "funnel_core.train.l2g.x_group_pair_losses__mutmut_*",
        "funnel_core.train.l2g.x__bpr_terms__mutmut_*",
        "funnel_core.train.l2g.x__listwise_terms__mutmut_*",
        "funnel_core.train.l2g.xǁCrossEncoderTrainerǁsteps__mutmut_*",
        "funnel_core.train.l2g.xǁCrossEncoderTrainerǁ_negatives__mutmut_*",
    ],
    "RankRAG scoring": [
        "funnel_core.rerank.rankrag.x_parse_true_false__mutmut_*",
        "funnel_core.rerank.rankrag.xǁRankRAGScorerǁbuild_prompt__mutmut_*",
        "funnel_core.rerank.rankrag.xǁRankRAGScorerǁscore__mutmut_*",
        "funnel_core.rerank.rankrag.xǁRankRAGScorerǁscore_logprobs__mutmut_*",
        "funnel_core.rerank.rankrag.xǁRankRAGScorerǁscore_generate__mutmut_*",
        "funnel_core.rerank.rankrag.xǁRankRAGScorerǁ_votes__mutmut_*",
        "funnel_core.rerank.rankrag.xǁRankRAGScorerǁ_ranked__mutmut_*",
        "funnel_core.rerank.rankrag.x_conversation_query__mutmut_*",
        "funnel_core.rerank.rankrag.x_split_conversation__mutmut_*",
        "funnel_core.llm.xǁTransformersLLMǁcandidate_token_ids__mutmut_*",
        "funnel_core.llm.xǁTransformersLLMǁ_next_token_logprobs__mutmut_*",
        "funnel_core.llm.xǁLLMǁnext_token_logprobs__mutmut_*",
    ],
    "MoG selection and labels (eqs. 1-2)": [
        "funnel_core.granularity.retrieval.x_choose_level__mutmut_*",
        "funnel_core.granularity.retrieval.xǁMixOfGranularityRetrieveǁretrieve__mutmut_*",
        "funnel_core.granularity.router.x_soft_labels__mutmut_*",
        "funnel_core.granularity.router.x_level_choice_counts__mutmut_*",
        "funnel_core.granularity.router.x__hit_rate__mutmut_*",
        "funnel_core.granularity.router.xǁGranularityRouterǁpredict__mutmut_*",
    ],
    "MoG router training and MoGG graph (sections 3.2-3.3)": [
        "funnel_core.granularity.router.xǁGranularityRouterǁfit__mutmut_*",
        "funnel_core.granularity.graph.x*__mutmut_*",
    ],
    "FB-RAG forward lookup (eqs. 4-5, Stage III)": [
        "funnel_core.fbrag.x_parse_rationale_answer__mutmut_*",
        "funnel_core.fbrag.xǁForwardSampleǁlookup_text__mutmut_*",
        "funnel_core.fbrag.xǁForwardLookupǁ_scale__mutmut_*",
        "funnel_core.fbrag.xǁForwardLookupǁrecall__mutmut_*",
        "funnel_core.fbrag.xǁForwardLookupǁscore__mutmut_*",
        "funnel_core.fbrag.xǁForwardLookupǁselect__mutmut_*",
    ],
    "FunnelRAG preset": [
        "funnel_core.funnelrag.presets.x_funnelrag__mutmut_*",
        "funnel_core.funnelrag.presets.x__fid_post_ranker__mutmut_*",
    ],
    "fusion (hybrid, RRF, repacking)": [
        "funnel_core.scoring.x_normalize_scores__mutmut_*",
        "funnel_core.best_practices.fusion.x__scores_of__mutmut_*",
        "funnel_core.best_practices.fusion.x__dedup__mutmut_*",
        "funnel_core.best_practices.fusion.x__merge__mutmut_*",
        "funnel_core.best_practices.fusion.x_alpha_fusion__mutmut_*",
        "funnel_core.best_practices.fusion.x_rrf_fusion__mutmut_*",
        "funnel_core.best_practices.fusion.x_fuse__mutmut_*",
        "funnel_core.best_practices.repack.x_repack__mutmut_*",
    ],
}
SHORT = {"clustering": 0, "fid": 1, "fid-model": 2, "l2g": 3, "rankrag": 4, "mog": 5,
         "mog-graph": 6, "fbrag": 7, "presets": 8, "fusion": 9}
#: the modules whose scope was widened last, run first by ``--widened``
WIDENED = ["mog-graph", "rankrag", "fid-model"]
RECORD = ROOT / "benchmarks" / "results" / "mutation.json"
KILLED = {1, 3, 36, -24, 24, 152, 255}  # mutmut exit codes: killed, or timed out
NOT_REACHED = {5, 33}                   # no selected test reaches the function
CRASHED = {-11}                         # the test process died (SIGSEGV): no verdict, not a kill
#: keys of a recorded row written by hand, kept when ``--record`` rewrites the row's counts:
#: ``equivalent`` lists the survivors judged equivalent (the reason of each in
#: ``equivalent_or_not_paper``); ``carried_kills`` the kills carried over from an earlier run
NOTES = ("runs", "equivalent_or_not_paper", "equivalent", "carried_kills")


def results() -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for meta in (ROOT / "mutants").rglob("*.py.meta"):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def select(codes: dict[str, int | None], globs: list[str], which: str) -> list[str]:
    """The names of the mutants matching ``globs`` that ``which`` asks for: ``"survivors"``
    (run, reached by a test, not killed) or ``"unchecked"`` (never run, or whose test process
    crashed). mutmut re-runs every mutant a name or glob selects, so a re-run names these only."""
    def wanted(code: int | None) -> bool:
        if which == "survivors":
            return code is not None and code not in KILLED and code not in NOT_REACHED \
                and code not in CRASHED
        return code is None or code in CRASHED

    return sorted(k for k, code in codes.items()
                  if wanted(code) and any(fnmatch.fnmatchcase(k, g) for g in globs))


def report(names: list[str]) -> dict:
    codes = results()
    table = {}
    for name in names:
        keys = [k for k in codes if any(fnmatch.fnmatchcase(k, g) for g in MODULES[name])]
        checked = [k for k in keys if codes[k] is not None and codes[k] not in NOT_REACHED
                   and codes[k] not in CRASHED]
        killed = [k for k in checked if codes[k] in KILLED]
        survived = sorted(k for k in checked if codes[k] not in KILLED)
        table[name] = {"mutants": len(keys), "checked": len(checked), "killed": len(killed),
                       "survived": len(survived),
                       "not_reached": sum(codes[k] in NOT_REACHED for k in keys),
                       "not_checked": sum(codes[k] is None for k in keys),
                       "crashed": sum(codes[k] in CRASHED for k in keys),
                       "score": round(len(killed) / len(checked), 3) if checked else None,
                       "survivors": survived}
    width = max(len(n) for n in names)
    print(f"{'module':<{width}}  score   killed/checked  (not reached, not checked)")
    for name, row in table.items():
        score = "  n/a" if row["score"] is None else f"{100 * row['score']:5.1f}%"
        print(f"{name:<{width}}  {score}  {row['killed']:>6}/{row['checked']:<7}  "
              f"({row['not_reached']}, {row['not_checked']})")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help=f"some of {sorted(SHORT)} (default: all)")
    ap.add_argument("--report", action="store_true", help="print the last run's scores only")
    ap.add_argument("--survivors", action="store_true",
                    help="re-run only the mutants that survived the last run")
    ap.add_argument("--unchecked", action="store_true",
                    help="run only the mutants that have no verdict yet (resume a run cut by timeout)")
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--widened", action="store_true",
                    help=f"the modules widened last, one mutmut run each: {WIDENED}")
    ap.add_argument("--record", action="store_true",
                    help=f"merge the table into {RECORD.relative_to(ROOT)}")
    args = ap.parse_args()
    unknown = [m for m in args.modules if m not in SHORT]
    if unknown:
        sys.exit(f"unknown module(s) {unknown}; choose from {sorted(SHORT)}")
    if args.widened:
        if args.modules:
            sys.exit("--widened names its own modules; give either module names or --widened")
        for module in WIDENED:  # one module at a time, each its own mutmut run
            subprocess.run([sys.executable, __file__, module, "--max-children",
                            str(args.max_children), *(["--record"] if args.record else [])],
                           check=False)
        return
    names = [list(MODULES)[SHORT[m]] for m in args.modules] or list(MODULES)
    if not args.report:
        globs = [g for n in names for g in MODULES[n]]
        if args.survivors and args.unchecked:
            sys.exit("give --survivors or --unchecked, not both")
        if args.survivors or args.unchecked:
            globs = select(results(), globs, "survivors" if args.survivors else "unchecked")
            if not globs:
                sys.exit("no survivors to re-run" if args.survivors
                         else "every mutant of these modules has a verdict")
        mutmut = Path(os.environ.get("MUTMUT") or Path(sys.executable).with_name("mutmut"))
        # Every mutant's tests run in a forked process. A fork inherits no threads, only their
        # state: torch with an OpenMP pool of 2+ threads in the parent hangs on its next
        # parallel op in the child (OMP_NUM_THREADS=1: no pool), and numba's "omp" threading
        # layer (the clustering tests' prange; NUMBA_NUM_THREADS=1 does not help) kills a child
        # that runs numba code ("fork() called from a process already using GNU OpenMP"); its
        # "workqueue" layer is fork-safe. [tool.mutmut] forks from a fork server that ran no test.
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "NUMBA_THREADING_LAYER": "workqueue"}
        subprocess.run([str(mutmut), "run", "--max-children", str(args.max_children), *globs],
                       cwd=ROOT, env=env, check=False)
    table = report(names)
    (ROOT / "mutants").mkdir(exist_ok=True)
    (ROOT / "mutants" / "scores.json").write_text(json.dumps(table, indent=1, ensure_ascii=False))
    if args.record:
        record(table)


def record(table: dict) -> None:
    """Merge ``table``'s rows into :data:`RECORD` (other modules' rows are kept)."""
    try:
        from importlib.metadata import version

        tool = f"mutmut {version('mutmut')}"
    except Exception:  # mutmut installed outside this environment's metadata
        tool = "mutmut"
    data = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    data.setdefault("score", "killed (or timed out) / checked (mutants that some selected test reaches)")
    modules = data.setdefault("modules", {})
    for name, row in table.items():
        # the hand-written notes (the runs, why the survivors survive) stay; the counts are new
        notes = {k: v for k, v in modules.get(name, {}).items() if k in NOTES}
        modules[name] = {**row, "complete": row["not_checked"] == 0 and row["crashed"] == 0
                         and row["mutants"] > 0,
                         "tool": tool, "date": time.strftime("%Y-%m-%d"), **notes}
        if "equivalent" in notes:  # only the listed mutants that still survive count
            eq = len(set(notes["equivalent"]) & set(row["survivors"]))
            left = row["checked"] - eq
            modules[name].update(equivalent_count=eq, score_without_equivalent=(
                round(row["killed"] / left, 3) if left else None))
    RECORD.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"recorded in {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
