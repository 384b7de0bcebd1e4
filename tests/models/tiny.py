"""Tiny Hugging Face config.json dicts of every family (2 layers, 64-token vocabulary), each with the features
that set the family apart switched on, for tests that build the transformers model on the meta device or for real.
"""

from __future__ import annotations

from typing import Any

_COMMON: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}

TINY: dict[str, dict[str, Any]] = {
    "llama3": _COMMON
    | {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 2.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "qwen2": _COMMON
    | {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
        "sliding_window": None,
    },
    "qwen3": _COMMON
    | {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "head_dim": 16,  # explicit: 4 heads x 16 is not the hidden 32
        "attention_bias": False,
        "rope_theta": 1000000.0,
        "use_sliding_window": False,
    },
    "mistral": _COMMON
    | {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_act": "silu",
        "head_dim": 16,
        "sliding_window": 5,
        "rope_theta": 1000000.0,
    },
    "gemma3": _COMMON
    | {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "head_dim": 16,
        "query_pre_attn_scalar": 12,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        "tie_word_embeddings": True,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    },
}
"""One tiny config.json per family."""


def tiny_hf_config(family: str, **changes: Any) -> dict[str, Any]:
    """The tiny config.json of ``family`` with ``changes``."""
    return {**TINY[family], **changes}
