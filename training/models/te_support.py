"""Which models Transformer Engine 2.11's ``TransformerLayer`` can be the block of (the low-precision recipes,
fp8/mxfp8/nvfp4, run on it), and in one line why not. Pure Python: the request check refuses those precisions
before launch with the same line the trainer would give.

Read at TE tag v2.11 (``transformer_engine/pytorch/transformer.py``, ``attention/multi_head_attention.py``): one
``bias`` switch for all four linear layers (QKV, the attention's output projection and both of the MLP's), no norm
after attention or after the MLP, the query/key RMSNorm without the (1 + w) form (``_create_qk_norm_modules``
passes no ``zero_centered_gamma``), and no attention scale of its own (``DotProductAttention`` is built without
``softmax_scale``: always ``kv_channels ** -0.5``). It has what the rest need: ``kv_channels`` (an explicit
``head_dim``), ``window_size`` per layer, ``qk_norm_type="RMSNorm"`` with ``qk_norm_before_rope``, SwiGLU and the
tanh-GELU GeGLU.
"""

from __future__ import annotations

from training.models.config import ModelConfig


def te_refusal(config: ModelConfig) -> str | None:
    """Why Transformer Engine 2.11's ``TransformerLayer`` cannot be ``config``'s block (one line naming what it
    lacks), or None when it can."""
    bias = config.attention_bias
    if bias.any:
        which = "q/k/v/o" if bias.o else "q/k/v"
        return (
            f"{config.family}: the bias on the attention's {which} projections alone cannot be expressed by "
            "Transformer Engine's TransformerLayer, whose one bias switch also puts a bias on the MLP's"
        )
    if config.norm_placement != "pre":
        return (
            f"{config.family}: the norms after attention and after the MLP (four per block) have no Transformer "
            "Engine TransformerLayer counterpart"
        )
    if config.norm != "rmsnorm":
        return f"{config.family}: the (1 + w) RMSNorm of the query/key norm has no Transformer Engine counterpart"
    if config.query_pre_attn_scalar is not None and config.query_pre_attn_scalar != config.head_dim:
        return (
            f"{config.family}: query_pre_attn_scalar {config.query_pre_attn_scalar:g} (attention scale) is not "
            f"head_dim {config.head_dim}, and Transformer Engine's TransformerLayer scales by head_dim ** -0.5 only"
        )
    return None
