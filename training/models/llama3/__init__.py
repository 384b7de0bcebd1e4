"""Llama 3 (``LlamaForCausalLM``): Meta's Llama 3.1 / 3.2 and the Llama-style named sizes."""

from training.models.family import Family
from training.models.llama3 import hf_config, names, sizes

FAMILY = Family(
    name="llama3",
    title="Llama 3",
    architecture=hf_config.ARCHITECTURE,
    model_type=hf_config.MODEL_TYPE,
    block=names.BLOCK,
    sizes=sizes.SIZES,
    read=hf_config.read,
    write=hf_config.write,
)
