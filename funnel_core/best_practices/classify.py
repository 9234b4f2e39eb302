"""Query classification: does a request need retrieval? ("Searching for Best Practices in RAG",
section 3.1, Figure 2).

Not every request benefits from retrieval: "translate this sentence" or "summarise the text
below" carry all the information the model needs ("sufficient"), whereas "what is the
recommended dose of X?" needs knowledge from outside the request ("retrieval"). The paper
trains a classifier over 15 task types and skips retrieval for the sufficient ones, which cuts
latency without hurting accuracy.

:class:`QueryClassifier` is a small trainable model: sentence embeddings
(:class:`~funnel_core.embeddings.SentenceEmbedder`, all-MiniLM-L6-v2 by default) followed by a
scikit-learn ``LogisticRegression``. The package ships a labelled set of our own,
``funnel_core/data/query_classification.jsonl`` (one JSON object per line: ``query``, ``label``
in {"retrieval", "sufficient"}, ``task``), covering 15 task types in the spirit of the paper's
Figure 2 — retrieval: factual QA, current events, domain knowledge, claim verification, internal
documents, recommendation, planning; sufficient: translation, rewriting, summarisation,
information extraction, text classification, reasoning/maths, code, creative writing/chit-chat.
:meth:`QueryClassifier.pretrained` trains on it.

Persistence is ``json`` (config, classes) + ``npy`` (weights): no pickle, through the
commit mechanism of :mod:`funnel_core.persist`.
:class:`RetrievalGate` is a stage that runs a retrieval stage only when the classifier says so.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from funnel_core.embeddings import SentenceEmbedder
from funnel_core.errors import FunnelError, PersistError, check_probability, check_query
from funnel_core.funnel import Stage, T, as_stage
from funnel_core.persist import check_model_name, check_number, load_snapshot, save_snapshot
from funnel_core.units import Unit

__all__ = ["QueryClassifier", "RetrievalGate", "NotFittedError", "load_labelled_queries",
           "LABELS", "RETRIEVAL", "SUFFICIENT"]

RETRIEVAL = "retrieval"
SUFFICIENT = "sufficient"
LABELS = (RETRIEVAL, SUFFICIENT)
FORMAT = "funnel-rag.query-classifier"
FORMAT_VERSION = 2  # 2: snapshot layout (funnel_core.persist)
_PRETRAINED: dict[tuple, tuple[np.ndarray, float]] = {}


class NotFittedError(FunnelError, RuntimeError):
    """The classifier was used before :meth:`QueryClassifier.fit` or :meth:`QueryClassifier.load`."""


def load_labelled_queries(path: str | os.PathLike | None = None) -> list[dict[str, str]]:
    """The labelled queries (``query``, ``label``, ``task``); the packaged set by default."""
    if path is None:
        text = resources.files("funnel_core").joinpath("data/query_classification.jsonl").read_text(
            encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    for i, r in enumerate(rows):
        if r.get("label") not in LABELS or not isinstance(r.get("query"), str):
            raise ValueError(f"line {i + 1}: need a 'query' string and a 'label' in {LABELS}, got {r!r}.")
    return rows


class QueryClassifier:
    """Embeddings + logistic regression deciding "retrieval" vs "sufficient".

    Args:
        embedder: A :class:`SentenceEmbedder` (``None``: the packaged all-MiniLM-L6-v2, lazily).
        C: Inverse regularisation strength of the logistic regression.
        threshold: Retrieval is needed when ``P(retrieval) >= threshold`` (0.5). Lower it to
            retrieve more eagerly (fewer missed retrievals, more wasted ones).
        class_weight: Passed to scikit-learn (``"balanced"`` by default).
    """

    def __init__(self, *, embedder: SentenceEmbedder | None = None, C: float = 4.0,
                 threshold: float = 0.5, class_weight: str | None = "balanced") -> None:
        if not isinstance(C, (int, float)) or isinstance(C, bool) or C <= 0:
            raise ValueError(f"C must be a positive number, got {C!r}.")
        self._embedder = embedder
        self.C = float(C)
        self.threshold = check_probability(threshold, "threshold")
        self.class_weight = class_weight
        self.coef_: np.ndarray | None = None  # (dim,) weights for P(retrieval)
        self.intercept_: float = 0.0

    @property
    def embedder(self) -> SentenceEmbedder:
        if self._embedder is None:
            self._embedder = SentenceEmbedder()
        return self._embedder

    @property
    def is_fitted(self) -> bool:
        return self.coef_ is not None

    # -- training ------------------------------------------------------------------------------
    @staticmethod
    def _check_data(queries: Sequence[str], labels: Sequence[str]) -> np.ndarray:
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, got a single str.")
        if len(queries) != len(labels):
            raise ValueError(f"got {len(queries)} queries but {len(labels)} labels.")
        bad = [lab for lab in labels if lab not in LABELS]
        if bad:
            raise ValueError(f"unknown label {bad[0]!r}; labels must be one of {LABELS}.")
        y = np.array([lab == RETRIEVAL for lab in labels], dtype=int)
        if len(set(y.tolist())) < 2:
            raise ValueError(f"training needs examples of both labels {LABELS}.")
        return y

    def _model(self) -> Any:
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=self.C, class_weight=self.class_weight, max_iter=2000)

    def fit(self, queries: Sequence[str], labels: Sequence[str]) -> "QueryClassifier":
        """Train on ``queries`` labelled ``"retrieval"`` / ``"sufficient"``; returns ``self``."""
        y = self._check_data(queries, labels)
        X = self.embedder.encode([check_query(q) for q in queries])
        model = self._model().fit(X, y)
        self.coef_ = np.asarray(model.coef_[0], dtype=np.float64)
        self.intercept_ = float(model.intercept_[0])
        return self

    def cross_validate(self, queries: Sequence[str], labels: Sequence[str], *, folds: int = 5,
                       seed: int = 0, groups: Sequence[str] | None = None) -> dict[str, Any]:
        """Stratified k-fold accuracy on held-out folds (embeddings computed once).

        With ``groups`` (e.g. task types) it also reports leave-one-group-out accuracy: every
        task type is held out in turn, which measures transfer to a task type never seen.
        """
        from sklearn.model_selection import LeaveOneGroupOut, StratifiedKFold, cross_val_score

        y = self._check_data(queries, labels)
        X = self.embedder.encode([check_query(q) for q in queries])
        scores = cross_val_score(self._model(), X, y, scoring="accuracy",
                                 cv=StratifiedKFold(folds, shuffle=True, random_state=seed))
        out: dict[str, Any] = {"folds": folds, "cv_accuracy_mean": float(scores.mean()),
                               "cv_accuracy_std": float(scores.std()),
                               "cv_accuracy_per_fold": [float(s) for s in scores]}
        if groups is not None:
            groups = list(groups)
            logo = cross_val_score(self._model(), X, y, scoring="accuracy", cv=LeaveOneGroupOut(),
                                   groups=groups)
            names = sorted(set(groups))  # LeaveOneGroupOut iterates groups in sorted order
            out["leave_one_task_out_accuracy_mean"] = float(logo.mean())
            out["leave_one_task_out_accuracy"] = {n: float(s) for n, s in zip(names, logo)}
        return out

    @classmethod
    def pretrained(cls, **kwargs: Any) -> "QueryClassifier":
        """A classifier trained on the packaged labelled set (a few seconds on CPU).

        The trained weights are remembered per (embedding model, C, class_weight) for the life of
        the process, so later calls only copy them.
        """
        clf = cls(**kwargs)
        key = (clf.embedder.model_name_or_path, clf.C, clf.class_weight)
        if key not in _PRETRAINED:
            rows = load_labelled_queries()
            clf.fit([r["query"] for r in rows], [r["label"] for r in rows])
            _PRETRAINED[key] = (clf._require_fitted().copy(), clf.intercept_)
        coef, intercept = _PRETRAINED[key]
        clf.coef_, clf.intercept_ = coef.copy(), intercept
        return clf

    # -- inference -----------------------------------------------------------------------------
    def _require_fitted(self) -> np.ndarray:
        """The trained weights (raises :class:`NotFittedError` before training)."""
        if self.coef_ is None:
            raise NotFittedError("this QueryClassifier is not trained; call fit(queries, labels), "
                                 "QueryClassifier.pretrained() or QueryClassifier.load(path).")
        return self.coef_

    def predict_proba(self, queries: Sequence[str]) -> list[float]:
        """``P(retrieval)`` for each query, as Python floats."""
        coef = self._require_fitted()
        if isinstance(queries, str):
            raise TypeError("predict_proba expects a list of queries; use needs_retrieval() for one.")
        if len(queries) == 0:
            return []
        X = self.embedder.encode([check_query(q) for q in queries]).astype(np.float64)
        logits = X @ coef + self.intercept_
        return [float(p) for p in 1.0 / (1.0 + np.exp(-logits))]

    def predict(self, queries: Sequence[str]) -> list[str]:
        """``"retrieval"`` or ``"sufficient"`` for each query."""
        return [RETRIEVAL if p >= self.threshold else SUFFICIENT for p in self.predict_proba(queries)]

    def needs_retrieval(self, query: str) -> bool:
        """True when ``query`` needs retrieval. An empty query needs none (returns False)."""
        return bool(self.decide(query)["needs_retrieval"])

    def decide(self, query: str) -> dict[str, Any]:
        """``{"query", "needs_retrieval", "p_retrieval"}`` for one query (what the adapters'
        gates record as ``last_decision``); an empty query needs none, with ``p_retrieval`` 0."""
        self._require_fitted()
        query = check_query(query)
        p = self.predict_proba([query])[0] if query else 0.0
        return {"query": query, "needs_retrieval": bool(query) and p >= self.threshold, "p_retrieval": p}

    @staticmethod
    def check_trained(classifier: Any) -> "QueryClassifier":
        """``classifier`` if it is a trained :class:`QueryClassifier` (what a gate takes);
        ``TypeError`` or :class:`NotFittedError` otherwise."""
        if not isinstance(classifier, QueryClassifier):
            raise TypeError(f"classifier must be a QueryClassifier, got {type(classifier).__name__}.")
        classifier._require_fitted()
        return classifier

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Commit ``weights.npy`` and the settings to the persist folder ``path`` (see
        :mod:`funnel_core.persist`: snapshot, fsync, atomic pointer, SHA-256 per file)."""
        coef, intercept = self._require_fitted().copy(), float(self.intercept_)

        def write(folder: Path) -> dict[str, Any]:
            np.save(folder / "weights.npy", np.append(coef, intercept), allow_pickle=False)
            return {"embedder": self.embedder.model_name_or_path, "dimension": int(coef.shape[0]),
                    "C": self.C, "threshold": self.threshold, "class_weight": self.class_weight,
                    "labels": list(LABELS)}

        save_snapshot(path, FORMAT, FORMAT_VERSION, write)

    @classmethod
    def load(cls, path: str | os.PathLike, embedder: SentenceEmbedder | None = None,
             verify: bool = True) -> "QueryClassifier":
        """Load a classifier written by :meth:`save` (the embedder named in it, unless given)."""

        def read(folder: Path, manifest: dict[str, Any]) -> "QueryClassifier":
            cfg = manifest["meta"]
            try:
                name = check_model_name(cfg["embedder"])
                dim = check_number(cfg["dimension"], "dimension", 1, 1_000_000, integer=True)
                C = check_number(cfg["C"], "C", 0.0, 1e12, lo_open=True)
                threshold = check_number(cfg["threshold"], "threshold", 0.0, 1.0)
                if cfg["class_weight"] not in (None, "balanced"):
                    raise ValueError(f"invalid class_weight {cfg['class_weight']!r:.60}")
                if cfg.get("labels", list(LABELS)) != list(LABELS):
                    raise ValueError(f"unknown labels {cfg.get('labels')!r:.80}")
            except (KeyError, TypeError, ValueError) as exc:
                raise PersistError(f"the query classifier at {str(path)!r} has an invalid setting "
                                   f"({type(exc).__name__}: {exc}); retrain and save it again.") from exc
            w = np.load(folder / "weights.npy", allow_pickle=False)
            if w.ndim != 1 or w.shape[0] != dim + 1 or not np.isfinite(w).all():
                raise PersistError(f"the query classifier at {str(path)!r} is inconsistent "
                                   f"(weights {w.shape}, config dimension {dim}).")
            clf = cls(embedder=embedder or SentenceEmbedder(name), C=C, threshold=threshold,
                      class_weight=cfg["class_weight"])
            clf.coef_, clf.intercept_ = w[:-1].astype(np.float64), float(w[-1])
            return clf

        return load_snapshot(path, FORMAT, FORMAT_VERSION, "query classifier", read, verify=verify)


class RetrievalGate(Stage):
    """Run ``stage`` only for queries that need retrieval; otherwise return the input units.

    For a "sufficient" query the incoming units (usually none) pass through untouched, so the
    generator answers from the request alone.

    Args:
        classifier: A trained :class:`QueryClassifier`.
        stage: The retrieval stage or funnel to gate (or any ``callable(query, units)``).
    """

    def __init__(self, classifier: QueryClassifier, stage: Any, name: str = "retrieval_gate") -> None:
        self.classifier = QueryClassifier.check_trained(classifier)
        self.stage, self.name = as_stage(stage), name

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        if self.classifier.needs_retrieval(query):
            return self.stage(query, units)
        return units

    def no_query(self, items: Sequence[T]) -> list[T]:
        """An empty query: what the gated stage returns for one (its ``top_n`` caps), then this
        gate's cut-off."""
        return super().no_query(self.stage.no_query(items))
