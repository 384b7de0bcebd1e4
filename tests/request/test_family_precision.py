"""The low-precision recipes per family before launch (issue 52 item 6): a request with fp8, mxfp8 or nvfp4 (which
run Transformer Engine's ``TransformerLayer``) for a model TE 2.11 cannot express (Qwen 2's attention-only bias,
Gemma 3's four norms) is refused by the request's plan, on the model of its ``init_from`` folder or its named size,
in the very line the trainer prints for the same settings; the families TE can express (Llama 3, Qwen 3, Mistral)
are planned with those precisions. The workflow's Lambda makes the same decision on S3 folders
(``tests/request_corpus.py``: ``init-qwen2.5-7b-mxfp8``, ``init-gemma3-12b-fp8``, ``preset-qwen2.5-72b-nvfp4``)."""

from __future__ import annotations

import json

import pytest

from tests.models.tiny import tiny_hf_config
from training.contract import hardware, settings_table
from training.models import registry
from training.models.te_support import te_refusal
from training.plan import inputs
from training.request import hf_config
from training.trainer import config as trainer_config

TE_REFUSED = {"qwen2", "gemma3"}
"""The families whose every published size TE 2.11's TransformerLayer cannot be the block of."""


def _request(precision: str, **hyperparameters: str) -> dict:
    return {"precision": precision, "activation_checkpointing": True, "hyperparameters": hyperparameters}


@pytest.mark.parametrize("precision", sorted(hardware.TE_PRECISIONS))
@pytest.mark.parametrize("family", list(registry.FAMILIES))
def test_an_init_from_folder_is_refused_in_the_trainers_words(tmp_path, family, precision):
    folder = tmp_path / family
    folder.mkdir()
    deeper = {"num_hidden_layers": 4}  # nvfp4 keeps the first and last blocks in bf16
    if family == "gemma3":
        deeper["layer_types"] = ["sliding_attention"] * 3 + ["full_attention"]
    config = tiny_hf_config(family, hidden_size=64, intermediate_size=96, **deeper)
    (folder / "config.json").write_text(json.dumps(config))
    architecture = hf_config.architecture(config)
    request = _request(precision)
    if family not in TE_REFUSED:
        assert inputs.setup_from_request(request, architecture).precision == precision
        return
    with pytest.raises(settings_table.ContractError) as planned:
        inputs.setup_from_request(request, architecture)
    with pytest.raises(settings_table.ContractError) as trained:
        trainer_config.config_from_mapping({"init_from": str(folder), "precision": precision})
    assert planned.value.field == trained.value.field == "precision"
    assert str(planned.value) == str(trained.value)
    line = str(planned.value)
    assert "\n" not in line and line.startswith(
        f"precision: {precision} runs the model on Transformer Engine"
    )
    assert te_refusal(registry.read_hf_config(config)) in line
    assert line.endswith("use bf16, fp16 or fp32 (the torch block)")


@pytest.mark.parametrize("size", list(registry.SIZES))
def test_every_named_size_with_mxfp8(size):
    """Every named size is planned with mxfp8 when TE can be its block, refused naming why when it cannot."""
    request = _request("mxfp8", model_preset=size)
    problem = te_refusal(registry.named_size(size))
    assert (problem is not None) == (registry.named_size(size).family in TE_REFUSED)
    if problem is None:
        assert (
            inputs.setup_from_request(request).shape.parameter_count()
            == registry.named_size(size).parameter_count()
        )
        return
    with pytest.raises(settings_table.ContractError, match="precision: mxfp8 runs") as err:
        inputs.setup_from_request(request)
    assert problem in str(err.value)
    assert inputs.setup_from_request({**request, "precision": "bf16"}).precision == "bf16"
