"""parallel.shard_model: meta-device model -> FSDP2 shards; Transformer Engine modules are left on meta, with the
attributes TE keeps on its parameters carried over, for ``weights.initialize`` (their own ``reset_parameters``)."""

from __future__ import annotations

import torch

from tests.training.checkpoint.test_weights import CPU, fake_rank, te_model
from training.trainer.checkpoint import weights
from training.trainer.distributed import parallel


def test_shard_model_leaves_te_modules_on_meta_with_their_attributes_and_materializes_the_rest():
    with fake_rank(0, 2) as mesh:
        net = te_model()
        net.layers[0].self_attention.proj.weight.te_marker = "tensor-parallel-attrs"
        parallel.shard_model(net, mesh, parallel.mixed_precision(torch.float32), CPU)
        assert net.layers[0].self_attention.proj.weight.te_marker == "tensor-parallel-attrs"
        assert net.layers[0].self_attention.proj.weight.is_meta and not net.embed.weight.is_meta
        weights.initialize(net, seed=1)
        assert not any(p.is_meta for p in net.parameters())
