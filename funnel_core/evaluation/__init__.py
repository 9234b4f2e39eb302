"""Evaluation: dataset loaders, metrics (answer recall, contextual integrity, a reader's exact
match and token F1, ranx IR metrics), statistics, and the harness ``evaluate(systems, dataset) ->
Report`` that compares any retrieval pipelines (``funnel_core`` funnels, LlamaIndex and LangChain
retrievers) on quality and cost.

Nothing here imports a framework; ranx, matplotlib and tqdm load on use.
"""

from funnel_core.evaluation.datasets import (
    FORMATS,
    BeirDataset,
    EvalDataset,
    SquadArticle,
    SquadQuestion,
    load_beir,
    load_dataset,
    load_squad,
    squad_question_id,
)
from funnel_core.evaluation.harness import READER_PROMPT, evaluate, parse_metric, wait_for_quiet
from funnel_core.evaluation.metrics import (
    answer_recall,
    contextual_integrity,
    exact_match,
    has_answer,
    ir_metrics,
    ir_metrics_per_query,
    normalize_answer,
    run_from_units,
    token_f1,
)
from funnel_core.evaluation.report import Report
from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap, percentile
from funnel_core.evaluation.systems import System

__all__ = ["FORMATS", "BeirDataset", "EvalDataset", "SquadArticle", "SquadQuestion", "load_beir", "load_dataset",
           "load_squad", "squad_question_id", "evaluate", "READER_PROMPT", "parse_metric", "wait_for_quiet", "Report", "System",
           "answer_recall", "contextual_integrity", "exact_match", "token_f1", "has_answer", "ir_metrics", "ir_metrics_per_query",
           "normalize_answer", "run_from_units", "bootstrap_ci", "mcnemar_exact", "paired_bootstrap",
           "percentile"]
