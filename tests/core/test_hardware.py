"""Precision chosen from the hardware: every branch of the pure decision, without the hardware."""

from __future__ import annotations

import warnings

import pytest

from funnel_core import hardware
from funnel_core.hardware import decide_dtype

AVX2 = {"sse4_2", "avx2", "fma"}
AVX512_BF16 = AVX2 | {"avx512f", "avx512_bf16"}
AMX = AVX2 | {"avx512f", "amx_tile", "amx_bf16"}


@pytest.mark.parametrize("device,flags,cap,expected", [
    ("cpu", AVX2, None, "float32"),             # AVX2-only EPYC: bf16 emulated, 25-30x slower
    ("cpu", AVX2 | {"avx512f"}, None, "float32"),  # AVX-512 without BF16 is not enough
    ("cpu", AVX512_BF16, None, "bfloat16"),
    ("cpu", AMX, None, "bfloat16"),
    ("cpu", {"fp", "asimd", "bf16"}, None, "bfloat16"),  # Arm with BF16
    ("cuda", AVX2, (8, 0), "bfloat16"),          # A100
    ("cuda:1", AVX2, (9, 0), "bfloat16"),        # H100
    ("cuda", AVX512_BF16, (7, 5), "float16"),    # T4: CPU flags do not matter for a GPU
    ("cuda", AVX2, None, "float16"),             # capability unknown: not assumed Ampere
    ("mps", AMX, None, "float32"),
])
def test_auto(device, flags, cap, expected):
    d = decide_dtype("auto", device, flags, cap)
    assert d.dtype == expected and d.warning is None


def test_explicit_bf16_without_native_support_warns_with_the_slowdown():
    d = decide_dtype("bf16", "cpu", AVX2)
    assert d.dtype == "bfloat16" and "25-30x" in d.warning
    assert "compute capability" in decide_dtype("bfloat16", "cuda", (), (7, 0)).warning
    assert decide_dtype("bf16", "cpu", AVX512_BF16).warning is None


def test_explicit_choices_and_aliases():
    assert decide_dtype("fp32", "cpu", AMX).dtype == "float32"
    assert decide_dtype("float16", "cuda", (), (7, 0)).dtype == "float16"
    cpu_half = decide_dtype("fp16", "cpu", AMX)
    assert cpu_half.dtype == "float32" and "float16" in cpu_half.warning
    assert decide_dtype(None, "cpu", AVX2).dtype == "float32"
    with pytest.raises(ValueError, match="unknown dtype"):
        decide_dtype("int4", "cpu", AVX2)


def test_resolve_warns_once(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(AVX2))
    monkeypatch.setattr(hardware, "_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hardware.resolve_dtype("bf16", "cpu") == "bfloat16"
        assert hardware.resolve_dtype("bfloat16", "cpu") == "bfloat16"
        assert hardware.resolve_dtype("auto", "cpu") == "float32"
    assert len([w for w in caught if "25-30x" in str(w.message)]) == 1


def test_this_machine_is_described():
    info = hardware.describe()
    assert info["auto_dtype_cpu"] in ("float32", "bfloat16")
    assert set(info["cpu_flags"]) <= set(hardware.RELEVANT_FLAGS)
    assert info["cpu_native_bf16"] == hardware.cpu_native_bf16(hardware.cpu_flags())


def test_the_precisions_a_process_ran_in_are_recorded(monkeypatch, minilm_path):
    from funnel_core.embeddings import SentenceEmbedder

    monkeypatch.setattr(hardware, "_RESOLVED", {})
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(AVX2))
    assert hardware.describe()["dtypes_resolved"] == []            # nothing loaded yet
    SentenceEmbedder(minilm_path, device="cpu", cache=False).encode(["a"])
    SentenceEmbedder(minilm_path, device="cpu", cache=False, dtype="bf16").encode(["a"])
    monkeypatch.setattr(hardware, "cpu_flags", lambda: frozenset(AVX2 | {"avx512f", "avx512_bf16"}))
    SentenceEmbedder(minilm_path, device="cpu", cache=False).encode(["a"])
    assert hardware.describe()["dtypes_resolved"] == [
        {"requested": "auto", "device": "cpu", "dtype": "bfloat16", "loads": 1},
        {"requested": "auto", "device": "cpu", "dtype": "float32", "loads": 1},
        {"requested": "bfloat16", "device": "cpu", "dtype": "bfloat16", "loads": 1},
    ]
