"""Model, data, checkpoint-folder and metrics units (single process, no torchrun)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.training.llama import llama
from training.contract import hardware, metric_lines, settings_table, shapes
from training.trainer import loop, optimizer_step
from training.trainer.checkpoint import folder, model_file, names, weights
from training.trainer.data import token_files
from training.trainer.model import decoder
from training.trainer.observe import metrics

DIMS = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 128, "vocab_size": 256}
SHAPE = llama(**DIMS)


def tiny_model() -> decoder.Transformer:
    net = decoder.build_model(
        SHAPE,
        use_te=False,
        te_params_dtype=torch.float32,
    )
    net.to_empty(device="cpu")
    weights.initialize(net, seed=1)
    return net


def test_torch_model_matches_the_contract_parameter_count():
    counted = sum(p.numel() for p in tiny_model().parameters())
    assert counted == SHAPE.parameter_count() == shapes.ModelShape(**DIMS).parameter_count()


def test_the_torch_model_is_built_on_the_meta_device_blocks_included():
    """Nothing of a 70B model is allocated or initialized in host memory before FSDP2 shards it (weights.py then
    gives every parameter its value); the model has no buffers to fill either."""
    net = decoder.build_model(SHAPE, use_te=False, te_params_dtype=torch.float32)
    assert all(p.is_meta for p in net.parameters()) and not list(net.buffers())


@pytest.mark.parametrize("tied", [False, True])
def test_grouped_query_attention_and_tied_models_match_the_contract_parameter_count(tied):
    shape = llama(2, 64, 4, 128, 256, num_kv_heads=2, tie_embeddings=tied)
    net = decoder.build_model(shape, use_te=False, te_params_dtype=torch.float32)
    contract = shapes.ModelShape(2, 64, 4, 128, 256, num_kv_heads=2, tie_embeddings=tied)
    assert sum(p.numel() for p in net.parameters()) == shape.parameter_count() == contract.parameter_count()
    assert ("head.weight" in dict(net.named_parameters())) is not tied


def test_init_is_seeded_and_loss_starts_near_log_vocab():
    a, b = tiny_model(), tiny_model()
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    tokens, targets = token_files.SyntheticTokens(256, 32, 4, seed=0, rank=0, world_size=1).next_batch()
    assert abs(a(tokens, targets).item() - np.log(256)) < 0.5


def test_attention_is_causal():
    net = tiny_model()
    block = net.layers[0]
    x = torch.randn(1, 8, 64)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 64)
    torch.testing.assert_close(block(x)[:, :5], block(y)[:, :5])


def test_a_steps_batch_goes_to_a_gpu_pinned_and_without_blocking_and_to_a_cpu_as_it_is(monkeypatch):
    dataset = token_files.SyntheticTokens(256, 16, 4, seed=7, rank=0, world_size=1)
    tokens, targets = token_files.SyntheticTokens(256, 16, 4, seed=7, rank=0, world_size=1).next_batch()
    micro, shares = optimizer_step._micro_batches(
        dataset, 2, torch.device("cpu")
    )  # never pinned: a CPU-only torch refuses
    assert shares == [0.5, 0.5] and len(micro) == 2
    for (x, y, documents), x_expected, y_expected in zip(
        micro, tokens.chunk(2), targets.chunk(2), strict=True
    ):
        assert torch.equal(x, x_expected) and torch.equal(y, y_expected) and documents is None
    assert not token_files.pins(torch.device("cpu")) and token_files.pins(torch.device("cuda", 3))
    # a GPU's path, recorded (none here): into pinned host memory, then one copy that does not block the host
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin_memory") or self.clone())
    monkeypatch.setattr(
        torch.Tensor, "to", lambda self, *args, **kwargs: calls.append((args, kwargs)) or self
    )
    on_gpu = token_files.to_device(tokens, targets, torch.device("cuda", 3))
    assert torch.equal(on_gpu[0], tokens) and torch.equal(on_gpu[1], targets)
    assert calls == ["pin_memory", ((torch.device("cuda", 3),), {"non_blocking": True})]


def test_synthetic_data_is_learnable_deterministic_and_resumable():
    ds = token_files.SyntheticTokens(256, 16, 3, seed=7, rank=1, world_size=2)
    first = [ds.next_batch() for _ in range(3)]
    tokens, targets = first[0]
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    successor = {int(a): int(b) for a, b in zip(tokens.flatten(), targets.flatten(), strict=True)}
    for a, b in zip(first[1][0].flatten(), first[1][1].flatten(), strict=True):
        assert successor.get(int(a), int(b)) == int(b)  # one fixed next token per token
    other_rank = token_files.SyntheticTokens(256, 16, 3, seed=7, rank=0, world_size=2).next_batch()[0]
    assert not torch.equal(other_rank, tokens)
    resumed = token_files.SyntheticTokens(256, 16, 3, seed=7, rank=1, world_size=2)
    resumed.load_state_dict({"position": 2})
    assert torch.equal(resumed.next_batch()[0], first[2][0])


def write_token_files(directory) -> None:
    """Two files of distinct, consecutive token ids, with a jump between the files (ids < 2000)."""
    np.arange(600, dtype=np.uint32).tofile(directory / "a.bin")
    np.save(directory / "b.npy", np.arange(1000, 1400, dtype=np.uint64))  # .npy: its own unsigned dtype


def test_token_files_are_sharded_across_ranks_and_resumable(tmp_path):
    write_token_files(tmp_path)
    ranks = [token_files.TokenFiles(str(tmp_path), "uint32", 2000, 9, 2, 5, r, 2) for r in range(2)]
    windows = [tuple(row.tolist()) for _ in range(2) for ds in ranks for row in ds.next_batch()[0]]
    assert len(set(windows)) == len(windows) == 8  # 2 steps x 2 ranks x batch 2, all different windows
    for window in windows:
        assert all(b - a == 1 for a, b in zip(window, window[1:], strict=False))  # never across files
    resumed = token_files.TokenFiles(str(tmp_path), "uint32", 2000, 9, 2, 5, 1, 2)
    resumed.load_state_dict(ranks[1].state_dict())  # position 2
    assert torch.equal(resumed.next_batch()[0], ranks[1].next_batch()[0])


def test_token_files_errors_name_the_setting(tmp_path):
    with pytest.raises(settings_table.ContractError) as err:
        token_files.TokenFiles(str(tmp_path), "uint16", 300, 9, 2, 5, 0, 2)
    assert err.value.field == "dataset"
    write_token_files(tmp_path)
    with pytest.raises(settings_table.ContractError) as err:
        token_files.TokenFiles(str(tmp_path), "uint32", 10, 9, 2, 5, 0, 2).next_batch()
    assert err.value.field == "vocab_size"


def test_channel_dir_comes_from_sm_channel_train(monkeypatch):
    monkeypatch.delenv("SM_CHANNEL_TRAIN", raising=False)
    with pytest.raises(settings_table.ContractError, match="SM_CHANNEL_TRAIN"):
        token_files.channel_dir()
    monkeypatch.setenv("SM_CHANNEL_TRAIN", "/data/train")
    assert token_files.channel_dir() == "/data/train"


def fake_checkpoint(root, name: str, complete: bool = True):
    path = root / name
    path.mkdir(parents=True)
    (path / "shard").write_bytes(b"x" * 10)
    if complete:
        (path / names.MARKER).write_text(json.dumps({"world_size": 1, "files": {"shard": 10}}))
    return path


def test_only_complete_checkpoints_count(tmp_path):
    fake_checkpoint(tmp_path, "step_00000002")
    fake_checkpoint(tmp_path, "step_00000004.tmp")
    fake_checkpoint(tmp_path, "step_00000006", complete=False)
    truncated = fake_checkpoint(tmp_path, "step_00000008")
    (truncated / "shard").write_bytes(b"x")
    fake_checkpoint(tmp_path, "notes")
    assert [step for step, _ in folder.complete_checkpoints(tmp_path)] == [2]
    assert folder.complete_checkpoints(tmp_path / "missing") == []


def test_flops_formula():
    n = SHAPE.parameter_count() - 256 * 64
    assert shapes.flops_per_token(SHAPE, 32) == 6 * n + 12 * 2 * 64 * 32


def test_throughput_leaves_out_warmup_and_has_no_mfu_on_cpu():
    meter = metrics.Throughput(SHAPE, 32, 128, warmup_steps=2, device=torch.device("cpu"), precision="fp32")
    meter.start()
    meter.step_done()
    assert meter.interval() == {}
    for _ in range(3):
        meter.step_done()
    rates = meter.interval()
    assert meter.measured_steps == 2 and "mfu" not in rates and rates["tokens_per_sec"] > 0
    assert rates["tflops_per_gpu"] == pytest.approx(rates["tokens_per_sec"] * meter.flops_per_token / 1e12)
    assert metrics.peak_memory_gb(torch.device("cpu")) > 0


@pytest.mark.parametrize(
    ("gpu", "prec", "own_peak"),
    [("H100", "fp8", 1979.0), ("B200", "mxfp8", 4500.0), ("B200", "nvfp4", 9000.0)],
)
def test_low_precision_runs_also_report_a_bf16_equivalent_mfu(monkeypatch, gpu, prec, own_peak):
    monkeypatch.setattr(metrics, "gpu_name", lambda device: gpu)  # as torch.cuda names that GPU
    low = metrics.Throughput(SHAPE, 32, 128, 0, torch.device("cpu"), prec).rates(10**9, 1.0)
    tflops = low["tflops_per_gpu"]
    assert low["mfu"] == pytest.approx(tflops / own_peak)
    assert low["mfu_bf16"] == pytest.approx(tflops / hardware.PEAK_TFLOPS[gpu]["bf16"])
    step = metric_lines.format_step_line(5, low)
    assert metric_lines.parse_metric_line(step)["train:mfu_bf16"] == pytest.approx(low["mfu_bf16"], rel=1e-5)
    bf16 = metrics.Throughput(SHAPE, 32, 128, 0, torch.device("cpu"), "bf16").rates(10**9, 1.0)
    assert "mfu_bf16" not in bf16 and bf16["mfu"] == pytest.approx(tflops / hardware.PEAK_TFLOPS[gpu]["bf16"])


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    factors = [loop.lr_factor(s, 4, 20) for s in range(25)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(factors[3:], factors[4:], strict=False))
    assert factors[20] == pytest.approx(loop.MIN_LR_RATIO) and factors[24] == pytest.approx(loop.MIN_LR_RATIO)


def test_save_model_never_overwrites(tmp_path):
    net = tiny_model()
    first = model_file.save_model(net, str(tmp_path), step=5, config={"num_layers": 2}, rank=0)
    assert first == tmp_path / "model.pt"
    before = first.read_bytes()
    second = model_file.save_model(net, str(tmp_path), step=9, config={"num_layers": 2}, rank=0)
    assert second == tmp_path / "model_step_00000009.pt"
    assert first.read_bytes() == before
    saved = torch.load(second, weights_only=False)
    assert saved["step"] == 9 and saved["state_dict"].keys() == net.state_dict().keys()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "model_step_00000009.pt"]


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA B300 SXM6 AC", "B300"),
        ("NVIDIA L4", None),
    ],
)
def test_gpu_name_takes_the_longest_matching_peak_table_key(monkeypatch, device_name, key):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: device_name)
    assert metrics.gpu_name(torch.device("cuda", 0)) == key


def test_a_run_as_short_as_its_warmup_reports_throughput_over_all_its_steps():
    meter = metrics.Throughput(SHAPE, 16, 64, 3, torch.device("cpu"), "fp32")
    assert meter.summary() == {}  # nothing trained: no figures rather than zeros
    meter.start()
    for _ in range(2):
        meter.step_done()
    assert meter.summary()["tokens_per_sec"] > 0 and meter.total_seconds() > 0


def test_empty_token_files_are_skipped(tmp_path):
    write_token_files(tmp_path)
    (tmp_path / "empty.bin").write_bytes(b"")
    dataset = token_files.TokenFiles(str(tmp_path), "uint32", 2000, 9, 2, 5, 0, 2)
    assert len(dataset.arrays) == 2
    with pytest.raises(settings_table.ContractError, match="no non-empty"):
        token_files.TokenFiles([tmp_path / "empty.bin"], "uint32", 2000, 9, 2, 5, 0, 2)
