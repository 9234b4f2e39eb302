"""Train the MiniLM FiD reader, score dev-a with its cross-attention, run L2G: one self-contained job.

    python benchmarks/fid_l2g_gpu.py --data DATA.json.gz --minilm MINILM_DIR --out OUT_DIR

Reads the bundle of ``benchmarks/fid_l2g_data.py`` and needs only torch, transformers, safetensors,
numpy and this package (no bm25s), so it runs on a GPU machine or a CPU (``--device cpu`` with
small ``--fid-train``/``--dev``/time caps). The whole job obeys ``--max-total-seconds`` (counted
from the start of the process); every step writes its outputs into ``--out`` as soon as it ends,
so a job stopped from outside still returns what was done. Steps:

1. **FiD reader**: ``init_fid_from_encoder(MiniLM)`` (BERT2BERT warm start), then a training loop
   written for throughput (the loss is ``funnel_core.train.fid.fid_loss``, the tokenisation
   ``fid_collate``, i.e. exactly what ``train_fid`` computes): every example is tokenised once up
   front and kept on the device, each batch is cut to its longest passage, SDPA attention, bf16
   autocast on CUDA, fused AdamW, gradient clipping 1.0. The learning rate warms up linearly over
   the first ``--warmup`` of the run and decays linearly to 0 at its end, the run's progress being
   ``max(step / planned steps, elapsed / --fid-seconds)``, so it decays to 0 whether the epoch
   cap (``--fid-epochs``) or the time cap ends it. The newly initialised parameters (decoder
   cross-attention, LM-head transform) get ``--fid-new-lr``, the pretrained ones ``--fid-lr``.
   The word embeddings of the encoder and of the decoder (the decoder's tied output matrix) stay
   FROZEN at MiniLM's: this is what lets the checkpoint travel back (a 49M-parameter BERT2BERT is
   94 MiB in fp16, over the 64 MiB a device job returns; without the two 11.7M-parameter
   embedding matrices it is 49 MiB). ``--fid-heldout`` train questions (the last ones of
   ``fid_train``) are held out; their LM loss is logged before training, every
   ``--eval-every`` seconds and at the end (the convergence check). The training loss, examples
   seen and throughput are logged every ``--log-every`` steps.
2. **Checkpoint**: the trained weights are rounded to fp16 (the dev scan below then runs the very
   weights that travel) and written as ONE tar (``config.json``, ``generation_config.json``,
   tokenizer files, ``fid_trainable.fp16.safetensors`` = every weight but the frozen embeddings,
   ``restore.json``) split into pieces ``fid_ckpt.tar.partNN`` of at most ``--piece-mib`` MiB.
   ``benchmarks/fid_ckpt_restore.py`` joins them and refills the embeddings from MiniLM into a
   folder ``FiDAttentionScorer(model=folder)`` loads.
3. **Post-ranker on dev-a**: ``FiDAttentionScorer`` loads the checkpoint; for every dev question
   the first decoder token's cross-attention over its BM25 top-n passages is reduced to
   per-(layer, head, passage) statistics ``stats``: the mean of the top-1 / top-4 passage tokens
   and of all of them, with and without the question's tokens, and the legacy averaged-map top-4
   (heads and layers averaged first). ``log_stats`` adds the mean of the LOG attention over the
   top-1 / top-4 (chosen by attention) / all passage tokens: FunnelRAG's eq. 3 averages the
   pre-softmax score alpha, which ranks like the mean log-attention within one softmax. The
   generated answer is kept for the exact-match sanity figure. Every Table 7 scheme and the
   Table 8 query ablation are computed afterwards (``fid_l2g_report.py``).
4. **L2G** (FunnelRAG eqs. 4-6), only when ``--max-total-seconds`` leaves time for it: the FiD
   teacher scores the BM25 top-n passages of ``l2g_train`` questions (eq. 3); ``l2g_group``
   aggregates them to documents (eq. 4, alpha 0.5) and takes hits + the top-1 document as
   positives (eq. 5); ``CrossEncoderTrainer(loss="bpr")`` (eq. 6) trains a MiniLM cross-encoder
   on them; the control arm trains on the answer labels alone. Dev-a scores of the pre-ranker
   candidates (documents' windows, MaxP) and the post-ranker candidates for the untrained init
   and both arms.

Writes into ``--out`` (at most 8 files, each < 16 MiB: what a device job returns):
``fid_ckpt.tar.part00..`` (4 pieces), ``summary.json``, ``fid_dev.npz``, ``log.txt`` and, when
L2G ran, ``l2g.npz``. Work files go to ``--work`` (never into the repository).
"""

from __future__ import annotations

import time

T_START = time.perf_counter()   # the global budget counts from here (before torch's import)

import argparse  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
for p in (str(HERE), str(HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

#: statistic names stored per (question, passage, variant, layer, head) in ``stats``
VARIANTS = ("top1", "top4", "all", "top1_q", "top4_q", "all_q")
#: the same reductions of log(attention), passage tokens only, in ``log_stats``
LOG_VARIANTS = ("logtop1", "logtop4", "logall")
#: weights left out of the checkpoint (frozen at MiniLM's word embeddings; the LM output matrix
#: is tied to the decoder's word embeddings)
FROZEN = ("encoder.embeddings.word_embeddings.weight",
          "decoder.bert.embeddings.word_embeddings.weight",
          "decoder.cls.predictions.decoder.weight")
MIB = 1 << 20
RETURN_LIMIT = 64 * MIB            # what a device job returns from $OUT, all files together
FILE_LIMIT = 16 * MIB
MAX_FILES = 8


def elapsed() -> float:
    return time.perf_counter() - T_START


class Tee(io.TextIOBase):
    """Write to the console and to ``log.txt`` (flushed per write: a killed job keeps its log)."""

    def __init__(self, stream, log) -> None:
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        self.stream.write(s)
        self.stream.flush()
        self.log.write(s)
        self.log.flush()
        return len(s)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


def log(msg: str) -> None:
    print(f"[{elapsed():6.1f} s] {msg}", flush=True)


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    tmp.replace(path)


def out_bytes(out: Path) -> tuple[int, int]:
    files = [f for f in out.iterdir() if f.is_file() and not f.name.endswith(".tmp")]
    return sum(f.stat().st_size for f in files), len(files)


# ------------------------------------------------------------------------------------------------
# dev-a / teacher statistics
# ------------------------------------------------------------------------------------------------
def passage_stats(attn, inputs, lr: int = 4):
    """Per passage: ``stats [len(VARIANTS), L, H]``, ``log_stats [len(LOG_VARIANTS), L, H]`` and
    the averaged-map top-lr ``legacy [2]`` (without / with query tokens)."""
    n_p = len(inputs.lengths)
    out = np.zeros((n_p, len(VARIANTS), attn.shape[0], attn.shape[1]), np.float32)
    logs = np.zeros((n_p, len(LOG_VARIANTS), attn.shape[0], attn.shape[1]), np.float32)
    legacy = np.zeros((n_p, 2), np.float32)
    pos = 0
    for k, (n, pm, qm) in enumerate(zip(inputs.lengths, inputs.passage_mask, inputs.query_mask)):
        a = attn[:, :, pos:pos + n]
        for j, mask in enumerate((pm, pm | qm)):
            sel = a[:, :, mask]                                   # [L, H, T]
            if sel.shape[-1] == 0:
                continue
            t = sel.shape[-1]
            top = sel.topk(min(lr, t), dim=-1).values             # [L, H, lr], descending
            out[k, 3 * j + 0] = top[..., 0].numpy()
            out[k, 3 * j + 1] = top.mean(dim=-1).numpy()
            out[k, 3 * j + 2] = sel.mean(dim=-1).numpy()
            avg = sel.mean(dim=(0, 1))
            legacy[k, j] = float(avg.topk(min(lr, t)).values.mean())
            if j == 0:                                            # log-attention, passage tokens
                lsel = sel.clamp_min(1e-30).log()
                ltop = top.clamp_min(1e-30).log()                 # tokens chosen by attention
                logs[k, 0] = ltop[..., 0].numpy()
                logs[k, 1] = ltop.mean(dim=-1).numpy()
                logs[k, 2] = lsel.mean(dim=-1).numpy()
        pos += n
    return out, logs, legacy


def fid_scan(scorer, rows, passages, titles, *, answers: bool, max_seconds: float, log_every=200):
    """Run the FiD over each row's passages; return stats, log stats, legacy, answers, seconds."""
    stats, lstats, legacy, texts = [], [], [], []
    t0 = time.perf_counter()
    for i, r in enumerate(rows):
        if time.perf_counter() - t0 > max_seconds:
            log(f"fid scan stopped at its cap after {i} of {len(rows)} questions")
            break
        inputs = scorer.build_inputs(r["q"], [passages[j] for j in r["p"]], [titles[j] for j in r["p"]])
        states = scorer.encode(inputs)
        dec, ans = scorer._decoder_prefix(states)
        attn = scorer.cross_attention(states, dec).float().cpu()
        s, ls, lg = passage_stats(attn, inputs)
        stats.append(s)
        lstats.append(ls)
        legacy.append(lg)
        texts.append(ans if answers else None)
        if log_every and (i + 1) % log_every == 0:
            log(f"  fid scan {i + 1}/{len(rows)} {time.perf_counter() - t0:.0f} s")
    if not stats:
        return None, None, None, [], time.perf_counter() - t0
    # BM25 can return fewer than n passages (short queries): pad with NaN
    width = max(len(x) for x in stats)
    pad = lambda a: np.concatenate([a, np.full((width - len(a),) + a.shape[1:], np.nan, a.dtype)])
    return (np.stack([pad(x) for x in stats]), np.stack([pad(x) for x in lstats]),
            np.stack([pad(x) for x in legacy]), texts, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------
# FiD training
# ------------------------------------------------------------------------------------------------
def pretokenize(tokenizer, examples, *, n_passages: int, max_length: int, answer_max_length: int,
                chunk: int = 1024):
    """``ids [N, n, max_length]`` int32, ``lengths [N, n]``, ``labels [N, answer_max_length]``
    (-100 padded) and ``label_lengths [N]``: ``fid_collate``'s tokenisation, done once."""
    import torch

    from funnel_core.train.fid import fid_collate

    n = len(examples)
    ids = torch.zeros((n, n_passages, max_length), dtype=torch.int32)
    lengths = torch.zeros((n, n_passages), dtype=torch.int32)
    labels = torch.full((n, answer_max_length), -100, dtype=torch.int32)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if pad != 0:
        ids.fill_(pad)
    for s in range(0, n, chunk):
        t = fid_collate(tokenizer, examples[s:s + chunk], n_passages=n_passages,
                        max_length=max_length, answer_max_length=answer_max_length)
        w, a = t["input_ids"].shape[2], t["labels"].shape[1]
        ids[s:s + chunk, :, :w] = t["input_ids"].to(torch.int32)
        lengths[s:s + chunk] = t["attention_mask"].sum(dim=2).to(torch.int32)
        labels[s:s + chunk, :a] = t["labels"].to(torch.int32)
    label_lengths = (labels != -100).sum(dim=1)
    return ids, lengths, labels, label_lengths


class Batcher:
    """Device-resident pre-tokenised examples; each batch cut to its longest passage / answer."""

    def __init__(self, ids, lengths, labels, label_lengths, device: str) -> None:
        import torch

        self.ids = ids.to(device)
        self.lengths = lengths.to(device)
        self.labels = labels.to(device)
        self.len_np = lengths.max(dim=1).values.numpy()
        self.lab_np = label_lengths.numpy()
        self.arange = torch.arange(ids.shape[2], device=device)
        self.device = device

    def __len__(self) -> int:
        return len(self.len_np)

    def batch(self, idx: np.ndarray):
        import torch

        w = max(1, int(self.len_np[idx].max()))
        a = max(1, int(self.lab_np[idx].max()))
        ix = torch.from_numpy(idx).to(self.device, non_blocking=True)
        ids = self.ids[ix, :, :w].long()
        mask = (self.arange[:w] < self.lengths[ix].unsqueeze(-1)).long()
        lab = self.labels[ix, :a].long()
        return ids, mask, lab


def heldout_loss(net, batcher, *, batch_size: int, amp: str, device: str) -> float:
    import torch

    from funnel_core.train.fid import fid_loss

    was = net.training
    net.eval()
    total, count = 0.0, 0
    with torch.inference_mode(), torch.autocast(device_type=torch.device(device).type,
                                                dtype=torch.bfloat16, enabled=amp == "bfloat16"):
        for s in range(0, len(batcher), batch_size):
            idx = np.arange(s, min(s + batch_size, len(batcher)))
            loss = fid_loss(net, *batcher.batch(idx))
            total += float(loss) * len(idx)
            count += len(idx)
    net.train(was)
    return total / max(count, 1)


def train_reader(init: str, train_b: Batcher, held_b: Batcher | None, args, *, device: str,
                 amp: str, budget: float, summary_cb) -> tuple[object, object, dict]:
    """Train from ``init``; return the model (fp32 weights), its tokenizer and the training log."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from funnel_core.train.fid import fid_loss

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(init, padding_side="right")
    try:
        net = AutoModelForSeq2SeqLM.from_pretrained(init, attn_implementation="sdpa")
        attn_impl = "sdpa"
    except Exception as e:  # noqa: BLE001 - any failure: fall back to the scorer's eager attention
        log(f"sdpa attention unavailable ({type(e).__name__}: {e}); eager")
        net = AutoModelForSeq2SeqLM.from_pretrained(init, attn_implementation="eager")
        attn_impl = "eager"
    net.to(device).train()
    params = dict(net.named_parameters())
    for k in FROZEN:
        if k in params:
            params[k].requires_grad_(False)
    out_emb = net.get_output_embeddings()
    frozen_ok = (out_emb is not None and out_emb.weight is params["decoder.bert.embeddings.word_embeddings.weight"]
                 and not out_emb.weight.requires_grad)
    if not frozen_ok:
        raise RuntimeError("the decoder's output matrix is not tied to its (frozen) word embeddings; "
                           "the checkpoint would miss a trained matrix")
    is_new = lambda n: ".crossattention." in n or n.startswith("decoder.cls.predictions.")
    groups = {(new, nd): [] for new in (False, True) for nd in (False, True)}
    for n, p in net.named_parameters():
        if p.requires_grad:
            groups[(is_new(n), p.ndim < 2)].append(p)
    param_groups = [{"params": ps, "weight_decay": 0.0 if nd else args.fid_weight_decay,
                     "lr": args.fid_new_lr if new else args.fid_lr, "base_lr": args.fid_new_lr if new else args.fid_lr}
                    for (new, nd), ps in groups.items() if ps]
    fused = device.startswith("cuda")
    optimizer = torch.optim.AdamW(param_groups, lr=args.fid_lr, fused=fused)
    n_train = sum(p.numel() for g in param_groups for p in g["params"])
    n_new = sum(p.numel() for (new, _), ps in groups.items() if new for p in ps)
    n_all = sum(p.numel() for p in net.parameters())

    bs = args.fid_batch
    steps_per_epoch = math.ceil(len(train_b) / bs)
    planned = steps_per_epoch * args.fid_epochs
    info = {"attn_implementation": attn_impl, "autocast": amp, "fused_adamw": fused,
            "parameters": n_all, "trainable_parameters": n_train, "new_parameters": n_new,
            "frozen": list(FROZEN), "examples": len(train_b), "heldout_examples": len(held_b) if held_b else 0,
            "batch_size": bs, "steps_per_epoch": steps_per_epoch, "epochs_cap": args.fid_epochs,
            "planned_steps": planned, "time_budget_s": round(budget, 1), "lr": args.fid_lr,
            "new_lr": args.fid_new_lr, "warmup": args.warmup, "weight_decay": args.fid_weight_decay,
            "max_grad_norm": 1.0, "max_length": args.max_length, "answer_max_length": args.answer_max_length,
            "schedule": "linear warmup then linear decay to 0 over progress = max(step/planned, time/budget)",
            "log": [], "heldout": []}
    log(f"training: {n_all / 1e6:.1f}M parameters, {n_train / 1e6:.1f}M trainable ({n_new / 1e6:.1f}M new), "
        f"{len(train_b)} examples, batch {bs}, {steps_per_epoch} steps/epoch, cap {args.fid_epochs} epochs "
        f"or {budget:.0f} s, attention {attn_impl}, autocast {amp}")

    def lr_factor(progress: float) -> float:
        if progress < args.warmup:
            return max(progress / args.warmup, 0.01)
        return max(0.0, (1.0 - progress) / (1.0 - args.warmup))

    def evaluate(step: int, seen: int, t: float) -> None:
        if held_b is None:
            return
        te = time.perf_counter()
        v = heldout_loss(net, held_b, batch_size=args.fid_batch * 2, amp=amp, device=device)
        info["heldout"].append({"step": step, "examples_seen": seen, "train_seconds": round(t, 1),
                                "heldout_loss": round(v, 4), "eval_seconds": round(time.perf_counter() - te, 2)})
        log(f"  held-out LM loss {v:.4f} at step {step} ({seen} examples seen)")

    evaluate(0, 0, 0.0)
    summary_cb(info)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    t_eval = t0
    step, seen, epoch, stop = 0, 0, 0, None
    win_loss = torch.zeros((), device=device)
    win_steps, win_t, win_seen = 0, t0, 0
    amp_ctx = lambda: torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                                     enabled=amp == "bfloat16")
    while stop is None:
        order = rng.permutation(len(train_b))
        for s in range(0, len(order), bs):
            progress = max(step / planned, (time.perf_counter() - t0) / budget)
            if progress >= 1.0:
                stop = "epoch cap" if step >= planned else "time cap"
                break
            f = lr_factor(progress)
            for g in optimizer.param_groups:
                g["lr"] = g["base_lr"] * f
            idx = order[s:s + bs]
            ids, mask, lab = train_b.batch(idx)
            with amp_ctx():
                loss = fid_loss(net, ids, mask, lab)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in param_groups for p in g["params"]], 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            win_loss += loss.detach()
            win_steps += 1
            step += 1
            seen += len(idx)
            if step % args.log_every == 0:
                mean = float(win_loss) / win_steps          # syncs the device
                now = time.perf_counter()
                rate = (seen - win_seen) / (now - win_t)
                rec = {"step": step, "epoch": round(seen / len(train_b), 3), "examples_seen": seen,
                       "train_seconds": round(now - t0, 1), "loss": round(mean, 4),
                       "lr": round(args.fid_lr * f, 8), "examples_per_s": round(rate, 1)}
                info["log"].append(rec)
                log(f"  step {step} ep {rec['epoch']:.2f} seen {seen} loss {mean:.4f} lr {rec['lr']:.2e} "
                    f"{rate:.1f} ex/s")
                win_loss.zero_()
                win_steps, win_t, win_seen = 0, now, seen
                if now - t_eval >= args.eval_every:
                    evaluate(step, seen, now - t0)
                    t_eval = time.perf_counter()
                    summary_cb(info)
        else:
            epoch += 1
            if epoch >= args.fid_epochs:
                stop = "epoch cap"
    if win_steps:
        info["log"].append({"step": step, "epoch": round(seen / len(train_b), 3), "examples_seen": seen,
                            "train_seconds": round(time.perf_counter() - t0, 1),
                            "loss": round(float(win_loss) / win_steps, 4)})
    train_s = time.perf_counter() - t0
    info.update({"steps": step, "examples_seen": seen, "epochs_done": round(seen / len(train_b), 3),
                 "train_seconds": round(train_s, 1), "stopped_by": stop,
                 "examples_per_s_overall": round(seen / max(train_s, 1e-9), 1)})
    if not info["heldout"] or info["heldout"][-1]["step"] != step:
        evaluate(step, seen, train_s)
    net.eval()
    return net, tokenizer, info


# ------------------------------------------------------------------------------------------------
# checkpoint: fp16 tar in pieces
# ------------------------------------------------------------------------------------------------
def save_checkpoint(net, tokenizer, work: Path, out: Path, *, piece_mib: float) -> dict:
    """Round the weights to fp16 in place, save the full fp32 folder ``work/fid`` (for the scan)
    and the fp16 tar pieces into ``out``. Returns the manifest."""
    import torch
    from safetensors.torch import save_file

    with torch.no_grad():
        for p in net.parameters():
            p.copy_(p.half().float())
    full = work / "fid"
    net.save_pretrained(full)
    tokenizer.save_pretrained(full)
    sd = net.state_dict()
    keep = {k: v.detach().half().contiguous().cpu() for k, v in sd.items() if k not in FROZEN}
    emb = sd["encoder.embeddings.word_embeddings.weight"].detach().half().cpu().contiguous()
    dec_emb = sd["decoder.bert.embeddings.word_embeddings.weight"].detach().half().cpu().contiguous()
    sha = lambda t: hashlib.sha256(t.numpy().tobytes()).hexdigest()
    restore = {"format": "funnel-rag FiD checkpoint, frozen word embeddings left out",
               "weights": "fid_trainable.fp16.safetensors",
               "fill_from_minilm": {k: "embeddings.word_embeddings.weight"
                                    for k in ("encoder.embeddings.word_embeddings.weight",
                                              "decoder.bert.embeddings.word_embeddings.weight")},
               "tied": {"decoder.cls.predictions.decoder.weight": "decoder.bert.embeddings.word_embeddings.weight"},
               "frozen_sha256_fp16": {"encoder.embeddings.word_embeddings.weight": sha(emb),
                                      "decoder.bert.embeddings.word_embeddings.weight": sha(dec_emb)},
               "parameters_stored": int(sum(v.numel() for v in keep.values()))}
    stage = work / "ckpt_stage"
    stage.mkdir(parents=True, exist_ok=True)
    save_file(keep, str(stage / restore["weights"]), metadata={"format": "pt"})
    (stage / "restore.json").write_text(json.dumps(restore, indent=1), encoding="utf-8")
    names = ["restore.json", restore["weights"]]
    for f in sorted(full.iterdir()):
        if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("model"):
            names.append(f.name)
            (stage / f.name).write_bytes(f.read_bytes())
    tar_path = work / "fid_ckpt.tar"
    with tarfile.open(tar_path, "w") as tf:
        for n in names:
            tf.add(stage / n, arcname=f"fid_ckpt/{n}")
    blob = tar_path.read_bytes()
    piece = int(piece_mib * MIB)
    parts = []
    for i in range(0, len(blob), piece):
        name = f"fid_ckpt.tar.part{i // piece:02d}"
        (out / name).write_bytes(blob[i:i + piece])
        parts.append(name)
    return {"tar_bytes": len(blob), "tar_sha256": hashlib.sha256(blob).hexdigest(), "pieces": parts,
            "piece_bytes": piece, "members": names, "restore": restore,
            "restore_command": "python benchmarks/fid_ckpt_restore.py --parts OUT --out FOLDER"}


# ------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--minilm", required=True, help="folder of all-MiniLM-L6-v2 (any dtype)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/m22_work")
    ap.add_argument("--device", default=None)
    ap.add_argument("--max-total-seconds", type=float, default=480,
                    help="the whole job, counted from the process start")
    ap.add_argument("--fid-train", type=int, default=None, help="use only the first N fid_train rows")
    ap.add_argument("--fid-heldout", type=int, default=500, help="last N of those rows: held-out loss")
    ap.add_argument("--fid-seconds", type=float, default=360, help="training-loop cap (evals included)")
    ap.add_argument("--fid-epochs", type=int, default=4)
    ap.add_argument("--fid-batch", type=int, default=64)
    ap.add_argument("--fid-lr", type=float, default=1.5e-4, help="peak lr, pretrained parameters")
    ap.add_argument("--fid-new-lr", type=float, default=5e-4,
                    help="peak lr, new parameters (cross-attention, LM-head transform)")
    ap.add_argument("--fid-weight-decay", type=float, default=0.01)
    ap.add_argument("--warmup", type=float, default=0.06, help="share of the run's progress")
    ap.add_argument("--log-every", type=int, default=50, help="steps between loss lines")
    ap.add_argument("--eval-every", type=float, default=60, help="seconds between held-out losses")
    ap.add_argument("--reserve-seconds", type=float, default=80,
                    help="kept for checkpoint + dev scan when sizing the training budget")
    ap.add_argument("--piece-mib", type=float, default=15)
    ap.add_argument("--dev", type=int, default=None)
    ap.add_argument("--dev-seconds", type=float, default=90)
    ap.add_argument("--l2g-train", type=int, default=None)
    ap.add_argument("--teacher-seconds", type=float, default=60)
    ap.add_argument("--ce-seconds", type=float, default=40)
    ap.add_argument("--l2g-scoring-seconds", type=float, default=90,
                    help="the time L2G's dev scoring is assumed to need (gating only)")
    ap.add_argument("--l2g-chunk", type=int, default=32768, help="pairs per L2G scoring call")
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--answer-max-length", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    logf = open(out / "log.txt", "a", encoding="utf-8")
    sys.stdout, sys.stderr = Tee(sys.__stdout__, logf), Tee(sys.__stderr__, logf)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer

    from funnel_core.rerank.fid import FiDAttentionScorer
    from funnel_core.train.fid import FiDExample, init_fid_from_encoder

    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except Exception:  # noqa: BLE001
        pass
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    amp = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}")
    with gzip.open(args.data, "rt", encoding="utf-8") as f:
        data = json.load(f)
    passages, titles = data["passages"], data["titles"]
    n_pass = data["meta"]["n_passages"]
    summary = {"device": device, "gpu": torch.cuda.get_device_name(0) if cuda else None,
               "torch": torch.__version__, "transformers": transformers.__version__,
               "platform": platform.platform(), "cpu_count": os.cpu_count(), "args": vars(args),
               "data_meta": data["meta"], "autocast": amp, "steps_done": []}

    def save_summary() -> None:
        summary["elapsed_seconds"] = round(elapsed(), 1)
        write_json(out / "summary.json", summary)

    # fp32 MiniLM (the carried copy is fp16)
    m32 = work / "minilm32"
    AutoModel.from_pretrained(args.minilm).float().save_pretrained(m32)
    AutoTokenizer.from_pretrained(args.minilm).save_pretrained(m32)
    init = init_fid_from_encoder(m32, work / "fid_init", seed=args.seed)
    log("data + BERT2BERT init ready")

    # 1. FiD reader
    rows = data["fid_train"][:args.fid_train] if args.fid_train else data["fid_train"]
    n_held = min(args.fid_heldout, len(rows) // 5)
    train_rows, held_rows = rows[:len(rows) - n_held], rows[len(rows) - n_held:]
    to_ex = lambda rs: [FiDExample(question=r["q"], answers=r["a"],
                                   passages=[(titles[j], passages[j]) for j in r["p"]]) for r in rs]
    tok = AutoTokenizer.from_pretrained(init, padding_side="right")
    tp = time.perf_counter()
    kw = dict(n_passages=n_pass, max_length=args.max_length, answer_max_length=args.answer_max_length)
    train_b = Batcher(*pretokenize(tok, to_ex(train_rows), **kw), device=device)
    held_b = Batcher(*pretokenize(tok, to_ex(held_rows), **kw), device=device) if held_rows else None
    tok_s = time.perf_counter() - tp
    log(f"pre-tokenised {len(train_rows)} + {len(held_rows)} examples in {tok_s:.1f} s "
        f"(mean longest passage per example {train_b.len_np.mean():.0f} tokens)")
    budget = min(args.fid_seconds, args.max_total_seconds - elapsed() - args.reserve_seconds)
    if budget < 5:
        raise SystemExit(f"no time left to train ({budget:.0f} s); raise --max-total-seconds")

    def on_progress(info) -> None:
        summary["fid_training"] = info
        save_summary()

    summary["pretokenize_seconds"] = round(tok_s, 1)
    net, tokenizer, info = train_reader(init, train_b, held_b, args, device=device, amp=amp,
                                        budget=budget, summary_cb=on_progress)
    del train_b, held_b
    summary["fid_training"] = info
    log(f"trained {info['steps']} steps, {info['examples_seen']} examples ({info['epochs_done']} epochs) "
        f"in {info['train_seconds']} s, {info['examples_per_s_overall']} ex/s, stopped by {info['stopped_by']}")

    # 2. checkpoint (written before anything else can fail)
    tc = time.perf_counter()
    manifest = save_checkpoint(net, tokenizer, work, out, piece_mib=args.piece_mib)
    manifest["seconds"] = round(time.perf_counter() - tc, 1)
    summary["checkpoint"] = manifest
    summary["steps_done"].append("fid_training")
    summary["steps_done"].append("checkpoint")
    save_summary()
    log(f"checkpoint: {manifest['tar_bytes'] / MIB:.1f} MiB tar in {len(manifest['pieces'])} pieces")
    del net
    if cuda:
        torch.cuda.empty_cache()

    # 3. dev-a post-ranking statistics + answers
    scorer = FiDAttentionScorer(model=str(work / "fid"), return_answer=True, max_answer_tokens=16,
                                device=device, batch_size=32, max_length=args.max_length, dtype="float32")
    dev = data["dev"][:args.dev] if args.dev else data["dev"]
    dev_cap = min(args.dev_seconds, args.max_total_seconds - elapsed() - 5)
    stats, lstats, legacy, answers, secs = fid_scan(scorer, dev, passages, titles, answers=True,
                                                    max_seconds=dev_cap)
    if stats is not None:
        np.savez_compressed(out / "fid_dev.npz", stats=stats.astype(np.float16),
                            log_stats=lstats.astype(np.float16), legacy=legacy,
                            variants=np.array(VARIANTS), log_variants=np.array(LOG_VARIANTS))
        total, nfiles = out_bytes(out)
        if total > RETURN_LIMIT - 2 * MIB:      # keep room for summary + log
            log(f"outputs {total / MIB:.1f} MiB: dropping the +query variants of fid_dev.npz")
            np.savez_compressed(out / "fid_dev.npz", stats=stats[:, :, :3].astype(np.float16),
                                log_stats=lstats.astype(np.float16), legacy=legacy,
                                variants=np.array(VARIANTS[:3]), log_variants=np.array(LOG_VARIANTS))
        eq3 = stats[:, :, VARIANTS.index("top4")].astype(np.float64).mean(axis=(2, 3))
        summary["fid_dev"] = {"questions": len(answers), "seconds": round(secs, 1),
                              "layers": int(stats.shape[2]), "heads": int(stats.shape[3]),
                              "npz_bytes": (out / "fid_dev.npz").stat().st_size,
                              "eq3_first_question": [float(x) for x in eq3[0]],
                              "answers": answers}
        summary["steps_done"].append("fid_dev")
        log(f"dev scan: {len(answers)} questions in {secs:.0f} s")
    save_summary()

    # 4. L2G, only when the budget allows it
    need = args.teacher_seconds + 2 * args.ce_seconds + args.l2g_scoring_seconds + 20
    left = args.max_total_seconds - elapsed()
    if left < need:
        summary["l2g"] = {"skipped": f"{left:.0f} s left of --max-total-seconds, L2G needs ~{need:.0f} s"}
        log(f"L2G skipped: {summary['l2g']['skipped']}")
        save_summary()
    else:
        run_l2g(args, data, scorer, dev, m32, work, out, device, amp == "bfloat16", summary, save_summary)
    summary["total_seconds"] = round(elapsed(), 1)
    total, nfiles = out_bytes(out)
    summary["out_files"] = {"count": nfiles + (0 if (out / "summary.json").exists() else 1),
                            "mib": round(total / MIB, 2)}
    save_summary()
    log(f"done in {elapsed():.0f} s; {nfiles} files, {total / MIB:.1f} MiB in {out}")


def run_l2g(args, data, scorer, dev, m32, work, out, device, bf16, summary, save_summary) -> None:
    from score_pairs import score as score_pairs

    from funnel_core.evaluation.metrics import has_answer
    from funnel_core.train import CrossEncoderTrainer, TrainingGroup, init_cross_encoder, l2g_group
    from funnel_core.units import Unit

    passages, titles = data["passages"], data["titles"]
    scorer.return_answer = False
    l2g_rows = data["l2g_train"][:args.l2g_train] if args.l2g_train else data["l2g_train"]
    tstats, _, _, _, tsecs = fid_scan(scorer, l2g_rows, passages, titles, answers=False,
                                      max_seconds=args.teacher_seconds)
    l2g_rows = l2g_rows[:len(tstats)]
    teacher = tstats[:, :, VARIANTS.index("top4")].mean(axis=(2, 3))    # eq. 3 [q, n]
    dop = data["doc_of_passage"]
    l2g_groups, label_groups = [], []
    for r, sc in zip(l2g_rows, teacher):
        rep = {}
        for j in r["p"]:
            rep.setdefault(dop[j], j)          # best-BM25 retrieved window of each document
        docs = [Unit(id=str(d), text=passages[j]) for d, j in rep.items()]
        ps = [Unit(id=f"p{j}", text=passages[j], parent_id=str(dop[j]), score=float(s))
              for j, s in zip(r["p"], sc)]
        g = l2g_group(r["q"], docs, ps, r["a"], alpha=0.5, top_k=1, query_id=r.get("id"))
        if g is not None:
            l2g_groups.append(g)
        hits = [d.text for d in docs if has_answer(d.text, r["a"])]
        rest = [d.text for d in docs if not has_answer(d.text, r["a"])]
        if hits and rest:
            label_groups.append(TrainingGroup(query=r["q"], positives=hits, negatives=rest,
                                              query_id=r.get("id")))
    summary["l2g_teacher"] = {"questions": len(teacher), "seconds": round(tsecs, 1),
                              "l2g_groups": len(l2g_groups), "label_groups": len(label_groups)}
    log(json.dumps(summary["l2g_teacher"]))
    save_summary()

    ce_init = init_cross_encoder(m32, work / "ce_init", seed=args.seed)
    arms = {}
    for name, groups in (("l2g", l2g_groups), ("labels", label_groups)):
        trainer = CrossEncoderTrainer(model=ce_init, loss="bpr", max_length=args.max_length,
                                      learning_rate=5e-5, head_learning_rate=5e-4, num_negatives=4,
                                      queries_per_step=16, epochs=1, bf16=bf16, device=device,
                                      max_seconds=args.ce_seconds, seed=args.seed,
                                      show_progress=False)
        rep = trainer.train(groups, work / f"ce_{name}")
        losses = rep.losses
        arms[name] = {"groups": len(groups), "steps": rep.steps, "seconds": rep.seconds,
                      "stopped_early": rep.stopped_early,
                      "loss_first20": float(np.mean(losses[:20])), "loss_last20": float(np.mean(losses[-20:])),
                      "loss_curve_mean20": [float(np.mean(losses[i:i + 20])) for i in range(0, len(losses), 20)]}
        log(name + " " + json.dumps({k: v for k, v in arms[name].items() if "curve" not in k}))
    summary["l2g_arms"] = arms
    save_summary()

    pod = data["passages_of_doc"]
    qs = [r["q"] for r in dev]
    pre_qi, pre_pi = [], []
    for i, r in enumerate(dev):
        for d in r["docs"]:
            for j in pod[d]:
                pre_qi.append(i)
                pre_pi.append(j)
    post_qi = [i for i, r in enumerate(dev) for _ in r["p"]]
    post_pi = [j for r in dev for j in r["p"]]
    scores = {"teacher": teacher.astype(np.float32),
              "pre_qi": np.array(pre_qi, np.int32), "pre_pi": np.array(pre_pi, np.int32),
              "post_qi": np.array(post_qi, np.int32), "post_pi": np.array(post_pi, np.int32)}
    timing, deadline = {}, args.max_total_seconds - 10
    for name, folder in (("init", ce_init), ("l2g", work / "ce_l2g"), ("labels", work / "ce_labels")):
        for part, qi, pi in (("post", post_qi, post_pi), ("pre", pre_qi, pre_pi)):
            # chunks, so the global budget holds: pairs not scored in time stay NaN
            qi, pi = np.array(qi), np.array(pi)
            s = np.full(len(qi), np.nan, np.float16)
            t0, done = time.perf_counter(), 0
            for c in range(0, len(qi), args.l2g_chunk):
                if elapsed() > deadline:
                    break
                uniq, local = np.unique(pi[c:c + args.l2g_chunk], return_inverse=True)
                sc, _ = score_pairs(qs, [passages[j] for j in uniq], qi[c:c + args.l2g_chunk], local,
                                    str(folder), batch_size=512, max_length=args.max_length,
                                    device=device, log_every=0)
                s[c:c + len(sc)] = sc
                done = c + len(sc)
            scores[f"{part}_{name}"] = s
            timing[f"{part}_{name}"] = {"seconds": round(time.perf_counter() - t0, 1),
                                        "pairs_scored": done, "pairs": len(qi)}
    summary["dev_scoring"] = timing
    log("L2G dev scoring " + json.dumps(timing))
    tmp = work / "l2g.npz"
    np.savez_compressed(tmp, **scores)
    total, nfiles = out_bytes(out)
    size = tmp.stat().st_size
    if total + size + MIB <= RETURN_LIMIT and nfiles + 1 <= MAX_FILES and size <= FILE_LIMIT:
        (out / "l2g.npz").write_bytes(tmp.read_bytes())
        summary["l2g"] = {"written": "l2g.npz", "bytes": size}
    else:
        summary["l2g"] = {"not_written": f"l2g.npz ({size / MIB:.1f} MiB) would exceed the return limits "
                                         f"({total / MIB:.1f} MiB in {nfiles} files already)"}
    summary["steps_done"].append("l2g")
    save_summary()


if __name__ == "__main__":
    main()
