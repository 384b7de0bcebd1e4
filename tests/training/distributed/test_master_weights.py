"""MasterWeightAdamW (quantized_model_init's optimizer): the masters follow fp32 AdamW exactly, keep the updates a
low-precision weight rounds away, and survive a state-dict round trip (plain and through DCP with FSDP2) in fp32.
bf16 weights stand in for TE's FP8 ones here (TE cannot run on these machines); both are written back by copy_."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

from training.trainer.distributed import levers, master_weights, parallel

KW = {"lr": 1e-3, "betas": (0.9, 0.95), "weight_decay": 0.1, "foreach": True}


def grads(shape: tuple[int, ...], steps: int) -> list[torch.Tensor]:
    """Gradients a bf16 tensor holds exactly, so both optimizers see the same numbers."""
    gen = torch.Generator().manual_seed(3)
    return [torch.randn(shape, generator=gen).bfloat16().float() for _ in range(steps)]


def test_the_masters_follow_fp32_adamw_exactly_and_the_weight_is_their_rounding():
    start = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).bfloat16().float()
    reference = torch.nn.Parameter(start.clone())
    low = torch.nn.Parameter(start.bfloat16())
    fp32_adamw = torch.optim.AdamW([reference], **KW)
    ours = master_weights.MasterWeightAdamW([low], **KW)
    for grad in grads(start.shape, 5):
        reference.grad, low.grad = grad.clone(), grad.bfloat16()
        fp32_adamw.step()
        ours.step()
    master = ours.state[low][master_weights.MASTER]
    assert master.dtype == torch.float32 and torch.equal(master, reference.detach())
    assert torch.equal(low.detach(), reference.detach().bfloat16())
    assert low.grad is not None and master.grad is None  # the model's gradient is left for zero_grad


def test_updates_a_bf16_weight_rounds_away_accumulate_in_the_masters():
    start = torch.full((256,), 1.0)
    plain, mastered = torch.nn.Parameter(start.bfloat16()), torch.nn.Parameter(start.bfloat16())
    # each step moves a weight by about lr = 1e-4, below half of bf16's spacing at 1.0 (2^-8 / 2)
    plain_adamw = torch.optim.AdamW([plain], lr=1e-4, weight_decay=0.0, foreach=True)
    ours = master_weights.MasterWeightAdamW([mastered], lr=1e-4, weight_decay=0.0, foreach=True)
    for _ in range(40):
        plain.grad, mastered.grad = (
            torch.ones(256, dtype=torch.bfloat16),
            torch.ones(256, dtype=torch.bfloat16),
        )
        plain_adamw.step()
        ours.step()
    assert torch.equal(plain.detach(), start.bfloat16())  # every update rounded away
    assert float(mastered.detach()[0]) < 1.0  # 40 updates of 1e-4 kept: the weight has moved down a step
    assert abs(float(ours.state[mastered][master_weights.MASTER][0]) - (1.0 - 40e-4)) < 1e-6


def test_a_state_dict_round_trip_keeps_masters_and_moments_in_fp32():
    weight = torch.nn.Parameter(torch.randn(16, 8).bfloat16())
    ours = master_weights.MasterWeightAdamW([weight], **KW)
    weight.grad = torch.randn(16, 8).bfloat16()
    ours.step()
    saved = {k: v for k, v in ours.state_dict().items()}
    again = master_weights.MasterWeightAdamW([weight], **KW)
    again.load_state_dict(saved)
    state = again.state[weight]
    assert {state[k].dtype for k in ("exp_avg", "exp_avg_sq", master_weights.MASTER)} == {torch.float32}
    assert torch.equal(state[master_weights.MASTER], ours.state[weight][master_weights.MASTER])
    # torch's AdamW would have cast them to the parameter's dtype
    plain = torch.optim.AdamW([weight], **KW)
    plain.load_state_dict(saved)
    assert plain.state[weight]["exp_avg"].dtype == torch.bfloat16


def test_dcp_state_dicts_carry_the_sharded_masters_by_parameter_name(monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", str(parallel._free_port()))
    env = parallel.init_distributed()
    try:
        net = torch.nn.Sequential(torch.nn.Linear(8, 8).bfloat16(), torch.nn.Linear(8, 4))  # fp32: no master
        for layer in net:
            fully_shard(layer, mesh=env.mesh)
        optimizer = levers.build_optimizer(net.parameters(), "foreach", 1e-3, 0.1, master_weights=True)
        net[1](net[0](torch.randn(2, 8).bfloat16()).float()).sum().backward()
        optimizer.step()
        _, optim_sd = get_state_dict(net, optimizer)
        assert optim_sd["state"]["0.weight"][master_weights.MASTER].dtype == torch.float32
        assert master_weights.MASTER not in optim_sd["state"]["1.weight"]
        expected = optim_sd["state"]["0.weight"][master_weights.MASTER].full_tensor().clone()
        fresh = levers.build_optimizer(net.parameters(), "foreach", 1e-3, 0.1, master_weights=True)
        set_state_dict(
            net, fresh, model_state_dict=get_state_dict(net, optimizer)[0], optim_state_dict=optim_sd
        )
        loaded = fresh.state[net[0].weight]
        assert loaded[master_weights.MASTER].dtype == loaded["exp_avg"].dtype == torch.float32
        assert torch.equal(loaded[master_weights.MASTER].full_tensor(), expected)
    finally:
        dist.destroy_process_group()


def test_a_kept_value_before_quantization_starts_the_master_and_a_loaded_state_replaces_it():
    exact = torch.randn(16, 8, generator=torch.Generator().manual_seed(5))
    weight = torch.nn.Parameter(exact.to(torch.float8_e4m3fn).bfloat16())  # the FP8 rounding, as TE stores it
    master_weights.keep_initial_value(weight, exact)
    plain = torch.nn.Parameter(exact.clone())
    master_weights.keep_initial_value(plain, exact)  # an fp32 parameter needs no master: nothing kept
    assert not hasattr(plain, master_weights.INITIAL)
    ours = master_weights.MasterWeightAdamW([weight], **{**KW, "lr": 0.0, "weight_decay": 0.0})
    weight.grad = torch.zeros(16, 8, dtype=torch.bfloat16)
    ours.step()
    assert torch.equal(ours.state[weight][master_weights.MASTER], exact)
    assert not torch.equal(weight.detach().float(), exact) and not hasattr(weight, master_weights.INITIAL)
    saved = ours.state_dict()
    master_weights.keep_initial_value(weight, torch.zeros(16, 8))
    resumed = master_weights.MasterWeightAdamW([weight], **KW)
    resumed.load_state_dict(saved)  # a checkpoint's masters win; the kept value is dropped, not leaked
    assert not hasattr(weight, master_weights.INITIAL)
    assert torch.equal(resumed.state[weight][master_weights.MASTER], exact)
