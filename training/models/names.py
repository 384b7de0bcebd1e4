"""The trainer's parameters and the Hugging Face tensors that hold them, both ways, for one ``ModelConfig``.

The trainer's names (its torch block; the Transformer Engine block's are mapped onto these by the trainer):
``embed.weight``, ``norm.weight``, ``head.weight`` (none when tied) and per block ``layers.<i>.``:
``attention_norm.weight``, ``qkv.weight`` (``[q; k; v]`` along the rows) and ``qkv.bias``, ``q_norm.weight`` and
``k_norm.weight`` (per head, ``head_dim``), ``out_proj.weight`` and ``out_proj.bias``, ``post_attention_norm.weight``
(sandwich norms), ``ffn_norm.weight``, ``gate_up.weight`` (``[gate; up]``), ``down.weight``, ``post_ffn_norm.weight``
(sandwich norms). Which of these a model has follows from its config (biases, query/key norm, norm placement).

Each family gives the block's table (``BLOCK`` in its ``names.py``): each of these names -> the tensors after
``model.layers.<i>.`` that it holds, stacked along the rows in that order. Every family here keeps Hugging Face's
``model.embed_tokens``, ``model.norm`` and ``lm_head`` outside the blocks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from training.models.config import PROJECTIONS, ModelConfig, ModelConfigError

ROOT: Mapping[str, str] = {
    "embed.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "head.weight": "lm_head.weight",
}
"""Parameters outside the blocks: ours -> Hugging Face's (every family here)."""
HF_LAYER_PREFIX = "model.layers"
_OURS = re.compile(r"^layers\.(\d+)\.(.+)$")
_THEIRS = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def block_parameters(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The trainer's parameters of one block (names after ``layers.<i>.``) and their shapes, in block order."""
    h, f, hd = config.hidden_size, config.ffn_hidden_size, config.head_dim
    qkv = config.q_width + 2 * config.kv_width
    sandwich = config.norm_placement == "sandwich"
    out: dict[str, tuple[int, ...]] = {"attention_norm.weight": (h,), "qkv.weight": (qkv, h)}
    if config.attention_bias.qkv:
        out["qkv.bias"] = (qkv,)
    if config.qk_norm:
        out |= {"q_norm.weight": (hd,), "k_norm.weight": (hd,)}
    out["out_proj.weight"] = (h, config.q_width)
    if config.attention_bias.o:
        out["out_proj.bias"] = (h,)
    if sandwich:
        out["post_attention_norm.weight"] = (h,)
    out |= {"ffn_norm.weight": (h,), "gate_up.weight": (2 * f, h), "down.weight": (h, f)}
    if sandwich:
        out["post_ffn_norm.weight"] = (h,)
    return out


def root_parameters(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The trainer's parameters outside the blocks and their shapes (no head when tied)."""
    out = {"embed.weight": (config.vocab_size, config.hidden_size), "norm.weight": (config.hidden_size,)}
    if not config.tie_embeddings:
        out["head.weight"] = (config.vocab_size, config.hidden_size)
    return out


def tensor_dims(suffix: str, config: ModelConfig) -> tuple[int, ...]:
    """The shape of a block's Hugging Face tensor (``suffix``: its name after ``model.layers.<i>.``): a
    projection's weight or bias, a query/key norm (``head_dim``), or a hidden-size norm."""
    module, _, kind = suffix.rpartition(".")
    projection = module.rsplit(".", 1)[-1]
    if projection in PROJECTIONS:
        rows, cols = config.projection_shapes()[projection]
        return (rows, cols) if kind == "weight" else (rows,)
    if projection in ("q_norm", "k_norm"):
        return (config.head_dim,)
    if projection.endswith("norm") or projection.endswith("layernorm"):
        return (config.hidden_size,)
    raise ModelConfigError("tensor", f"{suffix} is not a tensor of a decoder block")


class NameMap:
    """The map of one model: ours <-> Hugging Face's, with every tensor's shape."""

    def __init__(self, config: ModelConfig, block: Mapping[str, tuple[str, ...]]):
        self.config = config
        self.block_parameters = block_parameters(config)
        missing = [name for name in self.block_parameters if name not in block]
        if missing:
            raise ModelConfigError(
                "family", f"{config.family}'s Hugging Face class has no tensors for the block's {missing}"
            )
        self.block = {name: block[name] for name in self.block_parameters}
        self._owners: dict[str, tuple[str, int]] = {}
        for ours, theirs in self.block.items():
            for position, name in enumerate(theirs):
                self._owners[name] = (ours, position)

    def parameters(self) -> dict[str, tuple[int, ...]]:
        """Every parameter of the trainer's model and its shape (blocks in order, then the root)."""
        out: dict[str, tuple[int, ...]] = {}
        for index in range(self.config.num_layers):
            out |= {f"layers.{index}.{name}": dims for name, dims in self.block_parameters.items()}
        return out | root_parameters(self.config)

    def tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the Hugging Face model (what its safetensors hold) and its shape."""
        config = self.config
        out: dict[str, tuple[int, ...]] = {ROOT["embed.weight"]: (config.vocab_size, config.hidden_size)}
        per_layer = {name: tensor_dims(name, config) for theirs in self.block.values() for name in theirs}
        for index in range(config.num_layers):
            out |= {f"{HF_LAYER_PREFIX}.{index}.{name}": dims for name, dims in per_layer.items()}
        out[ROOT["norm.weight"]] = (config.hidden_size,)
        if not config.tie_embeddings:
            out[ROOT["head.weight"]] = (config.vocab_size, config.hidden_size)
        return out

    def parts(self, name: str) -> tuple[str, ...] | None:
        """The Hugging Face tensors our parameter ``name`` holds (stacked along the rows in this order), or None
        for a name this model has no counterpart of."""
        if name in ROOT:
            return None if name == "head.weight" and self.config.tie_embeddings else (ROOT[name],)
        match = _OURS.match(name)
        if match is None or int(match.group(1)) >= self.config.num_layers:
            return None
        index, suffix = match.groups()
        theirs = self.block.get(suffix)
        return None if theirs is None else tuple(f"{HF_LAYER_PREFIX}.{index}.{t}" for t in theirs)

    def owner(self, tensor: str) -> tuple[str, int] | None:
        """Our parameter holding the Hugging Face tensor ``tensor`` and the tensor's place among its parts, or
        None for a tensor this model does not have."""
        for ours, theirs in ROOT.items():
            if tensor == theirs:
                return None if ours == "head.weight" and self.config.tie_embeddings else (ours, 0)
        match = _THEIRS.match(tensor)
        if match is None or int(match.group(1)) >= self.config.num_layers:
            return None
        index, suffix = match.groups()
        found = self._owners.get(suffix)
        return None if found is None else (f"layers.{index}.{found[0]}", found[1])

    def dims(self, tensor: str) -> tuple[int, ...]:
        """The shape of the Hugging Face tensor ``tensor``."""
        if tensor == ROOT["norm.weight"]:
            return (self.config.hidden_size,)
        if tensor in (ROOT["embed.weight"], ROOT["head.weight"]):
            return (self.config.vocab_size, self.config.hidden_size)
        match = _THEIRS.match(tensor)
        if match is None:
            raise ModelConfigError("tensor", f"{tensor} is not a tensor of this model")
        return tensor_dims(match.group(2), self.config)
