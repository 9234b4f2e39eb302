"""L2G distillation (FunnelRAG eqs. 4-6) and label-supervised training of cross-encoders."""

import json
import math

import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.train import (
    CrossEncoderTrainer,
    TrainingGroup,
    aggregate_passage_scores,
    bpr_loss,
    init_cross_encoder,
    l2g_group,
    l2g_partition,
    listwise_loss,
    qrels_groups,
    train_l2g,
)
from funnel_core.units import Unit

pytestmark = pytest.mark.models  # builds or loads a model in most tests


def _p(pid, parent, score):
    return Unit(id=pid, text=pid, score=score, parent_id=parent)


def test_aggregate_is_alpha_max_plus_mean():
    passages = [_p("a#0", "a", 1.0), _p("a#1", "a", 3.0), _p("b#0", "b", 2.0)]
    agg = aggregate_passage_scores(passages, alpha=0.25)
    assert agg["a"] == pytest.approx(0.25 * 3.0 + 0.75 * 2.0)
    assert agg["b"] == pytest.approx(2.0)
    assert aggregate_passage_scores(passages, alpha=1.0)["a"] == 3.0
    assert aggregate_passage_scores(passages, alpha=0.0)["a"] == 2.0
    with pytest.raises(ValueError, match="parent_id; split documents with LaterChunking so every passage knows its document."):
        aggregate_passage_scores([Unit(id="x", text="x", score=1.0)])
    with pytest.raises(ValueError, match="no score; score passages with the post-ranker before aggregating."):
        aggregate_passage_scores([Unit(id="x", text="x", parent_id="a")])
    with pytest.raises(ValueError, match="^alpha"):
        aggregate_passage_scores(passages, alpha=1.5)


def test_partition_hits_plus_top_k():
    ids = ["d1", "d2", "d3", "d4"]
    scores = {"d1": 0.1, "d2": 0.9, "d3": 0.5}  # d4 unscored ranks last
    pos, neg = l2g_partition(ids, scores, hits=["d4"], top_k=1)
    assert pos == ["d2", "d4"] and neg == ["d1", "d3"]
    assert l2g_partition(ids, scores, hits=["d4"]) == (pos, neg)          # top_k defaults to 1
    pos, neg = l2g_partition(ids, scores, hits=[], top_k=2)
    assert pos == ["d2", "d3"] and neg == ["d1", "d4"]
    with pytest.raises(ValueError, match="top_k"):
        l2g_partition(ids, scores, [], top_k=-1)


def test_l2g_group_from_later_chunked_documents():
    docs = [Unit(id="paris", text="Paris is the capital of France. It is large.", level="document"),
            Unit(id="berlin", text="Berlin is the capital of Germany. It is large.", level="document"),
            Unit(id="bm25", text="BM25 ranks documents. It uses term statistics.", level="document")]
    passages = LaterChunking(words=6)("q", docs)
    post = {"paris": 0.2, "berlin": 0.9, "bm25": 0.1}  # post-ranker prefers Berlin's passages
    scored = [p.rescored(post[p.parent_id] + 0.01 * p.funnel["position"], "post") for p in passages]
    g = l2g_group("capital of France?", docs, scored, answers=["Paris"], top_k=1)
    assert set(g.positives) == {docs[0].text, docs[1].text}  # the hit + the top-1 by S_d
    assert g.negatives == [docs[2].text]
    assert l2g_group("q", docs[:1], scored[:1], answers=["Paris"], top_k=1) is None  # no negative
    default = l2g_group("capital of France?", docs, scored, answers=["Paris"], query_id="q7")
    assert (default.positives, default.negatives, default.query_id) == (g.positives, g.negatives, "q7")
    # alpha reaches eq. 4: BM25's passages score 5 and -5 (max 5, mean 0), Berlin's 0.9 and 0.9
    hand = [_p("b1", "berlin", 0.9), _p("b2", "berlin", 0.9), _p("m1", "bm25", 5.0),
            _p("m2", "bm25", -5.0), _p("p1", "paris", 0.2)]
    assert l2g_group("q", docs, hand, top_k=1, alpha=1.0).positives == [docs[2].text]
    assert l2g_group("q", docs, hand, top_k=1, alpha=0.0).positives == [docs[1].text]
    assert l2g_group("q", docs, hand, top_k=1).positives == [docs[2].text]   # 0.5: 2.5 > 0.9
    assert l2g_group("q", docs, hand).positives == [docs[2].text]            # default top_k = 1


def test_bpr_and_listwise_losses():
    import torch

    pos = torch.tensor([2.0, 0.0])
    neg = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    expected = -sum(math.log(1 / (1 + math.exp(-(p - n))))
                    for p, row in zip([2.0, 0.0], [[1.0, 0.0], [0.0, 1.0]]) for n in row) / 4
    assert bpr_loss(pos, neg).item() == pytest.approx(expected, rel=1e-6)
    assert bpr_loss(torch.tensor([10.0]), torch.tensor([[-10.0]])).item() < 1e-6
    # each positive meets its own row of negatives (not another row's)
    p3, n3 = [3.0, 0.0, -1.0], [[0.0, 1.0, 2.0], [5.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    want3 = sum(math.log1p(math.exp(-(p - n))) for p, row in zip(p3, n3) for n in row) / 9
    assert bpr_loss(torch.tensor(p3), torch.tensor(n3)).item() == pytest.approx(want3, rel=1e-6)
    lw = listwise_loss(torch.tensor([0.0]), torch.tensor([[0.0, 0.0]])).item()
    assert lw == pytest.approx(math.log(3), rel=1e-6)
    # a batch of two: mean of -log softmax(positive) per row
    lw2 = listwise_loss(torch.tensor([[1.0], [0.0]]), torch.tensor([[0.0, 0.0], [2.0, 0.0]])).item()
    row1 = -(1.0 - math.log(math.exp(1.0) + 2.0))
    row2 = -(0.0 - math.log(1.0 + math.exp(2.0) + 1.0))
    assert lw2 == pytest.approx((row1 + row2) / 2, rel=1e-6)


def test_group_pair_losses_cover_every_pair():
    import torch

    from funnel_core.train.l2g import group_pair_losses

    pos, neg = [2.0, 0.5], [1.0, 0.0, 3.0]
    want = [-math.log(1 / (1 + math.exp(-(p - n)))) for p in pos for n in neg]      # 6 pairs
    got = group_pair_losses(torch.tensor(pos), torch.tensor(neg), "bpr")
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    assert group_pair_losses(torch.tensor(pos), torch.tensor(neg)).tolist() == pytest.approx(want)
    z = [math.exp(p) + sum(math.exp(n) for n in neg) for p in pos]
    lw = group_pair_losses(torch.tensor(pos), torch.tensor(neg), "listwise")
    assert lw.tolist() == pytest.approx([-(p - math.log(zz)) for p, zz in zip(pos, z)], rel=1e-6)


def _pair_groups():
    return [TrainingGroup(query=f"q{g}", positives=[f"p{g}.{i}" for i in range(2)],
                          negatives=[f"n{g}.{j}" for j in range(3 + g)]) for g in range(3)]


def test_eq6_default_meets_every_positive_negative_pair_once_per_epoch():
    """Eq. 6 sums over every (positive, negative) pair; sampling 4 negatives per positive (the
    earlier default) meets only some pairs, or some twice."""
    import random

    groups = _pair_groups()
    all_pairs = sorted((g.query, p, n) for g in groups for p in g.positives for n in g.negatives)
    trainer = CrossEncoderTrainer(model="x", queries_per_step=2)
    assert trainer.num_negatives is None
    met = sorted((q, p, n) for step in trainer.steps(groups, random.Random(0))
                 for q, pos, neg in step for p in pos for n in neg)
    assert met == all_pairs                                   # every pair, exactly once
    sampled = CrossEncoderTrainer(model="x", num_negatives=2, queries_per_step=2)
    met2 = [(q, p, n) for step in sampled.steps(groups, random.Random(0))
            for q, pos, neg in step for p in pos for n in neg]
    assert len(met2) == 2 * sum(len(g.positives) for g in groups) < len(all_pairs)
    with pytest.raises(ValueError, match="num_negatives"):
        CrossEncoderTrainer(model="x", num_negatives=0)
    # sampling: exactly n negatives are each used once; fewer are drawn with replacement
    three = TrainingGroup(query="q", positives=["p"], negatives=["n1", "n2", "n3"])
    for seed in range(5):
        got = CrossEncoderTrainer(model="x", num_negatives=3)._negatives(three, random.Random(seed))
        assert sorted(got) == ["n1", "n2", "n3"]
        more = CrossEncoderTrainer(model="x", num_negatives=5)._negatives(three, random.Random(seed))
        assert len(more) == 5 and set(more) <= {"n1", "n2", "n3"}


def test_first_step_loss_is_bpr_over_all_pairs(tiny_cross_encoder_path, tmp_path):
    """The loss of the first step (before any update) equals the mean over every pair of the
    step's queries of -log sigmoid(S+ - S-), computed here from the untrained model's scores.
    Dropout is switched off in a copy of the model so the two computations see the same net."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from funnel_core.rerank.cross_encoder import encode_pairs

    model = AutoModelForSequenceClassification.from_pretrained(tiny_cross_encoder_path)
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.0
    with torch.no_grad():
        model.classifier.weight.mul_(3e4)      # spread the random scores (else all ~0)
    model.save_pretrained(tmp_path / "nodrop")
    tok = AutoTokenizer.from_pretrained(tiny_cross_encoder_path)
    tok.save_pretrained(tmp_path / "nodrop")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "nodrop").eval()
    groups = _toy_groups()
    terms = []
    for g in groups:
        texts = g.positives + g.negatives
        with torch.no_grad():
            s = model(**encode_pairs(tok, [g.query] * len(texts), texts, 32)).logits.reshape(-1)
        sp, sn = s[:len(g.positives)].tolist(), s[len(g.positives):].tolist()
        terms += [-math.log(1 / (1 + math.exp(-(p - n)))) for p in sp for n in sn]
    want = sum(terms) / len(terms)
    assert max(terms) - min(terms) > 0.1                  # the pairs differ
    report = CrossEncoderTrainer(model=tmp_path / "nodrop", max_length=32, max_steps=1,
                                 queries_per_step=len(groups), freeze_embeddings=False,
                                 show_progress=False, dtype="float32",
                                 device="cpu").train(groups, tmp_path / "out")
    assert report.losses[0] == pytest.approx(want, rel=1e-4)
    sampled = CrossEncoderTrainer(model=tmp_path / "nodrop", max_length=32, max_steps=1,
                                  num_negatives=1, queries_per_step=len(groups),
                                  freeze_embeddings=False, show_progress=False, dtype="float32",
                                  device="cpu").train(groups, tmp_path / "out2")
    assert sampled.losses[0] != pytest.approx(want, rel=1e-4)


def test_qrels_groups_use_bm25_hard_negatives(corpus_units):
    queries = {"q1": "capital of France Paris", "q2": "Shakespeare Hamlet", "q4": "Hamlet"}
    qrels = {"q1": {"d0": 1}, "q2": {"d5": 1}, "q3": {"d1": 1}, "q4": {"d5": 1}}  # q3: no text; q4: no negative
    groups = qrels_groups(queries, qrels, corpus_units, index=BM25Index().index(corpus_units), depth=3)
    assert [g.query_id for g in groups] == ["q1", "q2"]
    text = {u.id: u.text for u in corpus_units}
    g1 = groups[0]
    assert g1.positives == [text["d0"]] and text["d0"] not in g1.negatives
    assert text["d2"] in g1.negatives  # the Eiffel Tower doc shares "Paris, France": a hard negative
    assert 1 <= len(g1.negatives) <= 3


def _toy_groups():
    pos = ["Paris is the capital of France.", "The capital of France is Paris."]
    neg = ["Bananas are yellow fruit.", "The stock market fell today.", "Cats sleep a lot.",
           "Rain is expected tomorrow."]
    return [TrainingGroup(query="capital of France", positives=pos, negatives=neg),
            TrainingGroup(query="yellow fruit", positives=[neg[0]], negatives=pos + neg[1:])]


def test_trainer_bpr_loss_falls_and_saves_a_loadable_model(tiny_cross_encoder_path, tmp_path):
    groups = _toy_groups()
    trainer = CrossEncoderTrainer(model=tiny_cross_encoder_path, max_length=32, learning_rate=1e-2,
                                  epochs=16, num_negatives=2, queries_per_step=3, warmup_ratio=0.0,
                                  freeze_embeddings=False, show_progress=False, seed=1,
                                  log_path=tmp_path / "log.jsonl", log_every=2)
    report = trainer.train(groups, tmp_path / "ce")
    first, last = report.first_last_loss(3)
    assert report.steps == 16 and len(report.losses) == 16
    assert last < first * 0.7, report.losses
    assert (tmp_path / "log.jsonl").read_text().count("\n") == 8
    saved = json.loads((tmp_path / "ce" / "training.json").read_text())
    assert saved["steps"] == 16 and saved["config"]["loss"] == "bpr"
    scorer = CrossEncoderScorer(str(tmp_path / "ce"), library="transformers", max_length=32)
    s = scorer.score("capital of France", groups[0].positives + groups[0].negatives)
    assert min(s[:2]) > max(s[2:])  # the trained model ranks both positives first


def test_train_l2g_end_to_end_and_freezing(tiny_cross_encoder_path, tmp_path):
    docs = [Unit(id=f"d{i}", text=t, level="document") for i, t in enumerate(
        ["Paris is the capital of France.", "Berlin is in Germany.", "Cats sleep a lot.",
         "Rain is expected tomorrow."])]
    passages = [Unit(id=f"{d.id}#0", text=d.text, parent_id=d.id, score=float(-i))
                for i, d in enumerate(docs)]
    ex = {"query": "capital of France", "documents": docs, "passages": passages, "answers": ["Paris"]}
    report = train_l2g([ex], model=tiny_cross_encoder_path, out_dir=tmp_path / "l2g", top_k=0,
                       max_length=32, epochs=2, num_negatives=2, freeze_layers=1,
                       show_progress=False)
    assert report.steps == 2 and report.config["loss"] == "bpr"
    assert report.config["freeze_layers"] == 1
    CrossEncoderScorer(report.path, library="transformers").score("q", ["x"])
    with pytest.raises(ValueError, match="no training group"):
        CrossEncoderTrainer(model=tiny_cross_encoder_path, show_progress=False).train(
            [TrainingGroup("q", ["p"], [])], tmp_path / "none")
    with pytest.raises(ValueError, match="loss must be one of"):
        CrossEncoderTrainer(model=tiny_cross_encoder_path, loss="hinge")


def test_init_cross_encoder_from_minilm(minilm_path, tmp_path):
    path = init_cross_encoder(minilm_path, tmp_path / "init")
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    assert cfg.num_labels == 1 and cfg.num_hidden_layers == 6 and cfg.hidden_size == 384
    scores = CrossEncoderScorer(path, library="transformers", max_length=64).score(
        "capital of France", ["Paris is the capital of France.", "Cats sleep."])
    assert len(scores) == 2 and all(type(s) is float for s in scores)


def _state(path):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_freeze_layers_keeps_those_weights_and_trains_the_rest(tiny_cross_encoder_path, tmp_path):
    import torch

    before = _state(tiny_cross_encoder_path)
    trainer = CrossEncoderTrainer(model=tiny_cross_encoder_path, max_length=32, learning_rate=1e-2,
                                  epochs=2, num_negatives=2, queries_per_step=2, warmup_ratio=0.0,
                                  freeze_embeddings=True, freeze_layers=1, show_progress=False)
    report = trainer.train(_toy_groups(), tmp_path / "frozen")
    after = _state(report.path)
    assert before.keys() == after.keys()
    frozen = [k for k in before if k.startswith(("bert.embeddings.word_embeddings.",
                                                 "bert.encoder.layer.0."))]
    trained = [k for k in before if k.startswith(("bert.encoder.layer.1.", "classifier."))]
    assert len(frozen) > 5 and len(trained) > 5
    for k in frozen:
        assert torch.equal(before[k], after[k]), f"{k} is frozen but changed"
    for k in trained:
        if k.endswith("position_ids"):
            continue
        assert not torch.equal(before[k], after[k]), f"{k} was trained but did not change"


def _pairwise_agreement(student, teacher, top=2):
    """Share of the (teacher's top-``top`` document, other document) pairs that the student
    orders the same way as the teacher."""
    best = sorted(range(len(teacher)), key=lambda i: -teacher[i])[:top]
    pairs = [(i, j) for i in best for j in range(len(teacher)) if j not in best and teacher[i] > teacher[j]]
    return sum(student[i] > student[j] for i, j in pairs) / len(pairs)


TOPICS = {
    "capital city of France": ["Paris is the capital city of France.",
                               "France has its capital city in Paris on the Seine."],
    "yellow fruit banana": ["A banana is a yellow fruit.", "Ripe banana fruit turns yellow."],
    "rain weather forecast": ["The weather forecast says rain tomorrow.",
                              "Rain is in the weather forecast for the weekend."],
    "cats sleep a lot": ["Cats sleep a lot during the day.", "A cat can sleep sixteen hours."],
}


def _teacher(query, text):
    """An informative post-ranker: word overlap of the passage with the query."""
    q = set(query.lower().split())
    return float(len(q & set(text.lower().rstrip(".").split())))


def test_l2g_student_agrees_more_with_an_informative_teacher(tiny_cross_encoder_path, tmp_path):
    """Eqs. 4-6 end to end: the teacher's passage scores, aggregated to documents, pick the
    positives; after BPR training the student orders the documents more like the teacher."""
    docs = [Unit(id=f"d{i}", text=t, level="document")
            for i, t in enumerate(t for texts in TOPICS.values() for t in texts)]
    passages = LaterChunking(words=5)("q", docs)
    examples = []
    for query in TOPICS:
        scored = [p.rescored(_teacher(query, p.text), "post") for p in passages]
        examples.append({"query": query, "documents": docs, "passages": scored})
    agg = {q: aggregate_passage_scores(ex["passages"]) for q, ex in zip(TOPICS, examples)}

    def agreement(model_path):
        scorer = CrossEncoderScorer(str(model_path), library="transformers", max_length=32)
        values = []
        for query in TOPICS:
            student = scorer.score(query, [d.text for d in docs])
            values.append(_pairwise_agreement(student, [agg[query][d.id] for d in docs]))
        return sum(values) / len(values)

    before = agreement(tiny_cross_encoder_path)
    report = train_l2g(examples, model=tiny_cross_encoder_path, out_dir=tmp_path / "student",
                       top_k=2, max_length=32, epochs=30, num_negatives=3, queries_per_step=4,
                       learning_rate=5e-3, warmup_ratio=0.0, freeze_embeddings=False,
                       show_progress=False, seed=0)
    after = agreement(report.path)
    assert report.config["loss"] == "bpr"
    assert after > before + 0.2 and after > 0.75, (before, after)   # seen: 0.54 -> 0.85


def test_max_steps_gives_two_arms_the_same_budget(tiny_cross_encoder_path, tmp_path):
    """Label-only and L2G groups differ in size; ``max_steps`` stops both after the same number of
    steps (and never past the epochs asked for)."""
    small, large = _toy_groups()[:1], _toy_groups() * 3
    kw = dict(model=tiny_cross_encoder_path, max_length=32, epochs=50, num_negatives=2,
              queries_per_step=2, show_progress=False)
    a = CrossEncoderTrainer(max_steps=7, **kw).train(small, tmp_path / "a")
    b = CrossEncoderTrainer(max_steps=7, **kw).train(large, tmp_path / "b")
    assert a.steps == b.steps == 7 and len(a.losses) == len(b.losses) == 7
    assert json.loads((tmp_path / "a" / "training.json").read_text())["planned_steps"] == 7
    c = CrossEncoderTrainer(max_steps=1000, **{**kw, "epochs": 2}).train(small, tmp_path / "c")
    assert c.steps == 2          # 2 positives / 2 per step = 1 step per epoch, 2 epochs
    with pytest.raises(ValueError, match="max_steps"):
        CrossEncoderTrainer(model=tiny_cross_encoder_path, max_steps=0)
