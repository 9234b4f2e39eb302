"""Cross-encoder inference runtimes: a real ONNX export run by a real onnxruntime session (and
OpenVINO when installed) against the torch model it came from, and the export cache."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from funnel_core.rerank import runtimes
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.runtimes import choose_runtime, export_dir_for

pytest.importorskip("onnxruntime")

QUERY = "what makes clouds produce rain"
TEXTS = ["rain forms when droplets in clouds grow heavy and fall " * 20,  # longer than max_length
         "the cat sat on the mat", "clouds", "a passage about rainfall and storms in summer",
         "x", "droplets grow by collision and coalescence until they fall as rain"]


@pytest.fixture
def model(tiny_cross_encoder_path, tmp_path) -> str:
    """A private copy of the tiny random BERT cross-encoder (exports land inside it)."""
    dst = tmp_path / "ce"
    shutil.copytree(tiny_cross_encoder_path, dst, ignore=shutil.ignore_patterns("funnel_onnx"))
    return str(dst)


def _scores(model: str, backend: str, runtime: str, **kw) -> list[float]:
    if runtime == "torch":
        kw.setdefault("dtype", "float32")
    return CrossEncoderScorer(model, library=backend, runtime=runtime, max_length=48, batch_size=4,
                              **kw).score(QUERY, TEXTS)


@pytest.mark.parametrize("backend", ["transformers", "sentence-transformers"])
def test_onnx_fp32_equals_torch_fp32(model, backend):
    torch_scores = _scores(model, backend, "torch")
    onnx_scores = _scores(model, backend, "onnx")
    assert len(set(round(s, 6) for s in torch_scores)) > 1  # the texts score differently
    assert onnx_scores == pytest.approx(torch_scores, abs=1e-5)
    assert (Path(model) / "funnel_onnx" / "model.onnx").is_file()


def test_openvino_runs_the_export(model):
    pytest.importorskip("openvino")
    ref = _scores(model, "transformers", "torch")
    scorer = CrossEncoderScorer(model, library="transformers", runtime="openvino", max_length=48,
                                batch_size=4)
    assert scorer.score(QUERY, TEXTS) == pytest.approx(ref, abs=1e-3)  # bf16 inference where native
    assert scorer.active_runtime == "openvino"


def test_openvino_compiles_once_and_the_next_session_loads_the_cached_model(model):
    """OpenVINO's CACHE_DIR inside the export: the first session writes the compiled blob, a new
    session (as in the next process) reads it instead of compiling, and scores the same."""
    pytest.importorskip("openvino")
    first = CrossEncoderScorer(model, library="transformers", runtime="openvino", max_length=48).score(QUERY, TEXTS)
    cache = Path(model) / "funnel_onnx" / runtimes.OPENVINO_CACHE
    blobs = sorted(p for p in cache.rglob("*") if p.is_file())
    assert blobs and all(p.stat().st_size > 0 for p in blobs)
    stamps = [p.stat().st_mtime_ns for p in blobs]
    again = CrossEncoderScorer(model, library="transformers", runtime="openvino", max_length=48).score(QUERY, TEXTS)
    assert again == pytest.approx(first, abs=1e-6)
    assert sorted(p for p in cache.rglob("*") if p.is_file()) == blobs  # read, not written again
    assert [p.stat().st_mtime_ns for p in blobs] == stamps


PAIRS = [(QUERY, t) for t in TEXTS] + [
    ("", "an empty query"), ("a query", ""), ("Übergrößenträger naïve café 東京 😀", "ünïcödé text, ok?"),
    ("is [SEP] a special token here", "[CLS] [PAD] [MASK] written in the text [UNK]"),
    ("tabs\tand\nnewlines  and   spaces", "   leading and trailing   "),
    ("a query of a length near the limit " * 3, "and a passage well over it " * 30),
    ("a query longer than the whole budget " * 20, "short passage")]


@pytest.mark.parametrize("strategy,library", [("only_second", "transformers"),
                                              ("longest_first", "sentence-transformers")])
def test_pair_tokenizer_equals_transformers(model, strategy, library):
    """The export's tokenizer (``tokenizers`` alone) returns transformers' inputs exactly: the
    ids, the attention mask and the segment ids, truncated and padded the same way."""
    from transformers import AutoTokenizer

    _scores(model, library, "onnx")  # writes the export
    folder = Path(model) / "funnel_onnx"
    ref_tok = AutoTokenizer.from_pretrained(model)
    for max_length in (48, 16):
        pairs = runtimes.PairTokenizer(folder, max_length, strategy)
        kept = PAIRS
        if strategy == "only_second":  # longer queries are clipped by transformers first
            limit = (max_length - 3) // 2
            kept = [(q, t) for q, t in PAIRS if len(ref_tok(q, add_special_tokens=False)["input_ids"]) <= limit]
            assert 0 < len(kept) < len(PAIRS)
        queries, texts = [q for q, _ in kept], [t for _, t in kept]
        got = pairs(queries, texts)
        ref = ref_tok(queries, texts, truncation=strategy, max_length=max_length, padding=True,
                      return_tensors="np")
        assert got["input_ids"].shape[1] <= max_length
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            assert got[name].tolist() == ref[name].tolist(), name
        for q in queries:
            assert pairs.token_count(q) == len(ref_tok(q, add_special_tokens=False)["input_ids"])


def test_a_cached_export_scores_without_importing_transformers_or_torch(model):
    """The point of keeping the tokenizer in the export: a new process scores from it without
    importing transformers (which imports torch); a query long enough to be clipped still
    goes through transformers and scores as the torch model does."""
    import subprocess
    import sys

    ref = _scores(model, "transformers", "onnx")  # exports
    code = (f"import sys, json\nfrom funnel_core.rerank.cross_encoder import CrossEncoderScorer\n"
            f"s = CrossEncoderScorer({model!r}, library='transformers', runtime='onnx', device='cpu', max_length=48, "
            f"batch_size=4).score({QUERY!r}, {TEXTS!r})\n"
            f"print(json.dumps([s, sorted(m for m in ('torch', 'transformers') if m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    scores, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert imported == []
    assert scores == pytest.approx(ref, abs=1e-6)
    long_query = "what makes clouds produce rain " * 12  # over (48 - 3) // 2 tokens: clipped
    clipped = CrossEncoderScorer(model, library="transformers", runtime="onnx", max_length=48).score(long_query, TEXTS)
    torch_clipped = CrossEncoderScorer(model, library="transformers", runtime="torch", dtype="float32",
                                       max_length=48).score(long_query, TEXTS)
    assert clipped == pytest.approx(torch_clipped, abs=1e-5)


def test_no_gpu_device_files_settle_on_the_cpu_without_importing_torch(monkeypatch):
    import subprocess
    import sys

    from funnel_core import hardware

    on_linux = sys.platform.startswith("linux")  # read before sys.platform is patched below
    monkeypatch.setattr(hardware.sys, "platform", "linux")
    monkeypatch.setattr(hardware, "GPU_DEVICE_FILES", ("/nonexistent/nvidiactl",))
    assert hardware.gpu_possible() is False
    monkeypatch.setattr(hardware, "GPU_DEVICE_FILES", (__file__,))  # a file that exists
    assert hardware.gpu_possible() is True
    monkeypatch.setattr(hardware.sys, "platform", "darwin")  # MPS: only torch can tell
    assert hardware.gpu_possible() is True
    if not on_linux:
        return
    code = ("import sys\nimport funnel_core.hardware as h\nh.GPU_DEVICE_FILES = ()\n"
            "from funnel_core.models import resolve_device\n"
            "print(resolve_device(None), resolve_device('auto'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cpu", "cpu", "False"]


def test_export_is_reused_not_redone(model, monkeypatch):
    _scores(model, "transformers", "onnx")
    onnx_file = Path(model) / "funnel_onnx" / "model.onnx"
    stamp = onnx_file.stat().st_mtime_ns

    def no_export(*a, **k):
        raise AssertionError("exported again although a current export exists")

    monkeypatch.setattr(runtimes, "_export_fp32", no_export)
    _scores(model, "transformers", "onnx")
    _scores(model, "sentence-transformers", "onnx")
    assert onnx_file.stat().st_mtime_ns == stamp


def test_changed_weights_make_a_new_export(model):
    """Keyed by content: a touched file keeps the export, changed bytes rebuild it."""
    _scores(model, "transformers", "onnx")
    manifest = Path(model) / "funnel_onnx" / "funnel_export.json"
    before = json.loads(manifest.read_text())["source"]
    weights = next(p for p in Path(model).iterdir() if p.suffix in (".safetensors", ".bin"))
    later = time.time() + 5
    os.utime(weights, (later, later))
    _scores(model, "transformers", "onnx")
    assert json.loads(manifest.read_text())["source"] == before
    config = Path(model) / "config.json"
    config.write_text(config.read_text() + "\n")  # same model, other bytes
    _scores(model, "transformers", "onnx")
    assert json.loads(manifest.read_text())["source"] != before


def test_foreign_folder_is_never_touched(model, tmp_path, monkeypatch):
    foreign = Path(model) / "funnel_onnx"
    foreign.mkdir()
    (foreign / "model.onnx").write_bytes(b"not ours")
    monkeypatch.setenv("FUNNEL_RAG_CACHE", str(tmp_path / "cache"))
    target = export_dir_for(model)
    assert str(target).startswith(str(tmp_path / "cache"))
    assert _scores(model, "transformers", "onnx") == pytest.approx(
        _scores(model, "transformers", "torch"), abs=1e-5)
    assert (foreign / "model.onnx").read_bytes() == b"not ours"
    assert sorted(p.name for p in foreign.iterdir()) == ["model.onnx"]
    assert (target / "model.onnx").is_file()


def test_explicit_export_dir_holding_foreign_files_is_refused(model, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not written by funnel-rag"):
        CrossEncoderScorer(model, library="transformers", runtime="onnx",
                           export_dir=other).score(QUERY, TEXTS[:2])
    assert (other / "notes.txt").read_text() == "mine"


def test_choose_runtime_every_branch():
    yes, no = (lambda r: True), (lambda r: False)
    onnx_only = lambda r: r != "openvino"  # noqa: E731
    for bf16 in (True, False):
        assert choose_runtime("auto", "cpu", "transformers", available=yes, native_bf16=bf16) == "openvino"
        assert choose_runtime("auto", "cpu", "transformers", available=no, native_bf16=bf16) == "torch"
        # an explicit float32 request: exact fp32 scores (OpenVINO may pick bf16 itself)
        assert choose_runtime("auto", "cpu", "transformers", available=yes, native_bf16=bf16,
                              fp32=True) == "onnx"
    # without OpenVINO: torch (bf16 autocast) where bf16 is native, else ONNX fp32; never int8
    assert choose_runtime("auto", "cpu", "transformers", available=onnx_only, native_bf16=True) == "torch"
    assert choose_runtime("auto", "cpu", "transformers", available=onnx_only, native_bf16=False) == "onnx"
    assert choose_runtime("auto", "cpu", "transformers", available=onnx_only, native_bf16=True,
                          fp32=True) == "onnx"
    assert choose_runtime("auto", "cuda", "transformers", available=yes) == "torch"
    assert choose_runtime("auto", "cuda:1", "sentence-transformers", available=yes) == "torch"
    assert choose_runtime("auto", "mps", "transformers", available=yes) == "torch"
    assert choose_runtime("auto", "cpu", "flagembedding", available=yes) == "torch"
    assert choose_runtime("onnx", "cpu", "transformers", available=no) == "onnx"
    with pytest.raises(ValueError, match="runtime"):
        choose_runtime("tensorrt", "cpu", "transformers")


def test_runtime_settings_are_validated_and_serialised(model):
    with pytest.raises(ValueError, match="flagembedding"):
        CrossEncoderScorer(model, library="flagembedding", runtime="onnx")
    with pytest.raises(ValueError, match="runtime"):
        CrossEncoderScorer(model, runtime="onnx-fp8")
    with pytest.raises(ValueError, match="runtime='torch'"):
        CrossEncoderScorer(model, library="transformers", runtime="onnx", dtype="bfloat16")
    with pytest.raises(ValueError, match="onnx-int8"):  # removed: it lost nDCG
        CrossEncoderScorer(model, runtime="onnx-int8")
    scorer = CrossEncoderScorer(model, library="transformers", runtime="openvino")
    again = CrossEncoderScorer.from_dict(scorer.to_dict())
    assert again.runtime == "openvino"


def test_explicit_bf16_keeps_torch_under_auto(model):
    scorer = CrossEncoderScorer(model, library="transformers", dtype="bfloat16", max_length=48)
    scorer.score(QUERY, TEXTS[:2])
    assert scorer.active_runtime == "torch"


def test_torch_dtype_auto_follows_the_hardware(model):
    from funnel_core.hardware import cpu_flags, decide_dtype

    scorer = CrossEncoderScorer(model, library="transformers", runtime="torch", device="cpu")
    scorer.score(QUERY, TEXTS[:2])
    assert scorer.active_dtype == decide_dtype("auto", "cpu", cpu_flags()).dtype
    fp32 = CrossEncoderScorer(model, library="transformers", runtime="torch", dtype="fp32")
    fp32.score(QUERY, TEXTS[:2])
    assert fp32.active_dtype == "float32"
    # a cheap edit keeps the loaded model, which still reports what it runs in
    model_before = scorer._model
    scorer.top_n = 1
    assert scorer._model is model_before
    assert (scorer.active_dtype, scorer.active_runtime) == (
        decide_dtype("auto", "cpu", cpu_flags()).dtype, "torch")
    scorer.dtype = "float32"  # a load-time setting: the model loads again, in float32
    assert scorer._model is not model_before and not scorer._model.loaded
    scorer.score(QUERY, TEXTS[:2])
    assert scorer.active_dtype == "float32"
    with pytest.raises(ValueError, match="dtype"):
        CrossEncoderScorer(model, runtime="onnx", dtype="bf16")
