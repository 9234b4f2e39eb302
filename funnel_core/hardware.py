"""What the machine runs natively, and the precision chosen from it.

bf16 is fast only where the hardware has it: on a CPU with AVX-512-BF16 or AMX, on a GPU of
compute capability 8.0 or newer (Ampere+). Elsewhere it is emulated: on an AMD EPYC with AVX2 only,
a bf16-autocast training step of this project took 126-156 s against 5.2 s in fp32 (25-30x slower).

:func:`decide_dtype` is a pure function of (requested dtype, device, CPU flags, GPU capability),
so every branch is testable without the hardware; :func:`resolve_dtype` feeds it this machine's
facts and warns once per (request, device) when an explicit request runs slowly here.

``dtype="auto"`` (the default of every scorer, embedder and trainer):

* CUDA, capability >= 8.0: ``bfloat16``; older CUDA: ``float16``;
* CPU with ``avx512_bf16`` or ``amx_bf16`` (x86) or ``bf16`` (Arm): ``bfloat16``;
* anything else (CPU without native bf16, MPS): ``float32``.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["DTYPES", "DtypeDecision", "available_cores", "cpu_flags", "cpu_native_bf16", "cuda_capability",
           "decide_dtype", "resolve_dtype", "torch_dtype", "describe", "BF16_SLOWDOWN",
           "requested_dtype", "autocast", "fp32_output_head"]

DTYPES = ("auto", "float32", "bfloat16", "float16")
_ALIASES = {"auto": "auto", None: "auto", "fp32": "float32", "float32": "float32",
            "float": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
            "float16": "float16", "half": "float16"}
#: The measured cost of bf16 without native support (see the module docstring).
BF16_SLOWDOWN = ("bf16 without native support ran 25-30x slower than fp32 here (a training step: "
                 "126-156 s in bf16 vs 5.2 s in fp32 on an AVX2-only AMD EPYC)")
#: CPU flags that matter for precision and int8 kernels (recorded by benchmarks).
RELEVANT_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
                  "amx_bf16", "amx_int8", "bf16", "i8mm")
_WARNED: set[tuple[str, str]] = set()
#: every decision of :func:`resolve_dtype` in this process: (request, device type, dtype) -> count
_RESOLVED: dict[tuple[str, str, str], int] = {}


@dataclass(frozen=True)
class DtypeDecision:
    """The dtype to run in and, for a request that will run slowly or is not honoured, why."""

    dtype: str
    warning: str | None = None


def normalize_dtype(requested: Any) -> str:
    """``"bf16"``/``torch.bfloat16``/... -> one of :data:`DTYPES`; a clear error otherwise."""
    key = str(requested).replace("torch.", "") if requested is not None else None
    if key not in _ALIASES:
        raise ValueError(f"unknown dtype {requested!r}; use one of {DTYPES} (or fp32/bf16/fp16).")
    return _ALIASES[key]


def cpu_native_bf16(flags: Iterable[str]) -> bool:
    """Whether these CPU flags run bf16 natively (AVX-512-BF16, AMX-BF16, Arm BF16)."""
    flags = set(flags)
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & flags)


def decide_dtype(requested: Any, device: str, flags: Iterable[str] = (),
                 capability: tuple[int, int] | None = None) -> DtypeDecision:
    """The precision for ``device`` given what the hardware runs natively (pure function).

    Args:
        requested: ``"auto"``/``None`` or an explicit dtype (``"float32"``, ``"bf16"``, ...).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ...
        flags: CPU flags (``/proc/cpuinfo``), used for CPU devices.
        capability: CUDA compute capability ``(major, minor)``; ``None`` when unknown.
    """
    want = normalize_dtype(requested)
    kind = str(device).split(":")[0]
    native_bf16 = (capability is not None and capability >= (8, 0)) if kind == "cuda" else (
        kind == "cpu" and cpu_native_bf16(flags))
    if want == "auto":
        if kind == "cuda":
            return DtypeDecision("bfloat16" if native_bf16 else "float16")
        return DtypeDecision("bfloat16" if native_bf16 else "float32")
    if want == "bfloat16" and not native_bf16 and kind in ("cpu", "cuda"):
        where = ("this CPU has no AVX-512-BF16/AMX" if kind == "cpu"
                 else f"this GPU (compute capability {capability}) has no native bf16")
        return DtypeDecision("bfloat16", f"bf16 was requested but {where}: {BF16_SLOWDOWN}. "
                             "Use dtype='auto' (float32 here) unless you need bf16.")
    if want == "float16" and kind == "cpu":
        return DtypeDecision("float32", "float16 was requested on a CPU, where it is slow and "
                             "often unsupported; running in float32 (use a GPU for float16).")
    return DtypeDecision(want)


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


#: Device files a GPU runtime needs on Linux: NVIDIA's driver (CUDA), WSL 2's GPU bridge, AMD's
#: compute driver (ROCm). Without any of them torch cannot see a GPU.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")


def gpu_possible() -> bool:
    """Whether torch could find a GPU here. ``False`` only on Linux without any of
    :data:`GPU_DEVICE_FILES`, so a caller can settle on the CPU without importing torch (about
    3 s); ``True`` elsewhere (macOS has MPS, Windows its own drivers): ask torch."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.path.exists(p) for p in GPU_DEVICE_FILES)


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This machine's CPU flags (``flags``/``Features`` of ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


@functools.lru_cache(maxsize=1)
def l2_cache_bytes() -> int | None:
    """Per-core L2 (or unified level-2) cache size from Linux's sysfs; ``None`` where unknown."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return None
    for entry in entries:
        try:
            with open(f"{base}/{entry}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{entry}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/{entry}/size") as f:
                size = f.read().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Unified", "Data"):
            return parse_cache_size(size)
    return None


def parse_cache_size(text: str) -> int | None:
    """sysfs's cache size (``"512K"``, ``"2048K"``, ``"1M"``) in bytes; ``None`` if unreadable."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    scale = units.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in units else text
    return int(digits) * scale if digits.isdigit() else None


def cuda_capability(device: str = "cuda") -> tuple[int, int] | None:
    """Compute capability of a CUDA device, ``None`` without CUDA (imports torch lazily)."""
    if not str(device).startswith("cuda"):
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - no driver, bad index: unknown
        return None


def resolve_dtype(requested: Any, device: str) -> str:
    """:func:`decide_dtype` on this machine; warns once per (request, device) when it has a warning."""
    decision = decide_dtype(requested, device, cpu_flags(), cuda_capability(device))
    made = (normalize_dtype(requested), str(device).split(":")[0], decision.dtype)
    _RESOLVED[made] = _RESOLVED.get(made, 0) + 1
    if decision.warning:
        key = made[:2]
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(decision.warning, RuntimeWarning, stacklevel=3)
    return decision.dtype


def resolved_dtypes() -> list[dict[str, Any]]:
    """The precisions this process's stages resolved to so far (one row per request, device
    type and resulting dtype, with how many loads made it): what a benchmark really ran in."""
    return [{"requested": r, "device": d, "dtype": t, "loads": n}
            for (r, d, t), n in sorted(_RESOLVED.items())]


def torch_dtype(name: str) -> Any:
    """``"bfloat16"`` -> ``torch.bfloat16`` (imports torch)."""
    import torch

    return getattr(torch, name)


def requested_dtype(dtype: Any, *, fp16: bool | None = None, bf16: bool = False) -> str:
    """The request made by a stage's settings: the older ``bf16=True`` / ``fp16=True|False`` flags
    are explicit requests that win over ``dtype`` (``fp16=None`` means "not set")."""
    if bf16:
        return "bfloat16"
    if fp16 is not None:
        return "float16" if fp16 else "float32"
    return normalize_dtype(dtype)


def autocast(dtype: str, device: str) -> Any:
    """A fresh ``torch.autocast`` context: bfloat16 autocast when ``dtype`` is ``"bfloat16"``,
    a disabled (no-op) one otherwise (float16 and float32 run in the weights' own dtype)."""
    import torch

    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                          enabled=dtype == "bfloat16")


def fp32_output_head(model: Any) -> None:
    """Run ``model``'s output projection (``get_output_embeddings()``) in float32 under bf16
    autocast, for a model whose weights are float32.

    Under autocast the vocabulary logits come out of the head in bfloat16, i.e. in steps of 1/16
    to 1/8 at typical magnitudes, and scores read from two logits (monoT5's true/false,
    RankRAG's True/False) then tie. The head is one matrix product, so keeping it in float32
    costs little. A no-op for models without a linear output head.
    """
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or getattr(head, "_funnel_fp32", False):
        return
    linear = torch.nn.functional.linear

    def forward(x: Any) -> Any:
        with torch.autocast(device_type=x.device.type, enabled=False):
            bias = None if head.bias is None else head.bias.float()
            return linear(x.float(), head.weight.float(), bias)

    head.forward = forward  # type: ignore[method-assign,assignment]
    head._funnel_fp32 = True  # type: ignore[assignment]


def describe() -> dict[str, Any]:
    """The facts a benchmark records: CPU model and relevant flags, torch's CPU capability,
    GPU name and capability, the auto dtype per device, the precisions resolved so far in this
    process (:func:`resolved_dtypes`: call it after the models loaded) and the load average."""
    flags = cpu_flags()
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    info: dict[str, Any] = {"cpu_model": model or platform.processor(), "cpus": os.cpu_count(),
                            "cpu_flags": sorted(f for f in RELEVANT_FLAGS if f in flags),
                            "cpu_native_bf16": cpu_native_bf16(flags),
                            "l2_cache_bytes": l2_cache_bytes(),
                            "auto_dtype_cpu": decide_dtype("auto", "cpu", flags).dtype,
                            "dtypes_resolved": resolved_dtypes(),
                            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            cap = cuda_capability("cuda")
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_capability"] = list(cap) if cap else None
            info["auto_dtype_cuda"] = decide_dtype("auto", "cuda", flags, cap).dtype
    except ImportError:
        pass
    return info
