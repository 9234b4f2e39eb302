"""The ONNX export cache is keyed by content: a swapped ``model.onnx``, an
edited tokenizer (the export's copy or the model's own, same size and mtime), weights replaced by
others of the same size under the same mtime, and other load arguments (``subfolder``) each
rebuild the export, so ONNX scores always equal torch scores of the model as it is now."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from funnel_core.rerank import runtimes
from funnel_core.rerank.cross_encoder import CrossEncoderScorer

pytest.importorskip("onnxruntime")

QUERY = "what makes clouds produce rain"
TEXTS = ["rain forms when droplets in clouds grow heavy and fall", "the cat sat on the mat",
         "clouds", "a passage about rainfall and storms in summer", "x",
         "droplets grow by collision and coalescence until they fall as rain"]


@pytest.fixture
def model(tiny_cross_encoder_path, tmp_path) -> str:
    dst = tmp_path / "ce"
    shutil.copytree(tiny_cross_encoder_path, dst, ignore=shutil.ignore_patterns("funnel_onnx"))
    return str(dst)


def _scores(model: str, runtime: str, **kw) -> list[float]:
    if runtime == "torch":
        kw.setdefault("dtype", "float32")
    return CrossEncoderScorer(model, library="transformers", runtime=runtime, max_length=48,
                              batch_size=4, **kw).score(QUERY, TEXTS)


def _keep_stat(path: Path, edit) -> None:
    """Edit ``path`` in place, then give it back its size-preserving mtime (as ``cp -p`` does)."""
    st = path.stat()
    edit(path)
    assert path.stat().st_size == st.st_size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _perturb_weights(folder: Path) -> None:
    """Other weights of the same shapes: same file size; the mtime is restored."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"

    def edit(p: Path) -> None:
        tensors = load_file(str(p))
        for key in tensors:
            if key.startswith("classifier") or "dense.weight" in key:
                tensors[key] = tensors[key] + 0.25
        save_file(tensors, str(p), metadata={"format": "pt"})

    _keep_stat(weights, edit)


def _swap_vocab(path: Path) -> None:
    """Swap the ids of "rain" and "cat" in a tokenizer.json (4 digits each: same size)."""
    def edit(p: Path) -> None:
        text = p.read_text(encoding="utf-8")
        a, b = '"rain": 4542', '"cat": 4937'
        if a not in text:  # the compact JSON the export keeps
            a, b = a.replace(" ", ""), b.replace(" ", "")
        assert a in text and b in text
        text = text.replace(a, "\0A").replace(b, "\0B")
        text = text.replace("\0A", a.replace("4542", "4937")).replace("\0B", b.replace("4937", "4542"))
        p.write_text(text, encoding="utf-8")

    _keep_stat(path, edit)


def test_same_size_same_mtime_weights_are_rebuilt(model):
    before = _scores(model, "onnx")
    assert before == pytest.approx(_scores(model, "torch"), abs=1e-5)
    _perturb_weights(Path(model))
    now = _scores(model, "torch")
    assert now != pytest.approx(before, abs=1e-4)  # the new weights score differently
    assert _scores(model, "onnx") == pytest.approx(now, abs=1e-5)


def test_swapped_model_onnx_is_rebuilt(model, tmp_path):
    _scores(model, "onnx")
    other = tmp_path / "other"
    shutil.copytree(model, other, ignore=shutil.ignore_patterns("funnel_onnx"))
    _perturb_weights(other)
    _scores(str(other), "onnx")  # another model's export
    shutil.copy2(other / "funnel_onnx" / "model.onnx", Path(model) / "funnel_onnx" / "model.onnx")
    assert _scores(model, "onnx") == pytest.approx(_scores(model, "torch"), abs=1e-5)


def test_edited_export_tokenizer_is_rebuilt(model):
    ref = _scores(model, "onnx")
    _swap_vocab(Path(model) / "funnel_onnx" / runtimes.TOKENIZER_FILE)
    assert _scores(model, "onnx") == pytest.approx(ref, abs=1e-5)


def test_edited_model_tokenizer_same_size_same_mtime_is_rebuilt(model):
    _scores(model, "onnx")
    _swap_vocab(Path(model) / "tokenizer.json")
    now = _scores(model, "torch")  # transformers reads the edited tokenizer
    assert _scores(model, "onnx") == pytest.approx(now, abs=1e-5)


def test_load_arguments_are_in_the_key(model, monkeypatch):
    root = Path(model)
    (root / "sub").mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy2(root / f, root / "sub" / f)
    _perturb_weights(root / "sub")
    calls = []
    real = runtimes._export_fp32

    def counting(name, out, kwargs):
        calls.append(dict(kwargs))
        return real(name, out, kwargs)

    monkeypatch.setattr(runtimes, "_export_fp32", counting)
    runtimes.export_onnx(model)
    runtimes.export_onnx(model, model_kwargs={"subfolder": "sub"})
    assert calls == [{}, {"subfolder": "sub"}]
    manifest = json.loads((root / "funnel_onnx" / runtimes.MANIFEST).read_text())
    assert manifest["source"]["load"] == {"subfolder": "sub"}
    assert "sub/model.safetensors" in manifest["source"]["files"]
    runtimes.export_onnx(model, model_kwargs={"subfolder": "sub", "dtype": "float16"})
    assert len(calls) == 2  # the export is float32 whatever dtype says: reused


def test_manifest_records_every_export_file_digest(model):
    _scores(model, "onnx")
    folder = Path(model) / "funnel_onnx"
    files = json.loads((folder / runtimes.MANIFEST).read_text())["files"]
    assert set(files) == {"model.onnx", runtimes.TOKENIZER_FILE, runtimes.TOKENIZER_SETTINGS}
    for name, entry in files.items():
        assert entry["sha256"] == runtimes.file_sha256(folder / name)
