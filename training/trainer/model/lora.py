"""LoRA (``lora_rank`` > 0): low-rank adapters on the frozen base model's linear layers, trained alone.

Each targeted projection ``W`` (``q_proj`` ... ``down_proj``, ``settings_table.LORA_TARGETS``) gets two matrices,
``A`` (``rank x in``) and ``B`` (``out x rank``), and computes ``W x + (alpha / rank) B A dropout(x)``, as peft's
``LoraLayer`` does. The torch block fuses projections (``qkv`` = ``[q; k; v]``, ``gate_up`` = ``[gate; up]``,
``layout``), so a fused linear layer keeps one adapter pair per projection it holds, and its output is the
base output plus each projection's delta in its own rows (zeros for a projection that is not targeted): the
adapters map one to one onto peft's ``base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight`` and so
on (``peft_key``), which is what ``export_peft`` writes and vLLM and peft load.

How it is wired, in torchtune's order (``recipes/lora_finetune_distributed.py``): ``apply`` swaps the blocks'
linear layers for ``LoRALinear`` on the meta-device model, before activation checkpointing, ``torch.compile`` and
FSDP2 (the block's ``forward`` and the attention code are untouched: ``LoRALinear`` is an ``nn.Linear`` whose
``weight`` keeps its name, so the import, the export and the batch format see the same model), and freezes every
parameter that is not an adapter; FSDP2 shards each block with its frozen and trainable parameters together
(gradients are reduced for the adapters only); ``weights.initialize`` gives the base its values (``init_from`` or
seeded) and ``initialize`` gives the adapters theirs after sharding: ``A`` peft's default (Kaiming-uniform, bound
1/sqrt(in)) drawn in full from a generator seeded by (seed, the adapter's peft name), this rank keeping its rows,
so the start does not depend on the world size; ``B`` zeros (the model starts as the base model).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from training.contract import checkpoint_identity, settings_checks, settings_table
from training.models.config import ModelConfig
from training.trainer.checkpoint import weights

PEFT_PREFIX = "base_model.model."
"""peft's ``PeftModelForCausalLM`` prefix before the module names of the family's Hugging Face class
(``model.layers.<i>.self_attn.q_proj``, ...: the same in every family here)."""
_ADAPTER = re.compile(r"^layers\.(\d+)\.(\w+)\.lora_([ab])_(\w+)$")
"""Our adapter parameter names: ``layers.<i>.<linear>.lora_a_<projection>`` (and ``lora_b_``)."""
_MODULE_OF = {module.rsplit(".", 1)[1]: module for module in settings_table.LORA_TARGETS.values()}
"""``q_proj`` -> ``self_attn.q_proj``, ..., ``down_proj`` -> ``mlp.down_proj``."""


@dataclass(frozen=True)
class LoraSettings:
    """The run's LoRA settings: rank, alpha (the contract fills its default, 2 x rank), dropout, and the targeted
    projections (``q_proj``, ..., in block order)."""

    rank: int
    alpha: float
    dropout: float
    targets: tuple[str, ...]

    @property
    def scale(self) -> float:
        """What each adapter's ``B A`` is multiplied by: ``alpha / rank`` (peft's scaling without rsLoRA)."""
        return self.alpha / self.rank

    @classmethod
    def of(cls, settings: Any) -> LoraSettings | None:
        """The LoRA settings of a ``TrainConfig`` or a saved run's config dict; None when ``lora_rank`` is 0."""
        get = settings.get if isinstance(settings, dict) else lambda name: getattr(settings, name)
        rank = int(get("lora_rank") or 0)
        if not rank:
            return None
        alpha = get("lora_alpha")
        return cls(
            rank=rank,
            alpha=float(alpha if alpha is not None else 2 * rank),
            dropout=float(get("lora_dropout") or 0.0),
            targets=settings_checks.lora_target_modules(
                get("lora_targets") or settings_table.LORA_ALL_LINEAR
            ),
        )


class LoRALinear(nn.Linear):
    """An ``nn.Linear`` (its ``weight``, and ``bias`` when the base has one, e.g. Qwen 2's query/key/value bias: the
    frozen base) with an adapter pair per targeted projection of the rows it holds: ``parts`` is ``(projection,
    rows)`` in row order (``layout``'s fusion). ``enabled`` False (``adapters_off``): the base layer alone."""

    enabled: bool = True

    def __init__(
        self,
        in_features: int,
        out_features: int,
        parts: tuple[tuple[str, int], ...],
        settings: LoraSettings,
        device: torch.device | str | None = None,
        bias: bool = False,
    ):
        super().__init__(in_features, out_features, bias=bias, device=device)
        if sum(rows for _, rows in parts) != out_features:
            raise ValueError(f"the parts' rows {parts} do not add up to out_features {out_features}")
        self.parts = parts
        self.targeted = tuple(name for name, _ in parts if name in settings.targets)
        self.scale = settings.scale
        self.lora_dropout: nn.Module = nn.Dropout(settings.dropout) if settings.dropout else nn.Identity()
        for name, rows in parts:
            if name in self.targeted:
                self.register_parameter(
                    f"lora_a_{name}", nn.Parameter(torch.empty(settings.rank, in_features, device=device))
                )
                self.register_parameter(
                    f"lora_b_{name}", nn.Parameter(torch.empty(rows, settings.rank, device=device))
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``W x`` plus every part's ``scale B A dropout(x)`` in its rows, as two small GEMMs: the targeted ``A``
        matrices stacked (``[parts x rank, in]``), then the ``B`` matrices block-diagonally (an untargeted part
        gives zero rows): one output-sized temporary, and the scale applied rank-wide, not output-wide. With
        dropout each targeted projection draws its own mask (peft's ``q_proj``, ``k_proj`` and ``v_proj`` each
        have their own dropout module), so the ``A`` products are one GEMM per projection."""
        out = F.linear(x, self.weight, self.bias)
        if not self.enabled:  # switched off (``adapters_off``): the base model's layer
            return out
        matrices = [getattr(self, f"lora_a_{name}") for name in self.targeted]
        if isinstance(self.lora_dropout, nn.Dropout):
            down = torch.cat([F.linear(self.lora_dropout(x), a) for a in matrices], dim=-1)
        else:
            down = F.linear(x, torch.cat(matrices))
        b = torch.block_diag(
            *(
                getattr(self, f"lora_b_{name}") if name in self.targeted else self.weight.new_zeros((rows, 0))
                for name, rows in self.parts
            )
        )
        return out + F.linear(down * self.scale, b)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lora={','.join(self.targeted)}, scale={self.scale:g}"


BLOCK_LINEARS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "out_proj": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}
"""The torch block's linear layers and the Hugging Face projections they hold, in row order (every family in
``training.models``: ``training.trainer.model.layout``'s fusion)."""


def rank_note(shape: ModelConfig, settings: LoraSettings) -> str | None:
    """A note when ``lora_rank`` is above what a targeted projection can use: an adapter ``B A`` of an
    ``out x in`` weight has rank at most ``min(out, in)``, so a larger rank adds parameters and memory but nothing
    to learn (above the hidden size, no projection of a block can use it). None when every targeted projection
    can."""
    dims = shape.projection_shapes()
    over = [(name, dims[name]) for name in settings.targets if settings.rank > min(dims[name])]
    if not over:
        return None
    named = " and ".join(f"{name} ({rows} x {cols})" for name, (rows, cols) in over)
    hidden = f"the hidden size {shape.hidden_size} and " if settings.rank > shape.hidden_size else ""
    them = "it" if len(over) == 1 else "them"
    return (
        f"note: lora_rank {settings.rank} is above {hidden}what {named} can use: an adapter's B A has rank at most "
        "the smaller side of its weight, so the rank beyond adds parameters and memory but nothing to learn; lower "
        f"lora_rank to {min(min(d) for _, d in over)}, or leave {them} out of lora_targets"
    )


def block_parts(shape: ModelConfig) -> dict[str, tuple[tuple[str, int], ...]]:
    """The torch block's linear layers (``qkv``, ``out_proj``, ``gate_up``, ``down``) -> their projections and
    rows (``ModelConfig.projection_shapes``)."""
    shapes_of = shape.projection_shapes()
    return {
        linear: tuple((projection, shapes_of[projection][0]) for projection in projections)
        for linear, projections in BLOCK_LINEARS.items()
    }


def apply_to_block(block: nn.Module, shape: ModelConfig, settings: LoraSettings) -> None:
    """Swap ``block``'s linear layers that hold a targeted projection for ``LoRALinear`` (same device, so on meta
    before sharding) and freeze the block's other parameters."""
    for attr, parts in block_parts(shape).items():
        base = getattr(block, attr)
        if not any(name in settings.targets for name, _ in parts):
            continue
        wrapped = LoRALinear(
            base.in_features,
            base.out_features,
            parts,
            settings,
            device=base.weight.device,
            bias=base.bias is not None,
        )
        setattr(block, attr, wrapped)
    freeze_base(block)


def apply(net: nn.Module, settings: LoraSettings) -> None:
    """Add the adapters to every torch block of the meta-device model ``net`` and freeze everything else (the
    embedding, the norms, the head: peft's default). Refuses Transformer Engine blocks (the contract refuses
    their precisions with LoRA first)."""
    for block in net.layers:
        if not hasattr(block, "qkv"):
            raise ValueError(
                "LoRA wraps the torch blocks' linear layers; this model has Transformer Engine blocks"
            )
        apply_to_block(block, net.shape, settings)
    freeze_base(net)


@contextlib.contextmanager
def adapters_off(net: nn.Module) -> Iterator[None]:
    """Within it, ``net``'s adapters are switched off: the model computes the frozen base model's outputs (peft's
    ``disable_adapter``), with no copy of any weight; preference tuning's reference model with LoRA. A compiled
    block is compiled again once for this state (Dynamo guards on the flag)."""
    layers = [module for module in net.modules() if isinstance(module, LoRALinear)]
    for layer in layers:
        layer.enabled = False
    try:
        yield
    finally:
        for layer in layers:
            layer.enabled = True


def freeze_base(module: nn.Module) -> None:
    """Only adapters train: every other parameter of ``module`` stops requiring a gradient."""
    for name, param in module.named_parameters():
        param.requires_grad_(is_adapter(name))


def is_adapter(name: str) -> bool:
    """Whether the parameter ``name`` (of the model, or of a block) is a LoRA adapter matrix."""
    return re.search(r"(^|\.)lora_[ab]_\w+$", name) is not None


def peft_key(name: str) -> str:
    """peft's tensor name of our adapter parameter ``name`` (``layers.3.qkv.lora_a_k_proj`` ->
    ``base_model.model.model.layers.3.self_attn.k_proj.lora_A.weight``)."""
    match = _ADAPTER.match(name)
    if match is None:
        raise ValueError(f"{name} is not a LoRA adapter parameter")
    layer, _, which, projection = match.groups()
    return f"{peft_module(int(layer), projection)}.lora_{which.upper()}.weight"


def peft_module(layer: int, projection: str) -> str:
    """peft's name of block ``layer``'s projection (``q_proj``...) in the family's class it wraps."""
    return f"{PEFT_PREFIX}model.layers.{layer}.{_MODULE_OF[projection]}"


def adapters(net: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """(name, parameter) of every adapter matrix of ``net``."""
    return ((name, p) for name, p in net.named_parameters() if is_adapter(name))


def initialize(net: nn.Module, seed: int) -> None:
    """Give every adapter of the sharded ``net`` its starting value: ``B`` zeros, ``A`` Kaiming-uniform with
    bound 1/sqrt(in_features) (``nn.init.kaiming_uniform_(a=sqrt(5))``, peft's default), the full matrix drawn in
    fp32 on this rank's device from a generator seeded by (``seed``, its peft name), this rank's rows kept."""
    with torch.no_grad():
        for name, param in adapters(net):
            local = param.to_local() if isinstance(param, DTensor) else param
            if _ADAPTER.match(name).group(3) == "b":  # type: ignore[union-attr]
                local.zero_()
                continue
            generator = torch.Generator(device=local.device).manual_seed(
                weights.seed_of(seed, peft_key(name))
            )
            bound = 1.0 / math.sqrt(param.shape[1])
            full = torch.empty(tuple(param.shape), device=local.device, dtype=torch.float32)
            full.uniform_(-bound, bound, generator=generator)
            local.copy_(weights.local_rows(full, param))


def counts(net: nn.Module) -> tuple[int, int]:
    """(trainable parameters, all parameters) of ``net`` (global sizes, not this rank's shards)."""
    trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in net.parameters())


# ---------------------------------------------------------------------------------------------------------------
# The trained model: adapters out of a full state dict, and merged into the base
# ---------------------------------------------------------------------------------------------------------------


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's adapter tensors (``peft_key`` names) of a full trainer state dict (``model.pt``'s)."""
    return {peft_key(name): tensor for name, tensor in state.items() if is_adapter(name)}


def merged_state(
    state: dict[str, torch.Tensor], settings: LoraSettings, shape: ModelConfig
) -> dict[str, torch.Tensor]:
    """The trainer state dict with every adapter merged into its base weight, ``W + (alpha / rank) B A`` in fp32
    per projection (rows of a fused weight with no adapter unchanged), and the adapters left out: the model a
    plain Hugging Face model of the family computes (``export_hf.to_hf_state_dict`` maps it). Every targeted projection of
    every block must have both matrices (a missing one is an error, not a silent base weight)."""
    out = {name: tensor for name, tensor in state.items() if not is_adapter(name)}
    parts_of = block_parts(shape)
    for layer in range(shape.num_layers):
        for attr, parts in parts_of.items():
            key = f"layers.{layer}.{attr}.weight"
            pieces, offset, merged = [], 0, False
            for projection, rows in parts:
                base = out[key][offset : offset + rows].float()
                offset += rows
                if projection in settings.targets:
                    a, b = (state.get(f"layers.{layer}.{attr}.lora_{w}_{projection}") for w in "ab")
                    if a is None or b is None:
                        raise ValueError(f"state_dict: layer {layer}'s {projection} has no LoRA adapter pair")
                    base = base + settings.scale * (b.float() @ a.float())
                    merged = True
                pieces.append(base)
            if merged:
                out[key] = torch.cat(pieces, dim=0)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The frozen base a LoRA checkpoint refers to
# ---------------------------------------------------------------------------------------------------------------

SAMPLED_BLOCKS = 16
SAMPLED_BLOCK_BYTES = 64 * 1024


def identity(cfg: Any) -> dict[str, Any] | None:
    """What a LoRA checkpoint records and a resume must match (None without LoRA): the adapters' shape (rank,
    targets) and alpha (``checkpoint_identity.lora_settings``, which the request check compares before launch), and
    the frozen base they were trained on (``base_reference``). The checkpoint holds only the adapters and their
    optimizer state: the base comes from that reference again."""
    settings = checkpoint_identity.lora_settings(cfg)
    if settings is None:
        return None
    return {**settings, "base": base_reference(cfg.init_from, cfg.seed)}


def base_reference(init_from: str | None, seed: int) -> dict[str, Any]:
    """The frozen base: ``{"seed": N}`` for a generated one (the same seed gives the same base), or the
    ``init_from`` folder's path and a sampled SHA-256 of its files (``fingerprint``)."""
    if init_from is None:
        return {"seed": seed}
    return {"init_from": init_from, "sha256": fingerprint(init_from)}


def fingerprint(folder: str | Path) -> str:
    """A sampled SHA-256 of a Hugging Face folder's weights, cheap at 70B: ``config.json``, then for every
    safetensors file its name, size, header (every tensor's name, dtype, shape and offsets) and 16 blocks of 64 KiB
    at evenly spaced offsets (about 1 MB per file). Another model, another shape or another layout changes it;
    two folders that differ only between the sampled blocks do not (a full hash would read every byte of 140 GB
    at each start). An unreadable folder gives ``unreadable: <why>`` (the resume check then names it)."""
    root = Path(folder)
    if not root.is_dir():
        return f"unreadable: {root} is not a folder"
    digest = hashlib.sha256()
    try:
        config = root / "config.json"
        digest.update(config.read_bytes() if config.is_file() else b"")
        for path in sorted(root.glob("*.safetensors")):
            size = path.stat().st_size
            digest.update(json.dumps([path.name, size]).encode())
            with open(path, "rb") as handle:
                header_length = int.from_bytes(handle.read(8), "little")
                digest.update(handle.read(min(header_length, size)))
                start = 8 + header_length
                span = max(size - start - SAMPLED_BLOCK_BYTES, 0)
                for index in range(SAMPLED_BLOCKS):
                    handle.seek(start + span * index // max(SAMPLED_BLOCKS - 1, 1))
                    digest.update(handle.read(SAMPLED_BLOCK_BYTES))
    except OSError as err:
        return f"unreadable: {type(err).__name__}: {err}"
    return digest.hexdigest()
