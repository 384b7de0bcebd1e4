"""The qwen3 family as the registry lists it (``training.models.registry``)."""

from __future__ import annotations

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
