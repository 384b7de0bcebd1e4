"""The FSDP2 step memory tracer (training.measure.memory_trace): exact parameter/optimizer bytes, what the
CUDA stand-ins save, and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from training.contract import settings_parse, settings_table
from training.measure import memory_trace

TINY = {"model_preset": "custom", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 128,
        "vocab_size": 256, "seq_length": 32, "batch_size": 2, "precision": "bf16"}  # fmt: skip
WORLD = 4


def _param_shapes(settings: dict) -> list[tuple[int, ...]]:
    values = settings_parse.parse_hyperparameters(settings)
    h, f, v, layers = (values[k] for k in ("hidden_size", "ffn_hidden_size", "vocab_size", "num_layers"))
    block = [(h,), (3 * h, h), (h, h), (h,), (2 * f, h), (h, f)]
    return [(v, h)] + block * layers + [(h,), (v, h)]


def test_sharded_parameters_and_adamw_state_are_exact():
    result = memory_trace.trace_step(TINY, world_size=WORLD)
    shard_bytes = sum(4 * math.ceil(s[0] / WORLD) * math.prod(s[1:]) for s in _param_shapes(TINY))
    parts = {k: round(v * memory_trace.GIB) for k, v in result["parts_gib"].items()}
    assert parts["sharded_parameters"] == shard_bytes
    # exp_avg and exp_avg_sq per parameter shard (fp32), plus one fp32 step counter per parameter.
    assert parts["optimizer_state"] == 2 * shard_bytes + 4 * len(_param_shapes(TINY))
    assert result["peak_gib"] == pytest.approx(sum(result["parts_gib"].values()))
    assert result["world_size"] == WORLD and result["settings"]["batch_size"] == 2


def test_activation_checkpointing_and_batch_move_the_peak():
    plain = memory_trace.trace_step(TINY, world_size=WORLD)["parts_gib"]
    checkpointed = memory_trace.trace_step({**TINY, "activation_checkpointing": True}, world_size=WORLD)
    bigger = memory_trace.trace_step({**TINY, "batch_size": 16}, world_size=WORLD)["parts_gib"]
    assert checkpointed["parts_gib"]["activations"] < plain["activations"]
    assert bigger["activations"] > 3 * plain["activations"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_stand_in_matches_rms_norm(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    weight = (1 + 0.1 * torch.randn(16)).to(dtype).requires_grad_()
    out = memory_trace.FusedRMSNormStandIn.apply(x, weight, 1e-5)
    # Saved for backward: the input itself (no copy) and one fp32 rstd per row, like CUDA's kernel.
    saved_x, _, rstd = out.grad_fn.saved_tensors
    assert saved_x.data_ptr() == x.data_ptr() and rstd.shape == (3, 5, 1) and rstd.dtype == torch.float32
    ref_x, ref_w = x.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    ref = F.rms_norm(ref_x, (16,), ref_w, 1e-5)
    grad = torch.randn_like(ref)
    out.backward(grad.to(dtype))
    ref.backward(grad)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(x.grad.float(), ref_x.grad, **tol)
    torch.testing.assert_close(weight.grad.float(), ref_w.grad, **{k: 5 * v for k, v in tol.items()})


def test_te_precisions_and_bad_settings_are_refused_before_tracing():
    with pytest.raises(
        settings_table.ContractError, match="precision: mxfp8 runs through Transformer Engine"
    ):
        memory_trace.trace_step({**TINY, "precision": "mxfp8"}, world_size=WORLD)
    with pytest.raises(settings_table.ContractError, match="batch_size"):
        memory_trace.trace_step({**TINY, "batch_size": 0}, world_size=WORLD)
    with pytest.raises(settings_table.ContractError, match="world_size: must be an integer"):
        memory_trace.trace_step(TINY, world_size=0)


def test_cli_prints_json(capsys):
    argv = ["--preset", "custom", "--layers", "2", "--vocab", "256", "--seq", "32", "--batch", "2",
            "--world", "2", "--json"]  # fmt: skip
    # custom needs every dim: the CLI passes only layers/vocab, so the contract names the first missing one.
    assert memory_trace.main(argv) == 2
    assert "hidden_size: must be set when model_preset=custom" in capsys.readouterr().err
    assert (
        memory_trace.main(["--preset", "1b", "--layers", "1", "--seq", "64", "--world", "8", "--json"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["settings"]["num_layers"] == 1 and result["peak_gib"] > 0
    assert set(result["parts_gib"]) == set(memory_trace.PARTS.values())


def test_a_requests_bf16_twin_is_traced_when_its_precision_needs_a_gpu(capsys, tmp_path):
    """docs/plan.md traces the README's mxfp8 run.json: refused as it is (Transformer Engine needs a GPU), with
    what to do; --precision bf16 traces its twin."""
    request = tmp_path / "run.json"
    request.write_text(json.dumps({"precision": "mxfp8", "batch_size": 1, "seq_length": 64,
                                   "hyperparameters": {"model_preset": "1b", "num_layers": "1"}}))  # fmt: skip
    assert memory_trace.main(["--request", str(request), "--json"]) == 2
    assert "--precision bf16 traces a request's bf16 twin" in capsys.readouterr().err
    assert memory_trace.main(["--request", str(request), "--precision", "bf16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["settings"]["precision"] == "bf16" and result["settings"]["num_layers"] == 1
