"""Tiny random ``LlamaForCausalLM`` folders made with transformers, for the import, initialization and export tests:
grouped-query attention (4 query heads, 2 key/value heads), llama3 RoPE scaling with a small
``original_max_position_embeddings`` (16), tied or untied embeddings, saved sharded (several files and an index)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ORIGINAL_MAX_POSITIONS = 16
SEQ = 40
"""Tokens of the compared input: longer than ``ORIGINAL_MAX_POSITIONS``, where llama3 scaling matters."""
TOKENIZER_FILES = {
    "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"}),
    "special_tokens_map.json": json.dumps({"eos_token": "</s>"}),
}


def tiny_config(tied: bool, **changes) -> LlamaConfig:
    settings = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": tied,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL_MAX_POSITIONS,
        },
        "bos_token_id": 1,
        "eos_token_id": 2,
        **changes,
    }
    return LlamaConfig(**settings)


def tiny_llama(folder: Path, *, tied: bool, seed: int = 0, **changes) -> LlamaForCausalLM:
    """Save a random tiny Llama into ``folder`` in several safetensors shards with an index, plus tokenizer files;
    return the model (fp32, eval mode). Its weights are scaled up from transformers' N(0, 0.02) so that logits
    differ clearly between models and positions."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_config(tied, **changes)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.mul_(5.0)
            else:
                param.add_(torch.rand_like(param) * 0.5)
    model.save_pretrained(folder, max_shard_size="40KB")
    for name, text in TOKENIZER_FILES.items():
        (folder / name).write_text(text)
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) > 2
    return model


def tokens(batch: int = 2, seq: int = SEQ, vocab: int = 96, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


BROKEN = {
    "missing tensor": "has no tensor model.layers.1.mlp.up_proj.weight",
    "wrong shape": "model.layers.1.mlp.up_proj.weight in wrong.safetensors has shape (96, 32)",
    "unsupported model_type": "model_type 'phi3' is not supported; supported: llama",
    "damaged shard": "cannot read model-00002-of-00012.safetensors: SafetensorError: Error while deserializing header",
}
"""Folders the trainer must refuse before step 1, and a fragment of each refusal."""


def broken_llama(folder: Path, kind: str) -> Path:
    """A tiny Llama folder with one of the ``BROKEN`` faults."""
    from safetensors.torch import save_file

    tiny_llama(folder, tied=False)
    index_file = folder / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    key = "model.layers.1.mlp.up_proj.weight"
    if kind == "missing tensor":
        del index["weight_map"][key]
    elif kind == "wrong shape":
        save_file({key: torch.zeros(96, 32)}, str(folder / "wrong.safetensors"))
        index["weight_map"][key] = "wrong.safetensors"
    elif kind == "damaged shard":  # cut short, as by an interrupted copy
        shard = folder / "model-00002-of-00012.safetensors"
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    else:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "phi3"}))
    index_file.write_text(json.dumps(index))
    return folder
