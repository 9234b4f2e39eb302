"""Metrics: answer recall (FunnelRAG Appendix B.3), contextual integrity (Appendix C.3), a
reader's exact match and token F1 (the SQuAD v1.1 evaluation script's definitions), and standard
IR metrics through `ranx <https://github.com/AmenRa/ranx>`_.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Mapping, Sequence

from funnel_core.text import has_answer, normalize_answer
from funnel_core.units import Unit

__all__ = ["normalize_answer", "has_answer", "answer_recall", "contextual_integrity", "exact_match", "token_f1",
           "ir_metrics", "ir_metrics_per_query", "run_from_units"]

def answer_recall(units: Sequence[Unit], answers: Iterable[str], k: int) -> float:
    """AR@k: 1.0 when an answer string appears in the concatenation of the top-``k`` units."""
    return 1.0 if has_answer(" ".join(u.text for u in units[:k]), list(answers)) else 0.0


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer (SQuAD EM)."""
    pred = normalize_answer(prediction)
    return 1.0 if any(pred == normalize_answer(a) for a in answers) else 0.0


def token_f1(prediction: str, answers: Iterable[str]) -> float:
    """The best token-level F1 of the prediction against any gold answer (SQuAD F1): the harmonic
    mean of precision and recall over the multiset of normalised tokens they share."""
    pred = normalize_answer(prediction).split()
    pred_counts = Counter(pred)
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        same = sum((pred_counts & Counter(gold)).values())
        if same:
            precision, recall = same / len(pred), same / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def contextual_integrity(units: Sequence[Unit], k: int, key: str = "title") -> float:
    """Entropy (bits) of the source titles of the top-``k`` units; lower means more coherent."""
    titles = [u.metadata.get(key, u.parent_id or u.id) for u in units[:k]]
    if not titles:
        return 0.0
    counts = Counter(titles)
    n = len(titles)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def run_from_units(results: Mapping[str, Sequence[Unit]], id_key: str | None = None) -> dict:
    """``{query_id: units}`` -> ranx run dict ``{query_id: {doc_id: score}}``.

    ``id_key`` reads the document id from metadata (e.g. ``"doc_id"`` for passages), keeping the
    best score per document — document-level evaluation of finer units.
    """
    run: dict[str, dict[str, float]] = {}
    for qid, units in results.items():
        scores: dict[str, float] = {}
        n = len(units)
        for rank, u in enumerate(units):
            did = str(u.metadata.get(id_key, u.id)) if id_key else u.id
            s = float(n - rank)  # rank-based scores: robust to ties and mixed score scales
            if s > scores.get(did, -math.inf):
                scores[did] = s
        run[qid] = scores
    return run


def _ranx_inputs(qrels: Mapping[str, Mapping[str, int]],
                 run: Mapping[str, Mapping[str, float]]) -> tuple[dict, dict]:
    # plain ints and floats: numpy scalars (float32 BM25 scores) would make ranx compile its numba
    # metrics again for another type signature (seconds per new signature)
    qrels = {q: {doc: int(g) for doc, g in d.items()} for q, d in qrels.items() if d}
    full_run = {q: {doc: float(s) for doc, s in (run.get(q) or {}).items()} for q in qrels}
    for q, d in full_run.items():  # ranx rejects empty rankings; a non-relevant dummy scores 0
        if not d:
            full_run[q] = {"__none__": 0.0}
    return qrels, full_run


def ir_metrics_per_query(qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]],
                         metrics: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{metric: {query_id: value}}`` through ranx, for every judged query (missing or empty
    rankings count as zero). Metric names are ranx's (``ndcg@10``, ``recall@100``, ``mrr``,
    ``map@100``, ``precision@5``, ``hit_rate@10``, ...)."""
    from ranx import Qrels, Run, evaluate

    qrels, full_run = _ranx_inputs(qrels, run)
    if not qrels:
        return {m: {} for m in metrics}
    r = Run(full_run)
    evaluate(Qrels(qrels), r, list(metrics), make_comparable=True)
    return {m: {q: float(v) for q, v in r.scores[m].items()} for m in metrics}


def ir_metrics(qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]],
               metrics: Sequence[str] = ("ndcg@10", "recall@100")) -> dict[str, float]:
    """Evaluate a run with ranx; queries missing from the run count as zero."""
    from ranx import Qrels, Run, evaluate

    qrels, full_run = _ranx_inputs(qrels, run)
    res = evaluate(Qrels(qrels), Run(full_run), list(metrics), make_comparable=True)
    if isinstance(res, float):
        res = {metrics[0]: res}
    return {m: float(v) for m, v in res.items()}
