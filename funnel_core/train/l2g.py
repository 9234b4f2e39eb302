"""Train cross-encoder pre-rankers: FunnelRAG's local-to-global (L2G) distillation and the
label-supervised mode with BM25 hard negatives.

FunnelRAG (section 3.2) trains the document-level pre-ranker from the passage-level post-ranker:

* eq. 4 — aggregate the post-ranker's passage scores to their parent document::

      S_d = alpha * max_p S_p + (1 - alpha) * mean_p S_p

* eq. 5 — positives are the documents that contain the answer (the hits) plus the top-K documents
  by ``S_d``; negatives are the remaining candidate documents;
* eq. 6 — the pre-ranker is trained with the pairwise BPR loss ``-log sigmoid(S+ - S-)`` summed
  over every (positive, negative) pair of a query (:class:`CrossEncoderTrainer`'s default,
  ``num_negatives=None``; a number samples that many negatives per positive instead).

:func:`aggregate_passage_scores`, :func:`l2g_partition` and :func:`l2g_group` implement eqs. 4-5 and
produce :class:`TrainingGroup` objects; :func:`qrels_groups` produces the same objects from relevance
labels with BM25 hard negatives. :class:`CrossEncoderTrainer` trains any Hugging Face sequence
classifier with one logit on those groups (BPR, eq. 6, or listwise softmax cross-entropy), on CPU if
need be, and saves a folder that :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer`
loads. :func:`init_cross_encoder` turns a BERT *encoder* (e.g. all-MiniLM-L6-v2) into an untrained
cross-encoder to start from.

torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from funnel_core.errors import check_positive_int, check_probability
from funnel_core.evaluation.metrics import has_answer
from funnel_core.units import Unit

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from funnel_core.bm25 import BM25Index

__all__ = [
    "TrainingGroup",
    "TrainReport",
    "aggregate_passage_scores",
    "l2g_partition",
    "l2g_group",
    "qrels_groups",
    "bpr_loss",
    "listwise_loss",
    "init_cross_encoder",
    "CrossEncoderTrainer",
    "train_l2g",
]


@dataclass
class TrainingGroup:
    """One query with its positive and negative texts (the unit a trainer samples from)."""

    query: str
    positives: list[str]
    negatives: list[str]
    query_id: str | None = None


@dataclass
class TrainReport:
    """What a training run did: where the model is, the loss curve, and how long it took."""

    path: str
    steps: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    stopped_early: bool = False

    def first_last_loss(self, window: int = 10) -> tuple[float, float]:
        """Mean loss over the first and the last ``window`` steps."""
        if not self.losses:
            return float("nan"), float("nan")
        w = max(1, min(window, len(self.losses) // 2 or 1))
        return (sum(self.losses[:w]) / w, sum(self.losses[-w:]) / w)


# -- L2G labels (eqs. 4-5) ------------------------------------------------------------------
def aggregate_passage_scores(passages: Iterable[Unit], alpha: float = 0.5) -> dict[str, float]:
    """Eq. 4: ``S_d = alpha * max + (1 - alpha) * mean`` of the passage scores of each document.

    Args:
        passages: Scored passage units; each must carry ``parent_id`` (its document) and ``score``
            (the post-ranker's score).
        alpha: Weight of the maximum against the mean, in [0, 1].

    Returns:
        ``{document id: aggregated score}``.
    """
    alpha = check_probability(alpha, "alpha")
    by_doc: dict[str, list[float]] = {}
    for p in passages:
        if p.parent_id is None:
            raise ValueError(f"passage {p.id!r} has no parent_id; split documents with LaterChunking "
                             "so every passage knows its document.")
        if p.score is None:
            raise ValueError(f"passage {p.id!r} has no score; score passages with the post-ranker "
                             "before aggregating.")
        by_doc.setdefault(p.parent_id, []).append(float(p.score))
    return {d: alpha * max(s) + (1.0 - alpha) * (sum(s) / len(s)) for d, s in by_doc.items()}


def l2g_partition(doc_ids: Sequence[str], doc_scores: Mapping[str, float], hits: Iterable[str],
                  top_k: int = 1) -> tuple[list[str], list[str]]:
    """Eq. 5: positives = hits plus the top-``top_k`` documents by aggregated score; negatives = the rest.

    Documents without an aggregated score (no passage was scored) rank last. Order of
    ``doc_ids`` is kept inside each returned list.
    """
    top_k = int(top_k)
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}.")
    ranked = sorted(doc_ids, key=lambda d: -doc_scores.get(d, -math.inf))
    positive = set(hits) & set(doc_ids) | set(ranked[:top_k])
    return ([d for d in doc_ids if d in positive], [d for d in doc_ids if d not in positive])


def l2g_group(query: str, documents: Sequence[Unit], passages: Sequence[Unit],
              answers: Sequence[str] = (), *, alpha: float = 0.5, top_k: int = 1,
              query_id: str | None = None) -> TrainingGroup | None:
    """Build one L2G training group (eqs. 4-5).

    Args:
        query: The question.
        documents: Candidate documents (the pre-ranker's input for this query).
        passages: Their passages scored by the post-ranker (``parent_id`` = document id).
        answers: Gold answer strings; a document containing one is a hit (a positive).
        alpha: Max/mean weight of eq. 4.
        top_k: How many documents by aggregated score join the positives (eq. 5).

    Returns:
        A :class:`TrainingGroup`, or ``None`` when all candidates are positive or negative
        (no pair to learn from).
    """
    scores = aggregate_passage_scores(passages, alpha)
    ids = [d.id for d in documents]
    hits = [d.id for d in documents if answers and has_answer(d.text, answers)]
    pos, neg = l2g_partition(ids, scores, hits, top_k)
    if not pos or not neg:
        return None
    text = {d.id: d.text for d in documents}
    return TrainingGroup(query=query, positives=[text[i] for i in pos],
                         negatives=[text[i] for i in neg], query_id=query_id)


def qrels_groups(queries: Mapping[str, str], qrels: Mapping[str, Mapping[str, int]],
                 corpus: Sequence[Unit], *, index: "BM25Index | None" = None,
                 depth: int = 30) -> list[TrainingGroup]:
    """Label-supervised groups: positives from ``qrels``, negatives = BM25 hard negatives.

    The negatives of a query are its BM25 top-``depth`` documents that are not judged relevant.

    Args:
        queries: ``{query id: text}``.
        qrels: ``{query id: {doc id: relevance}}``; relevance > 0 is a positive.
        corpus: The documents (``Unit.id`` = doc id).
        index: A BM25 index over ``corpus`` (built with default settings when ``None``).
        depth: How deep in the BM25 ranking hard negatives are taken from.
    """
    check_positive_int(depth, "depth")
    from funnel_core.bm25 import BM25Index

    if index is None:
        index = BM25Index().index(corpus)
    text = {u.id: u.text for u in corpus}
    qids = [q for q in qrels if q in queries]
    hits = index.search_many([queries[q] for q in qids], k=depth)
    groups = []
    for qid, ranked in zip(qids, hits):
        pos = [d for d, r in qrels[qid].items() if r > 0 and d in text]
        neg = [u.id for u in ranked if u.id not in qrels[qid]]
        if pos and neg:
            groups.append(TrainingGroup(query=queries[qid], positives=[text[d] for d in pos],
                                        negatives=[text[d] for d in neg], query_id=qid))
    return groups


# -- losses (eq. 6) --------------------------------------------------------------------------
def bpr_loss(positive: "torch.Tensor", negatives: "torch.Tensor") -> "torch.Tensor":
    """Eq. 6: mean of ``-log sigmoid(S+ - S-)`` over every (positive, negative) pair.

    ``positive`` has shape ``(B,)`` or ``(B, 1)``; ``negatives`` has shape ``(B, n)``.
    """
    import torch.nn.functional as F

    return -F.logsigmoid(positive.reshape(-1, 1) - negatives).mean()


def group_pair_losses(positives: "torch.Tensor", negatives: "torch.Tensor",
                      loss: str = "bpr") -> "torch.Tensor":
    """Per-term losses of one query: ``positives`` ``(P,)`` and ``negatives`` ``(N,)`` scores.

    ``"bpr"`` (eq. 6): ``-log sigmoid(S+_p - S-_n)`` for every one of the ``P * N`` pairs;
    ``"listwise"``: for every positive, the softmax cross-entropy against all ``N`` negatives
    (``P`` terms). The trainer averages the terms of a step (eq. 6's sum divided by the step's
    number of terms, which varies from step to step).
    """
    if loss == "bpr":
        return _LOSSES["bpr_terms"](positives, negatives)
    return _LOSSES["listwise_terms"](positives, negatives)


def _bpr_terms(positives: "torch.Tensor", negatives: "torch.Tensor") -> "torch.Tensor":
    import torch.nn.functional as F

    return -F.logsigmoid(positives.reshape(-1, 1) - negatives.reshape(1, -1)).reshape(-1)


def _listwise_terms(positives: "torch.Tensor", negatives: "torch.Tensor") -> "torch.Tensor":
    import torch
    import torch.nn.functional as F

    p = positives.reshape(-1, 1)
    logits = torch.cat([p, negatives.reshape(1, -1).expand(len(p), -1)], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(p), dtype=torch.long, device=logits.device),
                           reduction="none")


def listwise_loss(positive: "torch.Tensor", negatives: "torch.Tensor") -> "torch.Tensor":
    """Softmax cross-entropy of the positive against its negatives (a listwise alternative)."""
    import torch
    import torch.nn.functional as F

    logits = torch.cat([positive.reshape(-1, 1), negatives], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


_LOSSES = {"bpr": bpr_loss, "listwise": listwise_loss, "bpr_terms": _bpr_terms,
           "listwise_terms": _listwise_terms}
_LOSS_NAMES = ("bpr", "listwise")


# -- model initialisation --------------------------------------------------------------------
def init_cross_encoder(encoder_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                       seed: int = 0) -> str:
    """Save an untrained cross-encoder (``AutoModelForSequenceClassification``, one logit)
    initialised from a BERT-style encoder folder, e.g. :func:`funnel_core.testing.minilm_path`.

    The encoder weights are reused; the pooler (if absent) and the one-logit head start random
    (seeded). Returns ``out_dir``.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from funnel_core.models import load_pretrained

    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialised head" warnings are expected here
    try:
        model = load_pretrained(AutoModelForSequenceClassification.from_pretrained, encoder_path,
                                what="encoder", num_labels=1)
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, encoder_path, what="tokenizer")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


# -- trainer ---------------------------------------------------------------------------------
class CrossEncoderTrainer:
    """Train a one-logit cross-encoder on :class:`TrainingGroup` objects.

    By default (``num_negatives=None``, eq. 6) each step takes ``queries_per_step`` queries and
    scores every positive and every negative of each in one forward pass; the BPR loss is the
    mean of ``-log sigmoid(S+ - S-)`` over **every** (positive, negative) pair of those queries
    (eq. 6 sums over the pairs; the mean divides that sum by the step's pair count, which varies
    with the groups in the step, so it is not a constant rescaling). One epoch visits every
    query, hence every pair, once. With ``num_negatives=n`` each step instead takes
    ``queries_per_step`` (query, positive) items and samples ``n`` negatives for each (with
    replacement when a query has fewer); one epoch visits every (query, positive) item once.
    ``loss="listwise"`` is the softmax cross-entropy of each positive against its negatives.
    AdamW with linear warm-up and decay; gradients clipped to 1.

    Args:
        model: Hub name or folder of a sequence classifier with one logit (see
            :func:`init_cross_encoder` to start from an encoder).
        max_length: Tokens per (query, passage) pair; the passage is truncated, never the query
            (queries longer than half of it are clipped to half).
        learning_rate: AdamW learning rate of the encoder.
        weight_decay: AdamW weight decay.
        warmup_ratio: Share of the steps with a linear learning-rate warm-up.
        epochs: Passes over the (query, positive) pairs.
        num_negatives: ``None`` (default, eq. 6): every negative of a query meets every positive;
            a number: negatives sampled per positive.
        queries_per_step: Queries (or, when sampling, (query, positive) items) per optimiser
            step.
        loss: ``"bpr"`` (eq. 6) or ``"listwise"``.
        freeze_embeddings: Keep the word-embedding matrix fixed (half of MiniLM's parameters:
            faster steps on CPU and less over-fitting on small data).
        freeze_layers: Also keep the lowest ``freeze_layers`` transformer layers fixed (no backward
            pass through them: faster steps on CPU).
        head_learning_rate: Learning rate of the pooler and the new classification head (they
            start random when the model comes from an encoder); ``None`` = ``learning_rate``.
        bf16: Train under bfloat16 autocast (about 1.6x faster steps on CPUs with AVX512-BF16 or
            AMX; the weights and the optimiser stay fp32). An explicit request: on hardware
            without native bf16 it warns once (25-30x slower steps were measured there).
        dtype: ``"auto"`` (default): bf16 autocast only where the hardware runs bf16 natively
            (:mod:`funnel_core.hardware`), fp32 otherwise; ``"float32"`` or ``"bfloat16"``.
            float16 is not used for training (it would need loss scaling): it trains in fp32.
        max_seconds: Stop after this many seconds of training (the model is still saved), or ``None``.
        max_steps: Stop after this many optimiser steps, or ``None`` (all ``epochs``). When set, the
            learning-rate schedule spans ``min(max_steps, epochs * steps per epoch)`` steps, so two
            runs on different groups with the same ``max_steps`` take the same steps on the same
            schedule (the "same budget" control of L2G against label-only training).
        device: ``"cpu"``, ``"cuda"``, ... or ``None`` for automatic.
        seed: Seed for sampling and dropout.
        show_progress: Show a tqdm bar with the running loss.
        log_path: Append one JSON line per ``log_every`` steps to this file.
    """

    def __init__(self, *, model: str | os.PathLike, max_length: int = 256,
                 learning_rate: float = 3e-5, weight_decay: float = 0.01, warmup_ratio: float = 0.1,
                 epochs: int = 1, num_negatives: int | None = None, queries_per_step: int = 4,
                 loss: str = "bpr", freeze_embeddings: bool = True, freeze_layers: int = 0,
                 head_learning_rate: float | None = None, bf16: bool = False, dtype: str = "auto",
                 max_seconds: float | None = None, max_steps: int | None = None,
                 device: str | None = None, seed: int = 0,
                 show_progress: bool = True, log_path: str | os.PathLike | None = None,
                 log_every: int = 10) -> None:
        if loss not in _LOSS_NAMES:
            raise ValueError(f"loss must be one of {list(_LOSS_NAMES)}, got {loss!r}.")
        self.model = str(model)
        self.max_length = check_positive_int(max_length, "max_length")
        self.learning_rate = float(learning_rate)
        self.weight_decay = float(weight_decay)
        self.warmup_ratio = check_probability(warmup_ratio, "warmup_ratio")
        self.epochs = check_positive_int(epochs, "epochs")
        self.num_negatives = check_positive_int(num_negatives, "num_negatives", allow_none=True)
        self.queries_per_step = check_positive_int(queries_per_step, "queries_per_step")
        self.loss = loss
        self.freeze_embeddings = freeze_embeddings
        if isinstance(freeze_layers, bool) or not isinstance(freeze_layers, int) or freeze_layers < 0:
            raise ValueError(f"freeze_layers must be an int >= 0, got {freeze_layers!r}.")
        self.freeze_layers = freeze_layers
        self.head_learning_rate = None if head_learning_rate is None else float(head_learning_rate)
        from funnel_core.hardware import normalize_dtype

        self.bf16 = bool(bf16)
        self.dtype = normalize_dtype(dtype)
        self.active_dtype: str | None = None  # "bfloat16" or "float32" once training started
        self.max_seconds = max_seconds
        self.max_steps = None if max_steps is None else check_positive_int(max_steps, "max_steps")
        self.device = device
        self.seed = seed
        self.show_progress = show_progress
        self.log_path = log_path
        self.log_every = check_positive_int(log_every, "log_every")

    def config(self) -> dict[str, Any]:
        """The settings of this trainer (saved next to the model)."""
        return {k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in vars(self).items()}

    def _items(self, groups: Sequence[TrainingGroup], rng: random.Random) -> list[tuple[int, int]]:
        items = [(g, p) for g, grp in enumerate(groups) for p in range(len(grp.positives))]
        rng.shuffle(items)
        return items

    def steps(self, groups: Sequence[TrainingGroup], rng: random.Random
              ) -> list[list[tuple[str, list[str], list[str]]]]:
        """One epoch's optimiser steps; each a list of ``(query, positives, negatives)``: every
        (positive, negative) pair of an entry enters that step's loss.

        ``num_negatives=None``: one entry per query with all its positives and negatives (every
        pair of eq. 6 once per epoch); a number: one entry per (query, positive) item with that
        many sampled negatives.
        """
        if self.num_negatives is None:
            order = list(range(len(groups)))
            rng.shuffle(order)
            entries = [(groups[g].query, list(groups[g].positives), list(groups[g].negatives))
                       for g in order]
        else:
            entries = [(groups[g].query, [groups[g].positives[p]], self._negatives(groups[g], rng))
                       for g, p in self._items(groups, rng)]
        q = self.queries_per_step
        return [entries[b:b + q] for b in range(0, len(entries), q)]

    def _negatives(self, group: TrainingGroup, rng: random.Random) -> list[str]:
        n = self.num_negatives
        assert n is not None
        if len(group.negatives) >= n:
            return rng.sample(group.negatives, n)
        return [rng.choice(group.negatives) for _ in range(n)]  # few negatives: sample with replacement

    def _freeze(self, model: Any) -> None:
        base = model.base_model
        if self.freeze_embeddings:
            base.get_input_embeddings().weight.requires_grad_(False)
        if self.freeze_layers:
            layers = getattr(getattr(base, "encoder", None), "layer", None)
            if layers is None:
                raise ValueError(f"freeze_layers needs a BERT-style model (base_model.encoder.layer); "
                                 f"{type(model).__name__} has none. Use freeze_layers=0.")
            for layer in list(layers)[: self.freeze_layers]:
                layer.requires_grad_(False)

    def train(self, groups: Sequence[TrainingGroup], out_dir: str | os.PathLike, *,
              checkpointer: Any = None) -> TrainReport:
        """Train on ``groups`` and save the model, tokenizer and ``training.json`` to ``out_dir``.

        ``checkpointer`` (a :class:`~funnel_core.train.checkpoint.Checkpointer`) saves the run's
        state every few minutes and resumes a saved one, skipping the steps already taken (the
        steps are drawn from ``seed``, so the same ones are skipped)."""
        import torch
        from tqdm.auto import tqdm
        from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

        from funnel_core.models import load_pretrained, resolve_device
        from funnel_core.rerank.cross_encoder import encode_pairs

        groups = [g for g in groups if g.positives and g.negatives]
        if not groups:
            raise ValueError("no training group has both a positive and a negative; check the "
                             "labels (qrels/answers) and the candidate lists.")
        rng = random.Random(self.seed)
        torch.manual_seed(self.seed)
        device = resolve_device(self.device)
        from funnel_core.hardware import resolve_dtype

        use_bf16 = resolve_dtype("bfloat16" if self.bf16 else self.dtype, device) == "bfloat16"
        self.active_dtype = "bfloat16" if use_bf16 else "float32"
        tokenizer = load_pretrained(AutoTokenizer.from_pretrained, self.model, what="tokenizer")
        model = load_pretrained(AutoModelForSequenceClassification.from_pretrained, self.model,
                                what="cross-encoder", num_labels=1).to(device)
        self._freeze(model)
        params = [p for p in model.parameters() if p.requires_grad]
        head_lr = self.head_learning_rate or self.learning_rate
        buckets: dict[tuple[float, float], list] = {}
        for pname, p in model.named_parameters():
            if not p.requires_grad:
                continue
            is_head = pname.startswith(("classifier", "score")) or ".pooler." in f".{pname}"
            key = (head_lr if is_head else self.learning_rate,
                   self.weight_decay if p.ndim >= 2 else 0.0)
            buckets.setdefault(key, []).append(p)
        optimizer = torch.optim.AdamW([{"params": ps, "lr": lr, "weight_decay": wd}
                                       for (lr, wd), ps in buckets.items()])
        units_per_epoch = (len(groups) if self.num_negatives is None
                           else sum(len(g.positives) for g in groups))
        per_epoch = math.ceil(units_per_epoch / self.queries_per_step)
        total = per_epoch * self.epochs
        if self.max_steps is not None:
            total = min(total, self.max_steps)
        scheduler = get_linear_schedule_with_warmup(optimizer, int(self.warmup_ratio * total), total)
        losses: list[float] = []
        done = 0  # steps taken by the run this one resumes
        resumed = checkpointer.load(model, optimizer, scheduler) if checkpointer is not None else None
        if resumed:
            losses, done = list(resumed["losses"]), int(resumed["step"])
        log = open(self.log_path, "a", encoding="utf-8") if self.log_path else None
        start, step, stopped = time.perf_counter(), 0, False
        model.train()
        bar = tqdm(total=total, desc=f"train {self.loss}", disable=not self.show_progress, initial=done)
        try:
            for epoch in range(self.epochs):
                for entries in self.steps(groups, rng):
                    if step >= total:
                        break
                    if step < done:  # resumed: taken before
                        step += 1
                        continue
                    queries, texts, sizes = [], [], []
                    for query, pos, neg in entries:
                        queries += [query] * (len(pos) + len(neg))
                        texts += pos + neg
                        sizes.append((len(pos), len(neg)))
                    enc = encode_pairs(tokenizer, queries, texts, self.max_length).to(device)
                    with torch.autocast(device_type=torch.device(device).type,
                                        dtype=torch.bfloat16, enabled=use_bf16):
                        logits = model(**enc).logits.float().reshape(-1)
                    terms, at = [], 0
                    for n_pos, n_neg in sizes:
                        terms.append(group_pair_losses(logits[at:at + n_pos],
                                                       logits[at + n_pos:at + n_pos + n_neg],
                                                       self.loss))
                        at += n_pos + n_neg
                    loss = torch.cat(terms).mean()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(params, 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    step += 1
                    losses.append(float(loss.item()))
                    recent = losses[-self.log_every:]
                    bar.update(1)
                    bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}")
                    if log and step % self.log_every == 0:
                        log.write(json.dumps({"step": step, "of": total, "epoch": epoch,
                                              "loss": sum(recent) / len(recent),
                                              "seconds": round(time.perf_counter() - start, 1)})
                                  + "\n")
                        log.flush()
                    if checkpointer is not None:
                        checkpointer.save(model, optimizer, scheduler, {"step": step, "losses": losses})
                    if self.max_seconds is not None and time.perf_counter() - start > self.max_seconds:
                        stopped = True
                        break
                if stopped or step >= total:
                    break
        finally:
            bar.close()
            if log:
                log.close()
        seconds = time.perf_counter() - start
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.eval()
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        report = TrainReport(path=str(out), steps=step, seconds=seconds, losses=losses,
                             config=self.config(), stopped_early=stopped)
        (out / "training.json").write_text(json.dumps(
            {**asdict(report), "groups": len(groups), "planned_steps": total}, indent=1),
            encoding="utf-8")
        return report


def train_l2g(examples: Iterable[Mapping[str, Any]], *, model: str | os.PathLike,
              out_dir: str | os.PathLike, alpha: float = 0.5, top_k: int = 1,
              **trainer_kwargs: Any) -> TrainReport:
    """L2G distillation in one call (FunnelRAG section 3.2).

    Args:
        examples: Dicts with ``"query"``, ``"documents"`` (candidate document units),
            ``"passages"`` (their passages scored by the post-ranker, ``parent_id`` set) and
            optionally ``"answers"`` (gold answer strings).
        model: Starting checkpoint (hub name or folder) of the pre-ranker.
        out_dir: Where to save the trained pre-ranker.
        alpha: Weight of the max in eq. 4 (the mean gets ``1 - alpha``).
        top_k: Documents taken as positives by aggregated score in eq. 5.
        **trainer_kwargs: Passed to :class:`CrossEncoderTrainer` (``loss`` defaults to ``"bpr"``).
    """
    groups = []
    for ex in examples:
        g = l2g_group(ex["query"], ex["documents"], ex["passages"], ex.get("answers", ()),
                      alpha=alpha, top_k=top_k, query_id=ex.get("query_id"))
        if g is not None:
            groups.append(g)
    trainer_kwargs.setdefault("loss", "bpr")
    return CrossEncoderTrainer(model=model, **trainer_kwargs).train(groups, out_dir)
