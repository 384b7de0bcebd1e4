"""``WorkflowDefaults``: the value of every execution-input field an execution leaves out (the workflow's defaults,
checked against the request rules at synth)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from training.contract.hardware import DEFAULT_INSTANCE_TYPE
from training.contract.settings_table import HYPERPARAMETERS_BY_NAME


def _default(name: str) -> Any:
    return HYPERPARAMETERS_BY_NAME[name].default


@dataclass(frozen=True)
class WorkflowDefaults:
    """The value of every execution-input field that an execution leaves out (trainer settings from the
    contract). ``num_layers`` None means the trainer's model preset decides the depth (``model_preset`` in
    ``hyperparameters``, default 1b)."""

    precision: str = _default("precision")
    num_layers: int | None = None
    batch_size: int = _default("batch_size")
    seq_length: int = _default("seq_length")
    activation_checkpointing: bool | str = _default("activation_checkpointing")
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    training_plan_arn: str | None = None
    use_spot: bool = False
    max_runtime_seconds: int = 24 * 3600
    max_wait_seconds: int | None = None
    hyperparameters: Mapping[str, str] = field(default_factory=dict)
    job_name_prefix: str = "blackwell-training"
    train_data_uri: str | None = None
    train_data_input_mode: str = "FastFile"
    keep_alive_seconds: int = 0
    infra_check: bool = False
    environment: Mapping[str, str] = field(default_factory=dict)

    def as_input(self) -> dict[str, Any]:
        values = asdict(self)
        values["hyperparameters"] = dict(self.hyperparameters)
        values["environment"] = dict(self.environment)
        return values
