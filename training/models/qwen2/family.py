"""The qwen2 family as the registry lists it (``training.models.registry``)."""

from __future__ import annotations

from training.models.family import Family
from training.models.qwen2 import hf_config, names, sizes

FAMILY = Family(
    name="qwen2",
    title="Qwen 2 / 2.5",
    architecture=hf_config.ARCHITECTURE,
    model_type=hf_config.MODEL_TYPE,
    block=names.BLOCK,
    sizes=sizes.SIZES,
    read=hf_config.read,
    write=hf_config.write,
)
