"""Inference runtimes of the cross-encoder: torch, ONNX Runtime (fp32), OpenVINO.

:class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer` runs its model in one of
:data:`RUNTIMES`:

* ``"torch"`` — the model as loaded by transformers / sentence-transformers / FlagEmbedding;
* ``"onnx"`` — the same weights exported to ONNX (``torch.onnx.export``) and run by an
  ``onnxruntime.InferenceSession`` in fp32; scores equal torch fp32 to about 1e-5;
* ``"openvino"`` — the fp32 ONNX export compiled by OpenVINO for the CPU (OpenVINO reads ONNX
  files directly; no optimum-intel needed);
* ``"auto"`` (default) — :func:`choose_runtime`: torch on a GPU; on a CPU the fastest runtime
  that kept nDCG@10 within 0.005 of torch fp32 in ``benchmarks/results/ce_backends.json`` among
  those installed and suited to the CPU (see :func:`cpu_auto_runtime`).

optimum is deliberately not used: optimum 2.x / optimum-onnx pin ``transformers<4.58`` and this
project runs on transformers 5.

**Export cache.** The export is written once and reused by the next load. For a local model
folder it goes to ``<model>/funnel_onnx/`` (a subfolder this package owns, marked by
``funnel_export.json``); when that folder is not writable, or the model is a hub name, it goes to
``funnel_core.cache.cache_root() / ce_export/<key>/`` (``$FUNNEL_RAG_CACHE``, default
``~/.cache/funnel-rag``). The export is keyed by content: the manifest records
the source's fingerprint (the SHA-256 of every weights, config, tokenizer and code file of the
model folder, and of its ``subfolder`` when one is loaded; for a hub name, the cached snapshot's
files and commit) and the load arguments that change what is exported (``model_kwargs``:
``subfolder``, ``revision``, ...; not ``dtype``, the export is float32), and the SHA-256 of each
file the export itself wrote (``model.onnx``, the kept tokenizer JSON and its settings). Before
an export is used, the source is fingerprinted again and the export's files are checked against
their digests; any difference (other weights, even of the same size and modification time, an
edited tokenizer, a ``model.onnx`` copied in from elsewhere, other load arguments) rebuilds the
export in a new folder, swapped in with one rename. A file is hashed once per process for a given
(path, device, inode, size, mtime_ns, ctime_ns): rewriting a file in place, or ``cp -p`` over it,
changes its ctime, which no user call can set back. OpenVINO's compiled model is cached in
the export's ``openvino_cache/`` subfolder (:data:`OPENVINO_CACHE`): a second process loads it
instead of compiling again. Files this package did not write are never
deleted: a ``funnel_onnx`` folder without our manifest is left alone and the user cache is used.

**Tokenizer without transformers.** The export also keeps the model's fast tokenizer as the
``tokenizers`` library's JSON (:data:`TOKENIZER_FILE`, as transformers configured it) and the
padding and truncation settings transformers applies at each call (:data:`TOKENIZER_SETTINGS`).
:class:`PairTokenizer` encodes pairs from these with ``tokenizers`` alone, so a process that
scores with a cached export never imports transformers, which imports torch (~3 s of a first
call, ``benchmarks/results/first_call.json``). Its inputs equal transformers' (tested).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["RUNTIMES", "cpu_auto_runtime", "choose_runtime", "runtime_available", "export_onnx",
           "export_dir_for", "file_sha256", "hub_snapshot", "OnnxSession", "PairTokenizer", "EXPORT_FORMAT"]

RUNTIMES = ("auto", "torch", "onnx", "openvino")
EXPORT_FORMAT = 4  # 3: the tokenizer is kept in the export (TOKENIZER_FILE, TOKENIZER_SETTINGS);
#                    4: keyed by content (source SHA-256 + load arguments; each export file's SHA-256)
EXPORT_SUBDIR = "funnel_onnx"
MANIFEST = "funnel_export.json"
#: Subfolder of an export where OpenVINO keeps the model it compiled for this CPU (its own
#: ``CACHE_DIR`` format, keyed by the ONNX file, the device and the settings), so only the first
#: process compiles; it is replaced together with its export.
OPENVINO_CACHE = "openvino_cache"
#: The export's copy of the fast tokenizer (``tokenizers`` JSON), and the settings transformers
#: applies around it at each call (pad token and side, truncation side, special-token splitting).
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_SETTINGS = "tokenizer_settings.json"
_EXPORT_LOCK = threading.Lock()
_PACKAGES = {"onnx": "onnxruntime", "openvino": "openvino"}


def runtime_available(runtime: str) -> bool:
    """Whether the package ``runtime`` needs is importable (torch is assumed)."""
    pkg = _PACKAGES.get(runtime)
    return pkg is None or importlib.util.find_spec(pkg) is not None


def cpu_auto_runtime(available: Callable[[str], bool], native_bf16: bool, *,
                     fp32: bool = False) -> str:
    """What ``runtime="auto"`` runs on a CPU, in the order of the measured table
    (``benchmarks/results/ce_backends.json``, rendered in docs/performance.md: pairs/s relative to
    torch fp32 and the nDCG@10 loss against it):

    * ``"openvino"`` when installed, the only runtime that met the target (>= 2x at <= 0.005
      loss). OpenVINO picks its own inference precision (bf16 on a CPU with native bf16, fp32
      without), so an explicit ``fp32`` request skips it;
    * else ``"torch"`` where the CPU runs bf16 natively (its ``dtype="auto"`` is then bf16);
    * else ``"onnx"`` (fp32, scores equal to torch fp32) when onnxruntime is installed;
    * else ``"torch"``.

    (Dynamic int8 quantisation of the ONNX export was measured too and removed: it lost more
    nDCG@10 than the 0.005 bound, so ``"auto"`` never chose it.)
    A pure function of its arguments.
    """
    if not fp32 and available("openvino"):
        return "openvino"
    if native_bf16 and not fp32:
        return "torch"
    return "onnx" if available("onnx") else "torch"


def choose_runtime(runtime: str, device: str, backend: str, *,
                   available: Callable[[str], bool] = runtime_available,
                   native_bf16: bool | None = None, fp32: bool = False) -> str:
    """The runtime to use: ``runtime`` itself unless it is ``"auto"``.

    ``"auto"``: torch on any non-CPU device and for the FlagEmbedding backend (its own loader);
    on a CPU :func:`cpu_auto_runtime` (``native_bf16``: whether this CPU runs bf16 natively,
    detected by :mod:`funnel_core.hardware` when ``None``; ``fp32``: the caller asked for float32
    explicitly). ``available`` is injectable for tests.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown cross-encoder runtime {runtime!r}; choose one of {RUNTIMES}.")
    if runtime != "auto":
        return runtime
    if not device.startswith("cpu") or backend == "flagembedding":
        return "torch"
    if native_bf16 is None:
        from funnel_core.hardware import cpu_flags, cpu_native_bf16

        native_bf16 = cpu_native_bf16(cpu_flags())
    return cpu_auto_runtime(available, native_bf16, fp32=fp32)


# -- export cache ----------------------------------------------------------------------------
def _user_cache() -> Path:
    from funnel_core.cache import cache_root

    return cache_root() / "ce_export"


#: Files of a model folder that decide what is exported (weights, config, tokenizer, remote code).
SOURCE_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model", ".py", ".tiktoken")
#: ``model_kwargs`` that do not change the float32 export (it drops them or sets them itself).
_NOT_IN_KEY = frozenset({"dtype", "torch_dtype", "attn_implementation"})
_DIGESTS: dict[tuple[Any, ...], str] = {}
_DIGESTS_LOCK = threading.Lock()


def file_sha256(path: str | os.PathLike, *, follow: bool = True) -> str:
    """SHA-256 of the regular file ``path``, hashed once per process for a given (path, device,
    inode, size, mtime_ns, ctime_ns).

    The file is opened non-blocking (a FIFO does not hang the caller) and, with
    ``follow=False``, without following a symlink; anything but a regular file raises
    :class:`OSError`.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{os.fspath(path)!r} is not a regular file; refusing to read it.")
        key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
               st.st_ctime_ns)
        with _DIGESTS_LOCK:
            known = _DIGESTS.get(key)
        if known is not None:
            return known
        h = hashlib.sha256()
        with os.fdopen(os.dup(fd), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = h.hexdigest()
        with _DIGESTS_LOCK:
            _DIGESTS[key] = digest
        return digest
    finally:
        os.close(fd)


def _load_arguments(model_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The ``model_kwargs`` that change the export, as JSON (values JSON cannot hold: ``repr``)."""
    kept = {str(k): v for k, v in (model_kwargs or {}).items() if k not in _NOT_IN_KEY}
    return json.loads(json.dumps(kept, sort_keys=True, default=repr))


def _folder_files(root: Path, subfolder: str | None) -> dict[str, str]:
    """SHA-256 of the files of ``root`` (and of ``root/subfolder``) that decide the export."""
    folders = [root]
    if subfolder:
        folders.append(root / subfolder)
    files = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for f in sorted(folder.iterdir()):
            if f.suffix in SOURCE_SUFFIXES and f.is_file():
                files[f.relative_to(root).as_posix()] = file_sha256(f)
    return files


def hub_snapshot(name: str, revision: Any) -> Path | None:
    """The locally cached snapshot folder of hub model ``name`` (``None`` when not cached)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json",
                                       revision=revision if isinstance(revision, str) else None)
    except Exception:  # no huggingface_hub, an invalid repo id: nothing cached to hash
        return None
    return Path(found).parent if isinstance(found, str) else None


def _fingerprint(model: str, model_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """What identifies the export's source: the SHA-256 of the model's files (a local folder, or
    the cached snapshot of a hub name) and the load arguments that change the export."""
    load = _load_arguments(model_kwargs)
    subfolder = (model_kwargs or {}).get("subfolder")
    subfolder = subfolder if isinstance(subfolder, str) else None
    path = Path(model)
    if path.is_dir():
        return {"folder": str(path.resolve()), "files": _folder_files(path, subfolder),
                "load": load}
    snapshot = hub_snapshot(model, (model_kwargs or {}).get("revision"))
    if snapshot is None:
        return {"hub_name": model, "load": load}
    return {"hub_name": model, "commit": snapshot.name,
            "files": _folder_files(snapshot, subfolder), "load": load}


def _writable(folder: Path) -> bool:
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _ours(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def export_dir_for(model: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the export of ``model`` lives (see the module docstring)."""
    if cache_dir is not None:
        return Path(cache_dir)
    path = Path(model)
    if path.is_dir():
        mine = path / EXPORT_SUBDIR
        if (mine.exists() and _ours(mine)) or (not mine.exists() and _writable(path)):
            return mine
        key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
        return _user_cache() / f"{path.name}-{key}"
    safe = "".join(c if c.isalnum() or c in "-_." else "--" for c in model)
    return _user_cache() / safe


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    """The export's manifest (opened no-follow, non-blocking, bounded); ``None`` if unreadable."""
    flags = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_BINARY", 0))
    try:
        fd = os.open(folder / MANIFEST, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(1 << 20)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def _manifest_ok(folder: Path, fingerprint: dict[str, Any], name: str) -> bool:
    """Whether ``folder`` holds a current export of ``fingerprint``: same format and source, and
    every file the export wrote (no more) has the SHA-256 its manifest records."""
    data = _read_manifest(folder)
    if data is None or data.get("format") != EXPORT_FORMAT or data.get("source") != fingerprint:
        return False
    files = data.get("files")
    if not isinstance(files, dict) or name not in files:
        return False
    for kept in (TOKENIZER_FILE, TOKENIZER_SETTINGS):  # one dropped into an export that kept none
        if kept not in files and os.path.lexists(folder / kept):
            return False
    for file, entry in files.items():
        if not (isinstance(file, str) and isinstance(entry, dict) and file == Path(file).name):
            return False
        try:
            if file_sha256(folder / file, follow=False) != entry.get("sha256"):
                return False
        except OSError:
            return False
    return True


def _export_fp32(model_name: str, out: Path, model_kwargs: dict[str, Any]) -> list[str]:
    """``torch.onnx.export`` of a sequence-classification model; returns the input names."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from funnel_core.models import load_pretrained

    tokenizer = load_pretrained(AutoTokenizer.from_pretrained, model_name, what="tokenizer")
    kwargs = {**model_kwargs, "attn_implementation": "eager"}
    kwargs.pop("torch_dtype", None)
    kwargs.pop("dtype", None)
    model = load_pretrained(AutoModelForSequenceClassification.from_pretrained, model_name,
                            what="cross-encoder", **kwargs).float().eval()
    _save_tokenizer(tokenizer, out)
    enc = tokenizer(["a query", "another query"], ["a passage", "a somewhat longer passage"],
                    padding=True, return_tensors="pt")
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in enc]

    class Logits(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            return self.inner(**dict(zip(names, args))).logits

    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["logits"] = {0: "batch"}
    import warnings
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about shape-dependent Python branches
        torch.onnx.export(Logits(model), tuple(enc[n] for n in names), str(out / "model.onnx"),
                          input_names=names, output_names=["logits"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    return names


def _save_tokenizer(tokenizer: Any, out: Path) -> None:
    """Keep ``tokenizer`` in the export for :class:`PairTokenizer`; nothing for a tokenizer
    without a ``tokenizers`` backend or a pad token (transformers then stays in use)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or tokenizer.pad_token is None:
        return
    from tokenizers import Tokenizer

    plain = Tokenizer.from_str(backend.to_str())
    plain.no_truncation()  # the per-call settings are applied by PairTokenizer
    plain.no_padding()
    (out / TOKENIZER_FILE).write_text(plain.to_str(), encoding="utf-8")
    settings = {"pad_id": tokenizer.pad_token_id, "pad_token": tokenizer.pad_token,
                "pad_type_id": tokenizer.pad_token_type_id, "padding_side": tokenizer.padding_side,
                "truncation_side": tokenizer.truncation_side,
                "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False))}
    (out / TOKENIZER_SETTINGS).write_text(json.dumps(settings, indent=1), encoding="utf-8")


class PairTokenizer:
    """(query, passage) pairs to model inputs with the ``tokenizers`` library alone: the calls
    transformers' fast tokenizer makes for ``tokenizer(queries, texts, truncation=strategy,
    max_length=max_length, padding=True)`` (truncation and padding set on the backend, then
    ``encode_batch``), from an export's :data:`TOKENIZER_FILE` and :data:`TOKENIZER_SETTINGS`.

    Args:
        folder: The export folder.
        max_length: Tokens per pair, special tokens included.
        strategy: ``"only_second"`` (the passage is truncated) or ``"longest_first"``.
    """

    def __init__(self, folder: str | os.PathLike, max_length: int, strategy: str) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        settings = json.loads((folder / TOKENIZER_SETTINGS).read_text(encoding="utf-8"))
        self._single = Tokenizer.from_file(str(folder / TOKENIZER_FILE))  # no truncation/padding
        self._pairs = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        self._pairs.enable_truncation(max_length, stride=0, strategy=strategy,
                                      direction=settings["truncation_side"])
        self._pairs.enable_padding(direction=settings["padding_side"], pad_id=settings["pad_id"],
                                   pad_type_id=settings["pad_type_id"], pad_token=settings["pad_token"])
        for tok in (self._single, self._pairs):
            tok.encode_special_tokens = settings["split_special_tokens"]

    @classmethod
    def from_export(cls, folder: str | os.PathLike, max_length: int,
                    strategy: str) -> "PairTokenizer | None":
        """The export's tokenizer; ``None`` when it kept none or ``tokenizers`` is missing."""
        folder = Path(folder)
        if not ((folder / TOKENIZER_FILE).is_file() and (folder / TOKENIZER_SETTINGS).is_file()):
            return None
        if importlib.util.find_spec("tokenizers") is None:
            return None
        return cls(folder, max_length, strategy)

    def token_count(self, text: str) -> int:
        """Tokens of ``text`` alone, without special tokens."""
        return len(self._single.encode(text, add_special_tokens=False).ids)

    def __call__(self, queries: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
        """``input_ids``, ``attention_mask`` and ``token_type_ids`` as int64 numpy arrays."""
        import numpy as np

        encodings = self._pairs.encode_batch(list(zip(queries, texts)))
        return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}


def export_onnx(model_name: str, *, cache_dir: str | os.PathLike | None = None,
                model_kwargs: dict[str, Any] | None = None) -> Path:
    """Path of the ONNX file of ``model_name`` (exported once, then reused).

    The export goes to a temporary folder next to the target and is swapped in with one rename;
    concurrent exporters keep whichever export landed first. An existing export is used only
    when its source fingerprint (content of the model files and the load arguments in
    ``model_kwargs``) and the SHA-256 of each of its files match its manifest; otherwise it is
    rebuilt (see the module docstring).
    """
    target = export_dir_for(model_name, cache_dir)
    name = "model.onnx"
    with _EXPORT_LOCK:
        fingerprint = _fingerprint(model_name, model_kwargs)
        if _manifest_ok(target, fingerprint, name):
            return target / name
        if target.exists() and not _ours(target):
            raise FileExistsError(f"{target} exists and was not written by funnel-rag (no "
                                  f"{MANIFEST}); pass another cache_dir or remove it yourself.")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            t0 = time.perf_counter()
            inputs = _export_fp32(model_name, tmp, dict(model_kwargs or {}))
            if "files" not in fingerprint:  # a hub model downloaded by this export: now cached
                fingerprint = _fingerprint(model_name, model_kwargs)
            files = {f: {"sha256": file_sha256(tmp / f, follow=False),
                         **({"kind": "fp32"} if f == name else {})}
                     for f in (name, TOKENIZER_FILE, TOKENIZER_SETTINGS) if (tmp / f).is_file()}
            import onnxruntime
            import torch
            manifest = {"format": EXPORT_FORMAT, "source": fingerprint, "files": files,
                        "inputs": inputs, "torch": torch.__version__,
                        "onnxruntime": onnxruntime.__version__,
                        "seconds": round(time.perf_counter() - t0, 2)}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
            _swap_in(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder
    return target / name


def _swap_in(tmp: Path, target: Path) -> None:
    """Replace ``target`` (absent, or an export of ours) by ``tmp`` with renames."""
    if not target.exists():
        with contextlib.suppress(OSError):  # another process may have landed one first
            os.rename(tmp, target)
        return
    old = target.with_name(f".{target.name}.old-{os.getpid()}-{threading.get_ident()}")
    try:
        os.rename(target, old)
        moved = True
    except FileNotFoundError:  # another process moved the stale export away first
        moved = False
    with contextlib.suppress(OSError):  # another process may have landed a new one first
        os.rename(tmp, target)
    if moved:
        shutil.rmtree(old, ignore_errors=True)  # it carried our manifest: ours to delete


# -- sessions --------------------------------------------------------------------------------
class OnnxSession:
    """Run an exported cross-encoder with onnxruntime or OpenVINO: numpy in, logits out."""

    def __init__(self, path: str | os.PathLike, *, engine: str = "onnxruntime",
                 threads: int | None = None) -> None:
        self.path = str(path)
        self.engine = engine
        if engine == "onnxruntime":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            if threads:
                opts.intra_op_num_threads = threads
            self._session = ort.InferenceSession(self.path, sess_options=opts,
                                                 providers=["CPUExecutionProvider"])
            self.input_names = [i.name for i in self._session.get_inputs()]
        elif engine == "openvino":
            import openvino as ov

            core = ov.Core()
            config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads} if threads else {}
            cache = Path(self.path).parent / OPENVINO_CACHE
            if _writable(cache.parent):  # the compiled blob, reused by the next process
                config["CACHE_DIR"] = str(cache)
            self._compiled = core.compile_model(self.path, "CPU", config)
            self.input_names = [p.get_any_name() for p in self._compiled.inputs]
            # an OpenVINO infer request runs one inference at a time ("Infer Request is busy"):
            # one per calling thread, so a scorer shared by threads is safe, as with onnxruntime
            self._requests = threading.local()
        else:
            raise ValueError(f"unknown ONNX engine {engine!r}; use 'onnxruntime' or 'openvino'.")

    def __call__(self, feeds: dict[str, Any]) -> Any:
        import numpy as np

        inputs = {n: np.asarray(feeds[n], dtype=np.int64) for n in self.input_names}
        if self.engine == "onnxruntime":
            return self._session.run(None, inputs)[0]
        request = getattr(self._requests, "request", None)
        if request is None:
            request = self._requests.request = self._compiled.create_infer_request()
        return np.array(next(iter(request.infer(inputs).values())))  # a copy: the request reuses its buffers


def score_batches(session: OnnxSession, tokenize: Callable[[list[str], list[str]], Any],
                  queries: Sequence[str], texts: Sequence[str], batch_size: int,
                  sort_by_length: bool) -> list[float]:
    """Scores (last logit) of (query, text) pairs in batches, in input order."""
    order = list(range(len(texts)))
    if sort_by_length:
        order.sort(key=lambda i: -(len(texts[i]) + len(queries[i])))
    out = [0.0] * len(texts)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        enc = tokenize([queries[i] for i in idx], [texts[i] for i in idx])
        logits = session(enc)
        for i, s in zip(idx, logits[:, -1].tolist()):
            out[i] = float(s)
    return out
