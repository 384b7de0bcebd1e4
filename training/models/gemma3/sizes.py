"""Gemma 3's named sizes: the text decoders of Gemma 3 12B and 27B (``Gemma3ForCausalLM``).

Google publishes these as the multimodal ``Gemma3ForConditionalGeneration`` (https://huggingface.co/google/
gemma-3-12b-it/blob/main/config.json, .../gemma-3-27b-it/...): the values here are their ``text_config``'s,
checked against transformers' own conversion script (``models/gemma3/convert_gemma3_weights.py``, variants
``gemma3_12b`` and ``gemma3_27b``) and litgpt's ``litgpt/config.py`` (whose entries cite those URLs):
``hidden_size`` 3840 / 5376, ``num_hidden_layers`` 48 / 62, ``num_attention_heads`` 16 / 32,
``num_key_value_heads`` 8 / 16, ``head_dim`` 256 / 128, ``intermediate_size`` 15360 / 21504,
``query_pre_attn_scalar`` 256 / 168 (27B: hidden / heads), ``sliding_window`` 1024 with every 6th layer global,
RoPE 1000000 with linear scaling by 8 on the global layers and 10000 on the local ones, ``rms_norm_eps`` 1e-6,
131072 positions, tied. ``vocab_size`` 262208: the 262144-token vocabulary of the tokenizer plus the 64 rows the
conversion adds for the image tokens (``convert_gemma3_weights.py`` resizes the embedding; transformers'
``Gemma3TextConfig`` default), which the text-only checkpoints keep (e.g. OpenPipe/gemma-3-12b-it-text-only's
config.json).
"""

from __future__ import annotations

from collections.abc import Mapping

from training.models.config import ModelConfig, RopeConfig


def _size(
    layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, scalar: int
) -> ModelConfig:
    return ModelConfig(
        family="gemma3",
        vocab_size=262_208,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=ffn,
        activation="gelu_tanh",
        norm="rmsnorm_unit_offset",
        norm_placement="sandwich",
        norm_eps=1e-6,
        qk_norm=True,
        query_pre_attn_scalar=float(scalar),
        layer_types=tuple("sliding" if (i + 1) % 6 else "full" for i in range(layers)),
        sliding_window=1024,
        rope=RopeConfig(theta=1_000_000.0, scaling="linear", factor=8.0),
        local_rope=RopeConfig(theta=10_000.0),
        scale_embeddings=True,
        tie_embeddings=True,
        max_position_embeddings=131_072,
    )


SIZES: Mapping[str, ModelConfig] = {
    "gemma3-12b": _size(48, 3840, 16, 8, 256, 15360, 256),
    "gemma3-27b": _size(62, 5376, 32, 16, 128, 21504, 168),
}
