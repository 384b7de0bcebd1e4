"""Gemma 3 text (``Gemma3ForCausalLM``): four (1 + w) RMSNorms per block, query/key norm, GeGLU, scaled embedding,
local sliding-window and global layers with their own RoPE, ``query_pre_attn_scalar``, tied embeddings."""

from training.models.family import Family
from training.models.gemma3 import hf_config, names, sizes

FAMILY = Family(
    name="gemma3",
    title="Gemma 3",
    architecture=hf_config.ARCHITECTURE,
    model_type=hf_config.MODEL_TYPE,
    block=names.BLOCK,
    sizes=sizes.SIZES,
    read=hf_config.read,
    write=hf_config.write,
)
