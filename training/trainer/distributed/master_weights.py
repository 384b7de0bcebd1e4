"""AdamW over fp32 master weights, for quantized primary weights (``quantized_model_init``).

With ``quantized_model_init`` Transformer Engine keeps the blocks' weights only in FP8 or MXFP8. An optimizer that
updates them in place rounds away every update smaller than half a step of the format (E4M3 has 3 mantissa bits:
updates below about 6% of a weight are lost), so training stalls. Megatron keeps fp32 "main" parameters for this;
so does this module.

TE 2.11's own ``FusedAdam(master_weights=True)`` cannot be used with FSDP2: at tag v2.11 its states are plain
tensors of the parameter's global shape (``optimizers/fused_adam.py`` ``_initialize_state``:
``torch.empty(param.shape, ...)``) while FSDP2's parameters and gradients are DTensor shards, and its step handles
only ``Float8Tensor`` among the quantized weights (MXFP8 primary weights came in TE 2.14, #2753; DTensor states in
TE 2.15, #2795).

``MasterWeightAdamW`` is torch's AdamW run on an fp32 copy of every parameter that is not already a plain fp32
tensor (a DTensor with the parameter's placements, so it is sharded as the parameter is). Each step casts the
gradient to fp32 onto the master, steps the masters (AdamW's foreach or fused kernels), and copies each master back
into its parameter: a ``QuantizedTensor``'s ``copy_`` quantizes (``quantized_tensor.py`` ``__torch_dispatch__`` at
v2.11), a bf16 one rounds. They are part of the optimizer's state dict (``master``), so a DCP checkpoint saves and
restores them, and ``load_state_dict`` keeps them and the moments in fp32 (torch's would cast every state to its
parameter's dtype).

The masters start from the parameters' values BEFORE quantization: ``weights.initialize`` hands each quantized
parameter its fp32 shard (``keep_initial_value``), and the first step makes the master from it (and drops it). From
the quantized weight itself, every imported or generated value would be rounded to FP8 before its master existed.
TE's own way, ``quantized_model_init(preserve_high_precision_init_val=True)``, cannot serve under FSDP2 at v2.11:
``module/base.py`` ``reset_parameters`` attaches ``_high_precision_init_val`` to the local tensor it quantized, but
the DTensor it builds holds ``DTensor.from_local``'s fresh view of it (``view_as``), which has no such attribute
(fixed in TE 2.15, #2785); and it would keep a second, bf16 copy in host memory. The fp32 shard kept here is on the
parameter's device and becomes the master itself: no memory beyond the masters the plan counts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

MASTER = "master"
INITIAL = "_initial_master_value"
"""The attribute of a parameter holding its fp32 local value before quantization, until its master is made."""


def needs_master(param: torch.Tensor) -> bool:
    """Whether ``param`` is stored in anything but a plain fp32 tensor (a quantized or 16-bit weight)."""
    local = param._local_tensor if isinstance(param, DTensor) else param
    return local.dtype != torch.float32 or type(local) not in (torch.Tensor, torch.nn.Parameter)


def keep_initial_value(param: torch.Tensor, local_value: torch.Tensor) -> None:
    """Keep ``local_value`` (this rank's fp32 shard of ``param``'s value, made before ``param`` was quantized or
    rounded) as the start of its master; nothing for a parameter that needs no master."""
    if needs_master(param):
        # a copy: the value may be a view of the parameter's full tensor (weights.local_rows)
        setattr(param, INITIAL, local_value.detach().to(torch.float32, copy=True))


def _initial_master(param: torch.Tensor) -> torch.Tensor:
    """A new master: the kept fp32 value before quantization (as a DTensor of the parameter's placements), or,
    without one, the parameter's own (dequantized) value."""
    value = getattr(param, INITIAL, None)
    if value is None:
        return param.detach().to(torch.float32, copy=True)
    delattr(param, INITIAL)
    if isinstance(param, DTensor):
        return DTensor.from_local(
            value, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
        )
    return value


class MasterWeightAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose arithmetic runs on fp32 master copies of the parameters (module docstring).

    Outside ``step`` and ``load_state_dict`` the parameter groups hold the model's parameters and the state is keyed
    by them (what DCP's ``get_state_dict`` maps to parameter names); inside, each parameter is swapped for its
    master, so AdamW itself never touches a quantized tensor."""

    def _swap_in(self, stand_in: Any) -> list[tuple[list, int, torch.Tensor, torch.Tensor]]:
        """Put ``stand_in(param)`` in place of every parameter that needs a master, moving its state along."""
        swapped = []
        for group in self.param_groups:
            params = group["params"]
            for index, param in enumerate(params):
                if not needs_master(param):
                    continue
                other = stand_in(param)
                state = self.state.pop(param, None)
                if state:
                    self.state[other] = state
                params[index] = other
                swapped.append((params, index, param, other))
        return swapped

    def _swap_out(self, swapped: list[tuple[list, int, torch.Tensor, torch.Tensor]]) -> None:
        for params, index, param, other in swapped:
            params[index] = param
            state = self.state.pop(other, None)
            if state is not None:
                self.state[param] = state

    def _master(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter's master (created at the first step), with the fp32 gradient on it."""
        state = self.state.get(param, {})
        master = state.pop(MASTER, None)
        if master is None:
            master = _initial_master(param)
        master.grad = None if param.grad is None else param.grad.detach().to(torch.float32)
        return master

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        swapped = self._swap_in(self._master)
        try:
            loss = super().step(closure)
        finally:
            self._swap_out(swapped)
        with torch.no_grad():
            for _, _, param, master in swapped:
                master.grad = None
                param.copy_(master)  # quantizes into an FP8/MXFP8 weight, rounds into a bf16 one
                self.state[param][MASTER] = master
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's, against fp32 stand-ins of the parameters that have masters, so nothing is cast down. The
        loaded masters replace any kept initial value."""
        for group in self.param_groups:
            for param in group["params"]:
                if hasattr(param, INITIAL):
                    delattr(param, INITIAL)
        swapped = self._swap_in(lambda param: torch.empty(0, dtype=torch.float32, device=param.device))
        try:
            super().load_state_dict(state_dict)
        finally:
            self._swap_out(swapped)
