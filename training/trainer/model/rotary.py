"""Rotary position embeddings (RoPE) as Llama (and every family in ``training.models``) defines them: rotate-half on
query and key, base ``rope_theta``, optionally scaled (Llama 3.1's ``llama3``, or ``linear``).

One frequency tensor per forward, in Transformer Engine's layout: ``[seq, 1, 1, head_dim]`` fp32 holding the
angles ``position * theta ** (-2i / head_dim)`` with the two halves repeated (``cat(freqs, freqs)``). That is what
TE 2.11's ``TransformerLayer.forward(..., rotary_pos_emb=...)`` takes for ``rotary_pos_interleaved=False`` (the
default), built by ``transformer_engine.pytorch.attention.rope.RotaryPositionEmbedding(dim, rotary_base=...)``
(tag v2.11, ``transformer_engine/pytorch/attention/rope.py``: ``forward(max_seq_len)`` returns
``emb.reshape(seq, 1, 1, dim)`` with ``emb = cat((freqs, freqs), -1)``; ``_apply_rotary_pos_emb_base`` computes
``t * cos + _rotate_half(t) * sin`` with ``_rotate_half(x) = cat((-x2, x1))``). Hugging Face's Llama builds the
same angles (``LlamaRotaryEmbedding``: ``emb = cat((freqs, freqs))``, ``rotate_half``), so a model trained here
maps onto every family's Hugging Face class with no permutation of the query and key projections.

The torch block applies the same rotation itself (``apply_rotary``, cos/sin cast to the activations' dtype as
Hugging Face does). Frequencies are never parameters or buffers: nothing in the state dict, nothing for FSDP to
shard or for meta-device initialization to fill.

Both paths take their frequencies from ``frequencies`` here. For TE that is the tensor TE's own
``RotaryPositionEmbedding`` would build (its ``inv_freq`` is ``1 / base ** (arange(0, dim, 2, float32) / dim)``,
the same fp32 values as ``inverse_frequencies``, and its ``einsum("i , j -> i j", seq, inv_freq)`` is the same
single product per entry as ``torch.outer``), and it also carries Llama 3.1's frequency scaling
(``Llama3Scaling``, Hugging Face's ``rope_type`` llama3), which TE's module does not have (it knows only linear
position interpolation, ``seq_len_interpolation_factor``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from training.models.config import RopeConfig


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama 3.1's RoPE scaling (Meta's ``apply_scaling``; Hugging Face ``rope_type`` llama3): wavelengths above
    ``original_max_position_embeddings / low_freq_factor`` are stretched by ``factor``, those below
    ``original_max_position_embeddings / high_freq_factor`` kept, the ones between interpolated smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Llama3Scaling | None:
        """The scaling of a run's settings (``rope_scaling`` and its four ``rope_*`` parameters), or None."""
        if settings.get("rope_scaling", "none") != "llama3":
            return None
        return cls(
            float(settings["rope_scaling_factor"]),
            float(settings["rope_low_freq_factor"]),
            float(settings["rope_high_freq_factor"]),
            int(settings["rope_original_max_position_embeddings"]),
        )

    def apply(self, inv_freq: torch.Tensor) -> torch.Tensor:
        """The scaled inverse frequencies, computed in the order of the published formula (so that the fp32
        results equal Hugging Face's ``_compute_llama3_parameters`` bit for bit)."""
        context = self.original_max_position_embeddings
        low_wavelength = context / self.low_freq_factor
        high_wavelength = context / self.high_freq_factor
        wavelength = 2 * math.pi / inv_freq
        long = torch.where(wavelength > low_wavelength, inv_freq / self.factor, inv_freq)
        smooth = (context / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * long / self.factor + smooth * long
        between = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
        return torch.where(between, blended, long)


@dataclass(frozen=True)
class LinearScaling:
    """Linear RoPE scaling (Hugging Face ``rope_type`` linear, ``_compute_linear_scaling_rope_parameters``: every
    inverse frequency divided by ``factor``; Gemma 3's global layers)."""

    factor: float

    def apply(self, inv_freq: torch.Tensor) -> torch.Tensor:
        return inv_freq / self.factor


def inverse_frequencies(
    head_dim: int,
    theta: float,
    device: torch.device | str | None = None,
    scaling: Llama3Scaling | LinearScaling | None = None,
) -> torch.Tensor:
    """``theta ** (-2i / head_dim)`` for i in [0, head_dim / 2), fp32 (Llama's, and TE's, formula), scaled by
    ``scaling`` when given."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings; got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv = 1.0 / (theta**exponents)
    return inv if scaling is None else scaling.apply(inv)


def frequencies(
    seq_len: int,
    head_dim: int,
    theta: float,
    device: torch.device | str | None = None,
    scaling: Llama3Scaling | LinearScaling | None = None,
) -> torch.Tensor:
    """The rotation angles of positions ``0 .. seq_len-1``: ``[seq_len, 1, 1, head_dim]`` fp32, halves repeated
    (computed in fp32 whatever autocast is in effect)."""
    kind = torch.device(device).type if device is not None else "cpu"
    with torch.autocast(kind, enabled=False):
        inv = inverse_frequencies(head_dim, theta, device, scaling)
        positions = torch.arange(seq_len, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, inv)
        return torch.cat((freqs, freqs), dim=-1).view(seq_len, 1, 1, head_dim)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (Llama's ``rotate_half``)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate ``t`` (``[batch, seq, heads, head_dim]``) by ``freqs``: ``[seq, 1, 1, head_dim]`` (from
    ``frequencies``, one position per index of the sequence), or ``[batch, seq, 1, head_dim]`` (each token's own
    angles: packed documents, whose positions restart at every document); cos and sin are computed in fp32 and cast
    to ``t``'s dtype."""
    seq, dim = t.shape[1], t.shape[-1]
    emb = freqs[:seq].view(1, seq, 1, dim) if freqs.size(1) == 1 else freqs
    cos, sin = emb.cos().to(t.dtype), emb.sin().to(t.dtype)
    return t * cos + rotate_half(t) * sin


class Rope:
    """The frequencies one forward passes to every block (torch or Transformer Engine: the same tensor, see the
    module doc), cached by (sequence length, device)."""

    def __init__(self, head_dim: int, theta: float, scaling: Llama3Scaling | LinearScaling | None = None):
        inverse_frequencies(head_dim, theta)  # refuses an odd head_dim now, not at the first forward
        self.head_dim, self.theta, self.scaling = head_dim, float(theta), scaling
        self._cache: dict[tuple[int, str], torch.Tensor] = {}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Rope | None:
        """The rotary frequencies of a run's settings, or None without RoPE (``position_encoding=none``)."""
        if settings.get("position_encoding", "rope") != "rope":
            return None
        head_dim = int(settings["hidden_size"]) // int(settings["num_heads"])
        return cls(head_dim, float(settings["rope_theta"]), Llama3Scaling.from_settings(settings))

    @classmethod
    def from_config(cls, rope: RopeConfig | None, head_dim: int) -> Rope | None:
        """The rotary frequencies of one kind of layer of a ``ModelConfig`` (``config.rope_of(layer)``), or None
        (NoPE)."""
        if rope is None:
            return None
        scaling: Llama3Scaling | LinearScaling | None = None
        if rope.scaling == "llama3":
            scaling = Llama3Scaling(
                float(rope.factor or 0),
                float(rope.low_freq_factor or 0),
                float(rope.high_freq_factor or 0),
                int(rope.original_max_position_embeddings or 0),
            )
        elif rope.scaling == "linear":
            scaling = LinearScaling(float(rope.factor or 0))
        return cls(head_dim, rope.theta, scaling)

    def __call__(self, seq_len: int, device: torch.device) -> torch.Tensor:
        key = (seq_len, str(device))
        if key not in self._cache:
            self._cache[key] = frequencies(seq_len, self.head_dim, self.theta, device, self.scaling)
        return self._cache[key]
