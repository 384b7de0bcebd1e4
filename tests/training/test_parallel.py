"""parallel.shard_model: meta-device model -> FSDP2 shards, TE modules initialized by their own reset_parameters."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from training.request.contract import ModelShape
from training.trainer import model, parallel

SHAPE = ModelShape(num_layers=2, hidden_size=16, num_heads=2, ffn_hidden_size=32, vocab_size=64)


class FakeTELinear(nn.Module):
    """Stands in for a Transformer Engine module: has ``param_init_meta`` and a DTensor-aware
    ``reset_parameters`` that replaces the (meta) parameter by an initialized local shard, as TE 2.11 does."""

    def __init__(self) -> None:
        super().__init__()
        self.param_init_meta = {"weight": None}
        self.weight = nn.Parameter(torch.empty(SHAPE.hidden_size, SHAPE.hidden_size))
        self.weight.te_marker = "tensor-parallel-attrs"
        self.resets: list[str | None] = []

    def reset_parameters(self) -> None:
        param = self.weight
        self.resets.append(getattr(param, "te_marker", None))
        assert isinstance(param, DTensor)
        local = torch.full(param.to_local().shape, 7.0)
        self.weight = nn.Parameter(
            DTensor.from_local(
                local, param.device_mesh, param.placements, shape=param.size(), stride=param.stride()
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def test_te_modules_initialize_themselves_and_the_rest_is_materialized(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(parallel._free_port()))
    env = parallel.init_distributed()
    try:
        with torch.device("meta"):
            net = model.Transformer(SHAPE, [FakeTELinear() for _ in range(SHAPE.num_layers)])
        parallel.shard_model(net, env.mesh, parallel.mixed_precision(torch.float32), env.device)

        assert not any(p.is_meta for p in net.parameters())
        for layer in net.layers:
            # reset once, after fully_shard, with TE's parameter attributes carried over to the DTensor
            assert layer.resets == ["tensor-parallel-attrs"]
            assert torch.equal(layer.weight.full_tensor(), torch.full((SHAPE.hidden_size,) * 2, 7.0))
        model.init_weights(net, seed=3)  # fills embedding, norm and head; leaves the TE layers alone
        assert torch.equal(net.layers[0].weight.full_tensor(), torch.full((SHAPE.hidden_size,) * 2, 7.0))
        assert net.embed.weight.full_tensor().std() > 0
        assert torch.equal(net.norm.weight.full_tensor(), torch.ones(SHAPE.hidden_size))
    finally:
        dist.destroy_process_group()
