"""Command-line parsing into TrainConfig, and the errors for bad settings."""

from __future__ import annotations

import dataclasses

import pytest

from training.request import contract
from training.trainer import config
from training.trainer.__main__ import main

from .runner import TINY, cli_args


def test_config_fields_are_the_contract_hyperparameters_plus_trainer_switches():
    names = {f.name for f in dataclasses.fields(config.TrainConfig)}
    assert names == {hp.name for hp in contract.HYPERPARAMETERS} | {
        "deterministic",
        "data_dir",
        "tensorboard_dir",
    }


def test_both_spellings_and_string_booleans():
    cfg, check_only = config.parse_args(
        [
            "--num-layers",
            "3",
            "--activation_checkpointing",
            "True",
            "--quantized-model-init",
            "false",
            "--seq_length",
            "1024",
            "--check-only",
        ]  # fmt: skip
    )
    assert (cfg.num_layers, cfg.activation_checkpointing, cfg.quantized_model_init, cfg.seq_length) == (
        3, True, False, 1024,
    )  # fmt: skip
    assert check_only
    assert cfg.hidden_size == contract.MODEL_PRESETS["1b"].hidden_size  # the rest comes from the preset
    assert (
        cfg.shape.parameter_count()
        == dataclasses.replace(contract.MODEL_PRESETS["1b"], num_layers=3).parameter_count()
    )


def test_frozen():
    cfg, _ = config.parse_args([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 2


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--precision", "fp9"], "precision"),
        (["--seq_length", "1001"], "seq_length"),
        (["--precision", "mxfp8", "--seq_length", "48"], "seq_length"),
        (["--batch_size", "0"], "batch_size"),
        (["--batch-size", "two"], "batch_size"),
        (["--quantized_model_init", "true", "--precision", "bf16"], "quantized_model_init"),
        (["--model_preset", "custom", "--num_layers", "2"], "hidden_size"),
        (["--activation_checkpointing", "maybe"], "activation_checkpointing"),
        (["--num_heads", "7", "--hidden_size", "64", "--ffn_hidden_size", "128"], "num_heads"),
        (["--deterministic", "sometimes"], "deterministic"),
    ],
)
def test_bad_setting_names_the_field_and_exits_2(args, field, capsys):
    with pytest.raises(SystemExit) as exit_info:
        config.parse_args(args)
    assert exit_info.value.code == 2
    assert f"error: invalid setting {field}: " in capsys.readouterr().err


def test_unknown_option_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        config.parse_args(["--num_layerz", "2"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "error: invalid command line: unrecognized arguments: --num_layerz 2 (see --help)\n"
    )  # not argparse's usage block


def test_te_precision_without_te_or_gpu_fails_before_any_process_group(capsys, monkeypatch):
    def no_process_group():
        raise AssertionError("a process group was started")

    monkeypatch.setattr("training.trainer.parallel.init_distributed", no_process_group)
    code = main(cli_args({**TINY, "precision": "fp8", "seq_length": "32"}))
    assert code == 2
    assert "error: invalid setting precision: fp8 needs NVIDIA Transformer Engine" in capsys.readouterr().err


def test_check_only_prints_the_settings(capsys, monkeypatch, tmp_path):
    # Its default ./trainer-output, not the checkout's (the README's first run writes a checkpoint there).
    monkeypatch.chdir(tmp_path)
    assert main([*cli_args(TINY), "--check-only"]) == 0
    assert "settings ok: " in capsys.readouterr().out
