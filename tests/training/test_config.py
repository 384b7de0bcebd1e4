"""Command-line parsing into TrainConfig, and the errors for bad settings."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.training.runner import TINY, cli_args
from training.contract import metric_lines, settings_table, shapes
from training.trainer import config
from training.trainer.__main__ import main


def test_config_fields_are_the_contract_hyperparameters_plus_trainer_switches():
    names = {f.name for f in dataclasses.fields(config.TrainConfig)}
    assert names == {hp.name for hp in settings_table.HYPERPARAMETERS} | {
        "deterministic",
        "data_dir",
        "tensorboard_dir",
        "model_config",  # derived: the model when its flat settings do not describe it whole (another family)
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
        3, "full", False, 1024,
    )  # fmt: skip
    assert check_only
    assert cfg.hidden_size == shapes.MODEL_PRESETS["1b"].hidden_size  # the rest comes from the preset
    assert (
        cfg.shape.parameter_count()
        == dataclasses.replace(shapes.MODEL_PRESETS["1b"], num_layers=3).parameter_count()
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
        (["--grad_accum_steps", "0"], "grad_accum_steps"),
        (["--activation-checkpointing", "everything"], "activation_checkpointing"),
        (["--precision", "fp8", "--compile", "true"], "compile"),
        (
            ["--precision", "fp8", "--quantized_model_init", "true", "--master_weights", "false"],
            "master_weights",
        ),
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

    monkeypatch.setattr("training.trainer.distributed.parallel.init_distributed", no_process_group)
    code = main(cli_args({**TINY, "precision": "fp8", "seq_length": "32"}))
    assert code == 2
    assert "error: invalid setting precision: fp8 needs NVIDIA Transformer Engine" in capsys.readouterr().err


def test_deterministic_on_a_gpu_names_the_op_without_a_deterministic_kernel(monkeypatch):
    from training.trainer.distributed import precision

    def op(sm, **settings):
        return precision.nondeterministic_op(config.config_from_mapping({**TINY, **settings}), sm)

    assert op(None, loss_chunk_tokens="0") is None  # CPU: every op is deterministic
    assert "aten::nll_loss" in op((9, 0), loss_chunk_tokens="0")
    assert "_scaled_dot_product_cudnn_attention" in op((9, 0), attention_backend="cudnn")
    assert "FusedAttention" in op((10, 0), precision="mxfp8") and op((9, 0), precision="fp8") is None
    assert op((9, 0)) is None and op((10, 0)) is None
    # the trainer refuses it at start for the GPU it finds
    monkeypatch.setattr(precision, "check_this_machine", lambda _: None)
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision.torch.cuda, "get_device_capability", lambda *_: (9, 0))
    cfg = config.config_from_mapping({**TINY, "deterministic": "true", "loss_chunk_tokens": "0"})
    with pytest.raises(
        settings_table.ContractError, match="deterministic: true cannot be honoured on this GPU: "
    ):
        precision.check_run(cfg)


def test_fp8_dims_are_refused_at_start_for_the_recipe_this_gpu_runs(monkeypatch):
    """fp8's auto recipe is MXFP8 on SM 10.x: seq_length 48 (a multiple of 16, not of 32) runs on Hopper only."""
    from training.trainer.distributed import precision

    cfg = config.config_from_mapping({**TINY, "precision": "fp8", "seq_length": "48"})  # GPU not known yet
    monkeypatch.setattr(precision, "check_this_machine", lambda _: None)
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision.torch.cuda, "get_device_capability", lambda *_: (9, 0))
    precision.check_run(cfg)
    monkeypatch.setattr(precision.torch.cuda, "get_device_capability", lambda *_: (10, 0))
    with pytest.raises(
        settings_table.ContractError, match=r"^seq_length: must be a multiple of 32 for precision=fp8"
    ):
        precision.check_run(cfg)


def test_check_only_prints_the_settings(capsys, monkeypatch, tmp_path):
    # Its default ./trainer-output, not the checkout's (the README's first run writes a checkpoint there).
    monkeypatch.chdir(tmp_path)
    assert main([*cli_args(TINY), "--check-only"]) == 0
    assert "settings ok: " in capsys.readouterr().out


def test_the_config_line_is_short_and_the_settings_file_has_every_setting(tmp_path):
    """The trainer's ``config`` line: the settings that say what runs (and what the CLI and the tuning driver read
    from it), then the file with all of them; the file is never written over."""
    cfg = config.config_from_mapping(
        {**TINY, "checkpoint_dir": str(tmp_path / "c"), "model_dir": str(tmp_path / "m")}
    )
    settings = {**cfg.as_dict(), "world_size": 2, "device": "cpu", "gpu": "none", "parameters": 123,
                "compute_dtype": "float32"}  # fmt: skip
    path = config.write_settings(settings, cfg.model_dir)
    line = config.config_line(settings, path)
    assert len(line) - len(str(path)) - len(cfg.checkpoint_dir) < 450  # the paths are as long as they are
    assert len(metric_lines.format_config_line(settings)) > 1000  # every setting, as the line had them
    parsed = metric_lines.parse_config_line(line)
    assert parsed is not None and parsed["settings"] == str(tmp_path / "m" / "settings.json")
    read_by_the_cli_and_the_tuning_driver = {"max_steps", "batch_size", "grad_accum_steps", "seq_length",
                                             "world_size", "device", "gpu"}  # fmt: skip
    assert read_by_the_cli_and_the_tuning_driver <= parsed.keys()
    assert parsed["precision"] == "fp32" and parsed["deterministic"] == "true"  # not its default: shown
    assert (
        "gc_interval" not in parsed and "max_steps" in parsed
    )  # a default only in the file, the keys always
    assert json.loads(path.read_text()) == json.loads(json.dumps(settings))
    # the same settings again: the file is kept; other settings: a file of their own, the first one untouched
    before = path.read_text()
    assert config.write_settings(settings, cfg.model_dir) == path
    other = config.write_settings({**settings, "max_steps": 99}, cfg.model_dir)
    assert other == tmp_path / "m" / "settings-2.json" and path.read_text() == before
    assert json.loads(other.read_text())["max_steps"] == 99
