"""`funnel train CONFIG.toml`: the configuration's refusals, the mining rule, the model folder
(card, SHA-256 manifest, float16 weights), resuming, and every kind end to end on tiny models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from funnel_core.cli import main as funnel_main
from funnel_core.errors import ModelLoadError  # noqa: F401  (load errors keep their type)
from funnel_core.evaluation.datasets import load_dataset
from funnel_core.train.card import MANIFEST, ModelIntegrityError, read_card, verify_model, write_manifest
from funnel_core.train.mining import mine, split_questions
from funnel_core.train.runner import load_train_config, run_train

# -- a small answer-labelled dataset (JSONL questions + a JSONL corpus) ----------------------------
DOCS = [
    ("p1", "Paris", "Paris is the capital and largest city of France, on the Seine."),
    ("p2", "Berlin", "Berlin is the capital of Germany and its largest city."),
    ("p3", "Rome", "Rome is the capital city of Italy, founded on seven hills."),
    ("p4", "Madrid", "Madrid is the capital of Spain, in the centre of the country."),
    ("p5", "Seine", "The Seine is a river in northern France that flows through Paris."),
    ("p6", "Rhine", "The Rhine is a river that flows through Germany and the Netherlands."),
    ("p7", "Tiber", "The Tiber is the river that flows through the city of Rome."),
    ("p8", "Tagus", "The Tagus is the longest river of the Iberian peninsula, through Spain."),
    ("p9", "Hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600."),
    ("p10", "Faust", "Faust is a tragic play written by Johann Wolfgang von Goethe."),
]
QUESTIONS = [
    ("q1", "what is the capital of France", ["Paris"]),
    ("q2", "what is the capital of Germany", ["Berlin"]),
    ("q3", "what is the capital of Italy", ["Rome"]),
    ("q4", "what is the capital of Spain", ["Madrid"]),
    ("q5", "which river flows through Paris", ["Seine"]),
    ("q6", "which river flows through Germany and the Netherlands", ["Rhine"]),
    ("q7", "which river flows through Rome", ["Tiber"]),
    ("q8", "who wrote the tragedy Hamlet", ["William Shakespeare", "Shakespeare"]),
    ("q9", "who wrote the play Faust", ["Goethe"]),
    ("q10", "what is the longest river of the Iberian peninsula", ["Tagus"]),
]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def data(tmp_path) -> Path:
    _write_jsonl(tmp_path / "docs.jsonl", [{"id": i, "title": t, "text": x} for i, t, x in DOCS])
    _write_jsonl(tmp_path / "train.jsonl", [{"id": i, "question": q, "answers": a} for i, q, a in QUESTIONS])
    _write_jsonl(tmp_path / "dev.jsonl", [{"id": "d1", "question": "which city is the capital of Italy",
                                           "answers": ["Rome"]}])
    (tmp_path / "eval.toml").write_text(
        '[dataset]\npath = "dev.jsonl"\ncorpus = "docs.jsonl"\n[systems.bm25]\ncomponent = "bm25"\n',
        encoding="utf-8")
    return tmp_path


def _config(folder: Path, kind: str, model: str = "", extra: str = "", *, split: str = "train",
            questions: str = "train.jsonl", held_out: int = 2, base: str | None = None) -> Path:
    base_line = f'base_model = "{base}"\n' if base else ""
    text = (f'[dataset]\npath = "{questions}"\ncorpus = "docs.jsonl"\nsplit = "{split}"\n'
            f'[train]\nkind = "{kind}"\n{base_line}output = "out/{kind}"\nheld_out = {held_out}\n'
            f'reported_by = ["eval.toml"]\ncheckpoint_minutes = 0\n'
            f'[mining]\nfirst_stage = {{ component = "bm25", k = 6 }}\ndepth = 6\n'
            f"{extra}[model]\n{model}")
    path = folder / f"{kind}.toml"
    path.write_text(text, encoding="utf-8")
    return path


# -- refusals (fast) -------------------------------------------------------------------------------
@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace('split = "train"\n', ""), r"\[dataset\] needs `split`"),
    (lambda t: t.replace('kind = "cross-encoder"', 'kind = "colbert"'), r"kind = 'colbert'.*one of"),
    (lambda t: t.replace("held_out = 2", "held_out = 2\nepochs = 3"), r"\[train\]: unknown key\(s\) \['epochs'\]"),
    (lambda t: t.replace("held_out = 2", 'held_out = "two"'), r"held_out = 'two': expected int"),
    (lambda t: t.replace("held_out = 2", "held_out = true"), r"held_out = True: expected int"),
    (lambda t: t + "\n[evaluate]\nmetrics = []\n", r"unknown table\(s\) \['evaluate'\]"),
    (lambda t: t + "\n[labels]\nn_gra = 3\n", r"kind 'cross-encoder' takes no \[labels\] table"),
])
def test_configuration_mistakes_are_refused_naming_the_key(data, edit, message):
    path = _config(data, "cross-encoder")
    path.write_text(edit(path.read_text()), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_train_config(path)


def test_an_unknown_model_setting_is_refused_before_any_training(data):
    path = _config(data, "cross-encoder", "lerning_rate = 1e-4\n")
    with pytest.raises(ValueError, match=r"\[model\]: unknown key\(s\) \['lerning_rate'\].*learning_rate"):
        run_train(path, progress=False)
    assert not (data / "out" / "cross-encoder").exists()


def test_a_model_setting_that_train_owns_is_refused(data):
    path = _config(data, "cross-encoder", "seed = 3\n")
    with pytest.raises(ValueError, match=r"\[model\]: \['seed'\] are set by \[train\]"):
        run_train(path, progress=False)


def test_training_on_the_split_an_evaluation_reports_is_refused(data):
    path = _config(data, "cross-encoder", questions="dev.jsonl", split="test")
    with pytest.raises(ValueError, match="is the split .*eval.toml.* reports; train on another split"):
        run_train(path, progress=False)


def test_training_questions_that_an_evaluation_reports_are_refused_even_from_another_file(data):
    rows = [{"id": i, "question": q, "answers": a} for i, q, a in QUESTIONS]
    rows.append({"id": "leak", "question": "Which city is the capital of  Italy", "answers": ["Rome"]})
    _write_jsonl(data / "train.jsonl", rows)
    with pytest.raises(ValueError, match=r"1 training question\(s\) are among the questions .*eval.toml"):
        run_train(_config(data, "cross-encoder"), progress=False)


def test_an_output_folder_we_did_not_write_is_never_replaced(data):
    mine_ = data / "out" / "cross-encoder"
    mine_.mkdir(parents=True)
    (mine_ / "notes.txt").write_text("the user's", encoding="utf-8")
    with pytest.raises(ValueError, match="was not written by `funnel train`"):
        run_train(_config(data, "cross-encoder"), progress=False)
    assert (mine_ / "notes.txt").read_text() == "the user's"


def test_the_cli_reports_a_bad_config_as_an_error_line(data, capsys):
    path = _config(data, "cross-encoder")
    path.write_text(path.read_text().replace('split = "train"\n', ""), encoding="utf-8")
    assert funnel_main(["train", str(path)]) == 1
    assert "funnel train: error:" in capsys.readouterr().err


# -- mining (fast) ---------------------------------------------------------------------------------
def test_mining_takes_answer_holders_as_positives_and_the_rest_as_hard_negatives(data):
    ds = load_dataset(data / "train.jsonl", corpus=data / "docs.jsonl")
    (m,) = mine(ds, ["q5"], {"component": "bm25", "k": 6}, depth=6)
    texts = [u.text for u in m.candidates]
    assert [u.text for u in m.positives] == [t for t in texts if "Seine" in t]   # in rank order
    assert [u.text for u in m.negatives] == [t for t in texts if "Seine" not in t]
    assert {u.id for u in m.positives} == {"p5", "p1"} and m.negatives   # p1 mentions the Seine too


def test_mining_with_qrels_takes_judged_documents_even_when_not_retrieved(tmp_path):
    _write_jsonl(tmp_path / "docs.jsonl", [{"id": i, "title": t, "text": x} for i, t, x in DOCS])
    _write_jsonl(tmp_path / "q.jsonl", [{"id": "q", "question": "capital of France", "relevant": ["p9"]}])
    ds = load_dataset(tmp_path / "q.jsonl", corpus=tmp_path / "docs.jsonl")
    (m,) = mine(ds, ["q"], {"component": "bm25", "k": 3}, depth=3)
    assert [u.id for u in m.positives] == ["p9"]                      # judged, not in the top 3
    assert "p9" not in [u.id for u in m.negatives] and len(m.negatives) == 3


def test_held_out_questions_are_a_seeded_sample_disjoint_from_training(data):
    ds = load_dataset(data / "train.jsonl", corpus=data / "docs.jsonl")
    train, held = split_questions(ds, 3, seed=1)
    assert len(held) == 3 and not set(train) & set(held) and len(train) + 3 == len(ds.question_ids)
    assert split_questions(ds, 3, seed=1) == (train, held)
    with pytest.raises(ValueError, match="held_out must be in"):
        split_questions(ds, 10)


# -- the manifest (fast) ---------------------------------------------------------------------------
def test_the_manifest_catches_a_changed_missing_or_substituted_file(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    assert verify_model(folder) is False                       # no manifest: nothing to check
    write_manifest(folder)
    assert verify_model(folder) is True
    lines = (folder / MANIFEST).read_text().splitlines()
    assert sorted(line.split("  ")[1] for line in lines) == ["config.json", "model.safetensors"]
    (folder / "model.safetensors").write_bytes(b"\x00" * 63 + b"\x01")     # same size, one byte
    with pytest.raises(ModelIntegrityError, match="'model.safetensors' does not match its SHA-256"):
        verify_model(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelIntegrityError, match="'model.safetensors' is listed .* but missing"):
        verify_model(folder)
    (folder / MANIFEST).write_text("0" * 64 + "  ../outside\n")
    with pytest.raises(ModelIntegrityError, match="inside the folder"):
        verify_model(folder)


# -- every kind end to end (tiny models) ------------------------------------------------------------
def _check_folder(out: Path, kind: str) -> dict:
    card = read_card(out)
    assert card["kind"] == kind and card["dataset"]["split"] == "train"
    assert card["dataset"]["trained_on"] == 8 and card["dataset"]["held_out"] == 2
    assert card["command"].startswith("funnel train") and card["package_version"]
    assert verify_model(out) is True
    assert not out.with_name(out.name + ".partial").exists()
    return card


@pytest.mark.models
def test_cross_encoder_kind_trains_saves_float16_and_scores_after_a_verified_load(data, tiny_cross_encoder_path):
    from safetensors import safe_open

    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    path = _config(data, "cross-encoder", 'loss = "listwise"\nnum_negatives = 2\nepochs = 2\n'
                   "learning_rate = 1e-3\n", base=tiny_cross_encoder_path)
    assert funnel_main(["train", str(path), "--no-progress"]) == 0
    out = data / "out" / "cross-encoder"
    card = _check_folder(out, "cross-encoder")
    assert card["steps"] == len(card["loss_curve"]) > 0 and all(math.isfinite(x) for x in card["loss_curve"])
    assert set(card["held_out_metrics"]) >= {"AR@1", "AR@4", "questions"}
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.float16"}
    scores = CrossEncoderScorer(str(out), runtime="torch").score("capital of France", ["Paris is", "Rome is"])
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores)
    # a weight file changed after training is refused on load, not scored with
    raw = bytearray((out / "model.safetensors").read_bytes())
    raw[-1] ^= 1
    (out / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ModelIntegrityError):
        CrossEncoderScorer(str(out), runtime="torch").score("q", ["x"])


@pytest.mark.models
def test_retraining_replaces_our_own_model_whole(data, tiny_cross_encoder_path):
    path = _config(data, "cross-encoder", "num_negatives = 1\nmax_steps = 1\n", base=tiny_cross_encoder_path)
    first = run_train(path, progress=False).card["created"]
    second = run_train(path, progress=False)
    assert second.card["steps"] == 1 and verify_model(second.path)
    assert second.card["created"] >= first
    assert sorted(p.name for p in (data / "out").iterdir()) == ["cross-encoder"]


@pytest.mark.models
def test_fid_reader_kind_with_a_frozen_encoder_trains_the_decoder_only(data, tiny_t5_path):
    from safetensors import safe_open

    from funnel_core.rerank.fid import FiDAttentionScorer

    path = _config(data, "fid-reader", "n_passages = 3\nepochs = 2\nbatch_size = 2\nlearning_rate = 1e-3\n"
                   "freeze_encoder = true\n", base=tiny_t5_path)
    card = run_train(path, progress=False).card
    out = data / "out" / "fid-reader"
    _check_folder(out, "fid-reader")
    assert card["examples"] > 0 and card["steps"] == len(card["loss_curve"]) > 0
    assert card["encode_seconds"] > 0
    start, trained = {}, {}
    for folder, into in ((tiny_t5_path, start), (out, trained)):
        with safe_open(str(Path(folder) / "model.safetensors"), "pt") as f:
            into.update({k: f.get_tensor(k).float() for k in f.keys()})
    enc = [k for k in trained if k.startswith("encoder.block")]
    dec = [k for k in trained if k.startswith("decoder.block")]
    # the encoder is the starting encoder (up to float16 rounding); the decoder moved
    assert all((trained[k] - start[k]).abs().max() < 5e-4 for k in enc)
    assert any((trained[k] - start[k]).abs().max() > 2e-3 for k in dec)
    scores = FiDAttentionScorer(model=str(out)).score("capital of France", ["Paris is the capital", "Rome"])
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores)


@pytest.mark.models
def test_l2g_kind_distils_from_a_fid_teacher(data, tiny_t5_path, tiny_cross_encoder_path):
    path = _config(data, "l2g", "num_negatives = 2\nepochs = 1\n", base=tiny_cross_encoder_path,
                   extra=f'[teacher]\nmodel = "{tiny_t5_path}"\nkind = "fid"\npassage_words = 6\n')
    card = run_train(path, progress=False).card
    _check_folder(data / "out" / "l2g", "l2g")
    assert card["objective"].startswith("L2G") and card["groups"] > 0
    assert card["trainer"]["loss"] == "bpr"          # eq. 6 unless [model] says otherwise


@pytest.mark.models
def test_l2g_kind_with_top_k_0_is_the_label_only_ablation(data, tiny_cross_encoder_path):
    """`[teacher] top_k = 0` without a model trains on the answer labels alone (no teacher is loaded:
    the config names none); naming a teacher with top_k = 0 is refused (it would be ignored)."""
    path = _config(data, "l2g", "num_negatives = 2\nepochs = 1\n", base=tiny_cross_encoder_path,
                   extra="[teacher]\ntop_k = 0\n")
    card = run_train(path, progress=False).card
    _check_folder(data / "out" / "l2g", "l2g")
    assert card["objective"].startswith("label-only") and card["groups"] > 0
    assert card["teacher_seconds"] >= 0 and card["trainer"]["loss"] == "bpr"
    path.write_text(path.read_text().replace("top_k = 0\n", f'top_k = 0\nmodel = "{tiny_cross_encoder_path}"\n'),
                    encoding="utf-8")
    with pytest.raises(ValueError, match=r"top_k = 0 trains on the answer labels alone.*remove model"):
        run_train(path, progress=False)


@pytest.mark.models
def test_query_classifier_kind_cross_validates_then_fits_every_query(tmp_path):
    """kind "query-classifier": the card's cross-validation is QueryClassifier.cross_validate on the
    file's queries (stratified folds; leave-one-task-out, every line naming its task), the folder is
    the classifier fit on all of them (QueryClassifier.load gives its weights), and a held-out split
    or an unknown [model] key is refused."""
    from funnel_core.best_practices.classify import QueryClassifier

    rows = [{"query": f"who founded the city of {c}", "label": "retrieval", "task": "abc"[i % 3]} for i, c in
            enumerate(("Rome", "Lyon", "Porto", "Kyoto", "Quito", "Oslo"))] + \
           [{"query": f"rewrite this sentence in a {t} tone", "label": "sufficient", "task": "abc"[i % 3]} for i, t in
            enumerate(("formal", "casual", "polite", "playful", "neutral", "warm"))] + \
           [{"query": "rewrite the founding story of Rome from the sources", "label": "retrieval", "task": "c"},
            {"query": "who founded a city in this sentence I wrote", "label": "sufficient", "task": "a"}]
    _write_jsonl(tmp_path / "q.jsonl", rows)
    cfg = tmp_path / "qc.toml"
    cfg.write_text('[dataset]\npath = "q.jsonl"\nsplit = "train"\n[train]\nkind = "query-classifier"\n'
                   'output = "out/qc"\n[model]\nfolds = 3\nC = 2.0\n', encoding="utf-8")
    card = run_train(cfg, progress=False).card
    queries, labels = [r["query"] for r in rows], [r["label"] for r in rows]
    expected = QueryClassifier(C=2.0).cross_validate(queries, labels, folds=3, seed=0, groups=[r["task"] for r in rows])
    assert card["cross_validation"] == expected and expected["cv_accuracy_mean"] < 1  # not trivially separable
    assert card["dataset"]["labels"] == {"retrieval": 7, "sufficient": 7} and card["dataset"]["task_types"] == 3
    verify_model(tmp_path / "out" / "qc")
    fitted = QueryClassifier(C=2.0).fit(queries, labels)
    loaded = QueryClassifier.load(tmp_path / "out" / "qc")
    assert loaded.C == 2.0 and loaded.coef_ == pytest.approx(fitted.coef_)
    assert loaded.predict(["who founded the city of Lima"]) == ["retrieval"]
    text = cfg.read_text()
    for edited, message in ((text.replace("[train]\n", "[train]\nheld_out = 2\n"), "measured by cross-validation"),
                            (text.replace("C = 2.0", "Cee = 2.0"), r"unknown key\(s\) \['Cee'\]")):
        cfg.write_text(edited, encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            run_train(cfg, progress=False)


@pytest.mark.models
def test_mog_router_kind_fits_the_router_on_soft_labels(data, tiny_cross_encoder_path):
    from funnel_core.granularity.router import GranularityRouter

    path = _config(data, "mog-router", "epochs = 3\nhidden = 16\n", base=tiny_cross_encoder_path,
                   extra='[labels]\nn_gra = 3\nchunk_size = 4\n')
    path.write_text(path.read_text().replace("[mining]\nfirst_stage = { component = \"bm25\", k = 6 }\ndepth = 6\n",
                                             ""), encoding="utf-8")
    card = run_train(path, progress=False).card
    assert card["kind"] == "mog-router" and card["labelled_questions"] > 0
    assert len(card["best_level_counts"]) == 3
    router = GranularityRouter.load(data / "out" / "mog-router")
    assert router.n_levels == 3 and len(router.predict(["capital of France"])[0]) == 3


@pytest.mark.models
@pytest.mark.parametrize("tuning", ["lora = false", "merge = false"])
def test_rankrag_kind_tunes_a_causal_lm(data, tiny_llama_path, tuning):
    path = _config(data, "rankrag", f"batch_size = 2\n{tuning}\nmax_length = 128\n", base=tiny_llama_path,
                   held_out=2)
    card = run_train(path, progress=False).card
    assert card["kind"] == "rankrag" and card["steps"] > 0 and card["examples"] > 0
    assert all(math.isfinite(x) for x in card["loss_curve"])
    assert card["held_out_metrics"]  # scored by the saved folder, loaded back
    assert card["dtype"] in ("float32", "bfloat16")
    assert verify_model(data / "out" / "rankrag")
    kept_alone = (data / "out" / "rankrag" / "adapter_config.json").is_file()
    assert kept_alone == (tuning == "merge = false")
    if kept_alone:  # the adapters are checked against the manifest like any kept weights
        from funnel_core.errors import ModelIntegrityError
        from funnel_core.llm import TransformersLLM

        weights = data / "out" / "rankrag" / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
        with pytest.raises(ModelIntegrityError, match="adapter_model.safetensors"):
            TransformersLLM(str(data / "out" / "rankrag"), device="cpu")._model.get()


@pytest.mark.models
def test_a_killed_run_resumes_from_its_checkpoint_and_skips_the_steps_taken(data, tiny_cross_encoder_path):
    from funnel_core.train.checkpoint import Checkpointer

    path = _config(data, "cross-encoder", "num_negatives = 1\nqueries_per_step = 1\nepochs = 1\n",
                   base=tiny_cross_encoder_path)
    full = run_train(path, progress=False).card
    total = full["steps"]
    assert total >= 4

    saves = {"n": 0}
    real_save = Checkpointer.save

    def save_then_die(self, *args, **kwargs):
        done = real_save(self, *args, **kwargs)
        saves["n"] += 1
        if saves["n"] == 3:
            raise KeyboardInterrupt  # killed right after the third step's checkpoint
        return done

    import shutil

    shutil.rmtree(data / "out" / "cross-encoder")
    Checkpointer.save = save_then_die
    try:
        with pytest.raises(KeyboardInterrupt):
            run_train(path, progress=False)
    finally:
        Checkpointer.save = real_save
    assert (data / "out" / "cross-encoder.partial" / "checkpoint.pt").is_file()
    resumed = run_train(path, progress=False).card
    assert resumed["steps"] == total
    assert len(resumed["loss_curve"]) == total
    assert resumed["loss_curve"][:3] == pytest.approx(full["loss_curve"][:3], rel=0.2)
