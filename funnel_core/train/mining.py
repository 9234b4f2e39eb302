"""Training examples from an evaluation dataset and a first stage: positives from the labels,
hard negatives from what the first stage retrieves.

The dataset is the harness's :class:`~funnel_core.evaluation.datasets.EvalDataset` (SQuAD, BEIR,
LlamaIndex QA JSON, JSONL), the first stage any system the harness builds from a
``[systems.NAME]``-style table (``bm25``, ``dense``, ``hybrid``, ``clustered``, with ``rerank``
too), so a model is trained on candidates drawn exactly as the evaluation will draw them.

Positives (the rule of DPR, Karpukhin et al., 2020, for answer-string data):

* with relevance judgements (qrels): the judged documents (grade > 0), whether or not the first
  stage found them;
* with answer strings only: the retrieved candidates that contain a gold answer
  (:func:`~funnel_core.evaluation.metrics.has_answer`), best-ranked first.

Negatives: the retrieved candidates that are not positive (with answers: that contain no answer),
in rank order: the hard negatives of the first stage.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from funnel_core.errors import check_positive_int
from funnel_core.evaluation.datasets import EvalDataset
from funnel_core.evaluation.metrics import has_answer
from funnel_core.units import Unit

__all__ = ["MinedQuestion", "mine", "split_questions"]


@dataclass
class MinedQuestion:
    """One training question: its labels, positives and ranked hard negatives."""

    id: str
    query: str
    answers: list[str]
    positives: list[Unit]
    negatives: list[Unit]
    candidates: list[Unit] = field(default_factory=list)  # the first stage's ranking, as retrieved


def split_questions(dataset: EvalDataset, held_out: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """The labelled question ids split into (training, held out): a seeded sample of
    ``held_out`` questions is kept out of training for the model card's metrics."""
    ids = dataset.question_ids
    if held_out < 0 or held_out >= len(ids):
        raise ValueError(f"held_out must be in [0, {len(ids) - 1}] for {len(ids)} labelled questions, got "
                         f"{held_out}; lower it or use a larger [dataset].")
    rng = random.Random(seed)
    held = set(rng.sample(ids, held_out))
    return [q for q in ids if q not in held], [q for q in ids if q in held]


def _as_stage(first_stage: Any, corpus: list[Unit], indexes: dict[str, Any] | None) -> Any:
    if isinstance(first_stage, dict):
        from funnel_core.evaluation.config import build_systems

        spec = dict(first_stage)
        if "component" not in spec:
            raise ValueError(f"the first stage needs `component` (one of bm25, dense, hybrid, clustered), got "
                             f"{first_stage!r}.")
        return build_systems({"first_stage": spec}, corpus, indexes)["first_stage"]
    if callable(first_stage):
        return first_stage
    raise TypeError(f"first_stage must be a system table (dict) or a callable query -> units, got "
                    f"{type(first_stage).__name__}.")


def mine(dataset: EvalDataset, question_ids: Sequence[str], first_stage: Any, *, depth: int = 30,
         indexes: dict[str, Any] | None = None, progress: bool = False) -> list[MinedQuestion]:
    """Positives and hard negatives for ``question_ids`` of ``dataset`` (see the module docstring).

    Args:
        dataset: The labelled questions and their corpus.
        question_ids: Which questions to mine (e.g. the training part of :func:`split_questions`).
        first_stage: A system table (``{"component": "bm25", ...}``, as ``[systems.NAME]`` in
            ``funnel eval``) or any callable ``query -> list[Unit]``.
        depth: Candidates kept per question (the first stage's top-``depth``).
        indexes: Shares built indexes with other calls over the same corpus.
        progress: Show a tqdm bar.

    Questions without a positive or without a negative are kept (with an empty list): the caller
    decides what a question without a pair is worth; :func:`~funnel_core.train.runner.run_train`
    counts and drops them.
    """
    from tqdm.auto import tqdm

    check_positive_int(depth, "depth")
    stage = _as_stage(first_stage, dataset.corpus, indexes)
    by_id = {u.id: u for u in dataset.corpus}
    out: list[MinedQuestion] = []
    for qid in tqdm(list(question_ids), desc="mining", disable=not progress):
        query = dataset.queries[qid]
        ranked = list(stage(query))[:depth]
        answers = list(dataset.answers.get(qid, []))
        judged = dataset.qrels.get(qid)
        if judged:
            doc_key = lambda u: str(u.metadata.get("doc_id", u.id))  # noqa: E731
            positives = [by_id[d] for d, g in judged.items() if g > 0 and d in by_id]
            negatives = [u for u in ranked if doc_key(u) not in judged]
        else:
            hit = [has_answer(u.text, answers) for u in ranked]
            positives = [u for u, h in zip(ranked, hit) if h]
            negatives = [u for u, h in zip(ranked, hit) if not h]
        out.append(MinedQuestion(id=qid, query=query, answers=answers, positives=positives,
                                 negatives=negatives, candidates=ranked))
    return out
