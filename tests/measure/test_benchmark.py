"""training/measure/benchmark.py runs its grid and prints a row per loop and cell, with the trainer's overhead
against the bare loop and the external one, then each lever's effect with the spread of its repeats.

Kept light for the suite (one batch size, 3 steps of 16 tokens, one repeat, the two kinds of lever measurement:
the trainer's own tokens/s and the wall clock of ``async_checkpoint``); ``make bench`` runs every lever."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch

from tests.training.runner import GUARD_SECONDS, PYTHON, ROOT, TINY, env
from training.contract import settings_parse, shapes
from training.measure import benchmark, external_baseline
from training.trainer import config

LEVERS = ("grad_accum_steps", "async_checkpoint")  # measured by the summary's tokens/s, and by the wall clock


def test_benchmark_prints_every_loop_of_each_cell_and_each_levers_effect():
    proc = subprocess.run(
        [PYTHON, "-m", "training.measure.benchmark", "--steps", "3", "--warmup", "1", "--repeats", "1",
         "--seq-length", "16", "--batch-sizes", "1", "--lever-repeats", "1", "--levers", ",".join(LEVERS)],
        env=env(), cwd=ROOT, capture_output=True, text=True, timeout=GUARD_SECONDS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"\s*fp32\s", line)]
    assert {(r[1], r[2], r[3]) for r in rows} == {
        ("1", "off", "trainer"), ("1", "off", "bare"), ("1", "off", "external"),
        ("1", "on", "trainer"), ("1", "on", "bare"),
    }  # fmt: skip
    for r in rows:
        assert float(r[4]) > 0 and float(r[7]) > 0  # tokens/s and peak memory are measured
    overheads = {r[2]: r[8:] for r in rows if r[3] == "trainer"}
    # against the bare loop (same model), the external one (AC off only: it has no AC), the spread of the repeats
    assert re.fullmatch(r"[+-]\d+\.\d% [+-]\d+\.\d%ext \[\d+\.\.\d+\]", " ".join(overheads["off"]))
    assert re.fullmatch(r"[+-]\d+\.\d% \[\d+\.\.\d+\]", " ".join(overheads["on"]))
    for lever in LEVERS:
        printed = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] == [lever]]
        labels = [label for label, _ in dict(benchmark.LEVER_CASES)[lever]]
        assert len(printed) == len(labels), lever  # a row per value, the first the reference of the effect
        assert all(
            re.fullmatch(r"\d+\.\.\d+", row[-2]) and re.fullmatch(r"[+-]\d+\.\d%", row[-1]) for row in printed
        )
        assert printed[0][-1] == "+0.0%"
    assert "effects on a GPU are still to be measured (docs/performance.md)" in proc.stdout


@pytest.mark.slow
def test_under_torchrun_every_rank_checkpoints_into_one_folder_rank_0_made(tmp_path):
    """Two processes: the ranks save into one folder (rank 0's, broadcast), not one each, so the asynchronous
    checkpoint lever runs to its row and every temporary folder is removed."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc-per-node=2",
         "-m", "training.measure.benchmark", "--batch-sizes", "1", "--steps", "10", "--warmup", "3", "--repeats",
         "1", "--lever-repeats", "1", "--levers", "async_checkpoint"],
        env={**env(), "TMPDIR": str(scratch)}, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "world size 2" in proc.stdout
    printed = [line.split() for line in proc.stdout.splitlines() if line.split()[:1] == ["async_checkpoint"]]
    assert len(printed) == 2 and printed[0][-1] == "+0.0%", proc.stdout
    # each run's folder is removed (torch keeps caches of its own there)
    assert list(scratch.glob("benchmark-*")) == []


@pytest.mark.parametrize(
    ("lever", "values"), benchmark.LEVER_CASES, ids=[name for name, _ in benchmark.LEVER_CASES]
)
def test_every_lever_case_is_a_valid_trainer_configuration(lever, values):
    """What ``make bench`` measures but this suite does not run: each value's settings pass the contract."""
    args = benchmark.parse_args([])
    for _, overrides in values:
        cfg = benchmark.make_config(args, "fp32", 1, False, "/unused", **overrides)
        assert all(str(getattr(cfg, key)).lower() == value for key, value in overrides.items())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_external_baseline_has_the_runs_architecture_so_its_flops_are_the_counted_ones(tied):
    """Grouped-query attention and tying change the parameters (and so the FLOPs the benchmark counts for the
    external loop as for ours): its model must have them too."""
    settings = settings_parse.parse_hyperparameters(
        {"model_preset": "custom", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
         "ffn_hidden_size": 128, "vocab_size": 256, "tie_embeddings": tied, "rms_norm_eps": 1e-6}
    )  # fmt: skip
    with torch.device("meta"):
        net = external_baseline.build(settings, seq=16)
    assert external_baseline.parameter_count(net) == settings_parse.model_shape(settings).parameter_count()
    assert tuple(net.layers[0].attention.wk.weight.shape) == (2 * 16, 64)
    assert (net.output.weight is net.tok_embeddings.weight) is tied and net.norm.eps == 1e-6
    for preset in ("llama3.2-1b", "llama3.1-8b"):
        values = settings_parse.parse_hyperparameters({"model_preset": preset})
        with torch.device("meta"):
            llama = external_baseline.build(values, seq=16)
        assert external_baseline.parameter_count(llama) == shapes.MODEL_PRESETS[preset].parameter_count()


def test_the_external_loop_trains_a_grouped_query_tied_model(process_group):
    cfg = config.config_from_mapping({**TINY, "num_kv_heads": "2", "tie_embeddings": "true", "seq_length": "16",
                                      "batch_size": "2", "max_steps": "3", "throughput_warmup_steps": "1"})  # fmt: skip
    result = benchmark.external_loop(cfg, process_group)
    assert result["tokens_per_sec"] > 0
    # the FLOPs counted for it are the GQA, tied model's
    assert result["tflops_per_gpu"] == pytest.approx(
        result["tokens_per_sec"] * shapes.flops_per_token(cfg.shape, 16) / 1e12, rel=1e-3
    )
