"""Training loops: L2G distillation (BPR) and label-supervised training of cross-encoders
(:mod:`funnel_core.train.l2g`), and Fusion-in-Decoder reader training (:mod:`funnel_core.train.fid`)."""

from funnel_core.train.l2g import (
    CrossEncoderTrainer,
    TrainingGroup,
    TrainReport,
    aggregate_passage_scores,
    bpr_loss,
    init_cross_encoder,
    l2g_group,
    l2g_partition,
    listwise_loss,
    qrels_groups,
    train_l2g,
)

__all__ = [
    "CrossEncoderTrainer",
    "TrainingGroup",
    "TrainReport",
    "aggregate_passage_scores",
    "bpr_loss",
    "init_cross_encoder",
    "l2g_group",
    "l2g_partition",
    "listwise_loss",
    "qrels_groups",
    "train_l2g",
]
