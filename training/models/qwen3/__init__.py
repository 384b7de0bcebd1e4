"""Qwen 3 dense (``Qwen3ForCausalLM``): Llama's block with a per-head RMSNorm on query and key before RoPE and an
explicit ``head_dim``."""

from training.models.family import Family
from training.models.qwen3 import hf_config, names, sizes

FAMILY = Family(
    name="qwen3",
    title="Qwen 3",
    architecture=hf_config.ARCHITECTURE,
    model_type=hf_config.MODEL_TYPE,
    block=names.BLOCK,
    sizes=sizes.SIZES,
    read=hf_config.read,
    write=hf_config.write,
)
