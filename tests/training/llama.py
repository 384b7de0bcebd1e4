"""The tests' Llama model configs: a ``training.models`` ``ModelConfig`` from a Llama's dimensions (the positional
order of the contract's ``ModelShape``) and its RoPE and RMSNorm settings, read through the flat settings as the
trainer reads a run's (``training.models.settings.model_config``, the ``llama3`` family's ``from_flat_settings``)."""

from __future__ import annotations

from training.models import settings as model_settings
from training.models.config import ModelConfig


def llama(
    num_layers: int,
    hidden_size: int,
    num_heads: int,
    ffn_hidden_size: int,
    vocab_size: int = 32_000,
    num_kv_heads: int | None = None,
    tie_embeddings: bool = False,
    *,
    position_encoding: str = "rope",
    rope_theta: float = 10000.0,
    norm_eps: float = model_settings.FLAT_NORM_EPS,
) -> ModelConfig:
    """The Llama of these dimensions (``num_kv_heads`` None: one per query head), RoPE base ``rope_theta``
    unscaled (or none: ``position_encoding="none"``) and RMSNorm epsilon ``norm_eps``."""
    return model_settings.model_config(
        {
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "num_heads": num_heads,
            "ffn_hidden_size": ffn_hidden_size,
            "vocab_size": vocab_size,
            "num_kv_heads": num_kv_heads,
            "tie_embeddings": tie_embeddings,
            "position_encoding": position_encoding,
            "rope_theta": rope_theta,
            "rms_norm_eps": norm_eps,
        }
    )
