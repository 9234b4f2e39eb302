"""Evaluation: answer recall, contextual integrity, IR metrics (ranx) and dataset loaders."""

from funnel_core.evaluation.datasets import (
    BeirDataset,
    SquadArticle,
    SquadQuestion,
    load_beir,
    load_squad,
    squad_question_id,
)
from funnel_core.evaluation.metrics import (
    answer_recall,
    contextual_integrity,
    has_answer,
    ir_metrics,
    normalize_answer,
    run_from_units,
)

__all__ = ["BeirDataset", "SquadArticle", "SquadQuestion", "load_beir", "load_squad", "squad_question_id",
           "answer_recall", "contextual_integrity", "has_answer", "ir_metrics",
           "normalize_answer", "run_from_units"]
