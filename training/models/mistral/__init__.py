"""Mistral (``MistralForCausalLM``): Llama's block, with an optional sliding window on every layer and an
explicit ``head_dim``."""

from training.models.family import Family
from training.models.mistral import hf_config, names, sizes

FAMILY = Family(
    name="mistral",
    title="Mistral",
    architecture=hf_config.ARCHITECTURE,
    model_type=hf_config.MODEL_TYPE,
    block=names.BLOCK,
    sizes=sizes.SIZES,
    read=hf_config.read,
    write=hf_config.write,
)
