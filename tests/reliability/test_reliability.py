"""Short run of the reliability suite (< 60 s); the long run is ``make reliability``."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reliability_harness as rh  # noqa: E402

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")


# the dense kinds run in ``make reliability`` only: pytest has imported numpy with BLAS threads
# before the harness can limit them, and a fork then can leave the child waiting on their locks
@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
@pytest.mark.parametrize("kind", ["bm25", "clustered", "langchain_bm25"])
def test_kill_at_every_step_boundary(kind, tmp_path):
    s = rh.kill_at_steps(kind, repeats=1, workdir=tmp_path)
    assert s["trials"] >= 2 * len(rh.STEPS) - 2  # marker: first save only; cleanup: overwrite only
    assert s["survived"] == s["trials"] and s["neither"] == 0, s
    assert s["orphans_after_next_save"] == 0 and s["next_save_wrong"] == 0, s
    assert s["loaded_previous"] > 0 and s["loaded_new"] > 0  # both sides of the commit point seen


def test_injected_io_errors_never_raise_after_a_commit_or_lose_both(tmp_path):
    s = rh.io_errors("bm25", workdir=tmp_path)
    assert s["trials"] > 10 and s["neither"] == 0 and s["raised_but_committed"] == 0, s
    assert s["orphans_after_next_save"] == 0 and s["raised_loaded_previous"] > 0 and s["succeeded_loaded_new"] > 0, s


def test_kill_at_random_points(tmp_path):
    s = rh.kill_random("bm25", trials=12, workdir=tmp_path)
    assert s["survived"] == s["trials"] == 12 and s["orphans_after_next_save"] == 0, s


def test_bit_flips_never_load_silently(tmp_path):
    s = rh.bit_flips("bm25", trials=120, workdir=tmp_path)
    assert s["silent"] == 0 and s["detected"] > 80, s
    # only what loads never read may take a flip harmlessly: the marker and the save journal
    assert {k for k, v in s["by_file"].items() if v["harmless"]} <= {".funnel-rag", ".funnel-rag.journal"}, s


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
def test_concurrent_save_load_never_mixes(tmp_path):
    s = rh.concurrent_save_load("bm25", seconds=3.0, readers=2, workdir=tmp_path)
    assert s["mixed"] == 0 and s["errors"] == 0 and s["loads"] > 10 and s["saves"] > 5, s
    assert s["orphans_after_final_save"] == 0


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
@pytest.mark.parametrize("kind", ["bm25", "clustered"])
def test_queries_during_add_delete(kind):
    s = rh.queries_during_updates(kind, seconds=2.0, threads=3)
    assert s["errors"] == 0 and s["wrong"] == 0 and s["queries"] > 50 and s["updates"] >= 4, s


def test_fuzz_queries_corpora_filters():
    s = rh.fuzz(max_examples=40)
    assert s["failures"] == 0, s.get("failure")
    assert s["examples"] >= 40


# -- what is read back but was not written by this run (trust_harness.py) --------------------------
import trust_harness as th  # noqa: E402


@pytest.mark.slow
def test_eval_output_and_cache_campaign_smoke(tmp_path):
    s = th.eval_cache_campaign(trials=8, seed=3, workdir=tmp_path)
    assert s["trials"] == 8 and s["bad"] == 0, s
    assert s["same"] + s["refused"] == 8, s


@pytest.mark.slow
@pytest.mark.models  # builds a tiny cross-encoder and exports it to ONNX
def test_export_cache_campaign_smoke(tmp_path):
    pytest.importorskip("onnxruntime")
    s = th.export_cache_campaign(trials=4, seed=3, workdir=tmp_path)  # untouched, swapped, linked, FIFO
    assert s["trials"] == 4 and s["bad"] == 0 and s["reused"] == 1, s


@pytest.mark.slow
def test_filter_campaign_smoke(tmp_path):
    pytest.importorskip("milvus_lite")
    s = th.filter_campaign(trials=60, save_trials=8, seed=3, workdir=tmp_path)
    assert s["bad"] == 0 and s["widened"] == 0, s
    assert s["ok"] > 20 and s["saved_and_kept_floor"] > 0, s
