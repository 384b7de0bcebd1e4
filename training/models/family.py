"""What one family's folder gives the registry: its Hugging Face class, how its config.json reads into a
``ModelConfig`` and is written back, its block's tensor names, and its named sizes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from training.models.config import ModelConfig, ModelConfigError
from training.models.names import NameMap


@dataclass(frozen=True)
class Family:
    """A family of dense decoders with one Hugging Face class.

    ``name``: the folder (``training.models.<name>``) and ``ModelConfig.family``; ``title``: what a person calls
    it; ``architecture`` and ``model_type``: its config.json's; ``block``: the block's tensor table (``names``);
    ``sizes``: named sizes (a name unique across families -> its config); ``read``: a config.json of this class
    -> its ``ModelConfig``, refusing by key what the trainer cannot build; ``write``: the inverse, the
    architecture part of the class's config.json."""

    name: str
    title: str
    architecture: str
    model_type: str
    block: Mapping[str, tuple[str, ...]]
    sizes: Mapping[str, ModelConfig]
    read: Callable[[Mapping[str, Any]], ModelConfig]
    write: Callable[[ModelConfig], dict[str, Any]]

    def names(self, config: ModelConfig) -> NameMap:
        """The name map of ``config``'s model (a config of this family)."""
        self.check(config)
        return NameMap(config, self.block)

    def check(self, config: ModelConfig) -> None:
        """Refuse a config of another family."""
        if config.family != self.name:
            raise ModelConfigError("family", f"{config.family!r} is not {self.name!r}")

    @property
    def supported(self) -> str:
        """How the refusals name it: ``model_type (Architecture)``."""
        return f"{self.model_type} ({self.architecture})"
