"""training/contract/: the names, types and regexes both wings rely on."""

from __future__ import annotations

import re

import pytest

from training.contract import hardware, metric_lines, settings_checks, settings_parse, settings_table, shapes


def test_both_spellings_and_sagemaker_strings_parse():
    values = settings_parse.parse_hyperparameters(
        {"num-layers": "4", "--batch_size": "2", "activation_checkpointing": "True", "learning_rate": "1e-3"}
    )
    assert values["num_layers"] == 4 and values["batch_size"] == 2
    assert values["activation_checkpointing"] == "full" and values["learning_rate"] == pytest.approx(1e-3)
    # JSON values (from a Step Functions input) parse too.
    assert (
        settings_parse.parse_hyperparameters({"num_layers": 3, "activation_checkpointing": False})[
            "num_layers"
        ]
        == 3
    )


def test_defaults_and_presets_fill_the_dims():
    values = settings_parse.parse_hyperparameters({})
    assert values["precision"] == "bf16" and values["model_preset"] == "1b"
    preset = shapes.MODEL_PRESETS["1b"]
    assert (values["num_layers"], values["hidden_size"], values["num_heads"]) == (
        preset.num_layers,
        preset.hidden_size,
        preset.num_heads,
    )
    assert (
        settings_parse.parse_hyperparameters({"model_preset": "8b", "num_layers": "2"})["hidden_size"] == 4096
    )


@pytest.mark.parametrize(
    ("raw", "field", "fragment"),
    [
        ({"precision": "int4"}, "precision", "one of fp32, fp16, bf16, fp8, mxfp8, nvfp4"),
        ({"batch_size": "0"}, "batch_size", "an integer in [1, 4096]"),
        ({"batch_size": "2.5"}, "batch_size", "an integer"),
        ({"num_layers": True}, "num_layers", "an integer"),
        ({"activation_checkpointing": "maybe"}, "activation_checkpointing", "one of none, full, selective"),
        ({"grad_accum_steps": "0"}, "grad_accum_steps", "an integer in [1, 65536]"),
        ({"activation_checkpointing": "partial"}, "activation_checkpointing", "(true = full, false = none)"),
        ({"compile": "sometimes"}, "compile", "one of auto, true, false"),
        ({"precision": "fp8", "compile": "true"}, "compile", "Transformer Engine 2.11's layers run eagerly"),
        (
            {"precision": "mxfp8", "quantized_model_init": "true", "master_weights": "false"},
            "master_weights",
            "round small updates away",
        ),
        (
            {"precision": "fp8", "activation_checkpointing": "selective"},
            "activation_checkpointing",
            "te.distributed.checkpoint",
        ),
        (
            {"precision": "fp8", "attention_backend": "flash"},
            "attention_backend",
            "Transformer Engine chooses",
        ),
        (
            {"precision": "nvfp4", "num_layers": "2", "nvfp4_bf16_blocks": "1"},
            "nvfp4_bf16_blocks",
            "must leave a block in nvfp4",
        ),
        (
            {"num_layers": "2", "activation_checkpointing_interval": "3"},
            "activation_checkpointing_interval",
            "at most num_layers",
        ),
        ({"attention_backend": "xformers"}, "attention_backend", "one of auto, cudnn, flash"),
        ({"learning_rate": "nan"}, "learning_rate", "a number"),
        ({"colour": "red"}, "colour", "unknown setting"),
        (
            {"model_preset": "custom", "num_layers": "2"},
            "hidden_size",
            "must be set when model_preset=custom",
        ),
        ({"precision": "mxfp8", "seq_length": "4112"}, "seq_length", "multiple of 32 for precision=mxfp8"),
        ({"num_heads": "7"}, "num_heads", "must divide hidden_size"),
        ({"quantized_model_init": "true"}, "quantized_model_init", "fp8 or mxfp8"),
    ],
)
def test_errors_name_the_field_and_the_allowed_values(raw, field, fragment):
    with pytest.raises(settings_table.ContractError) as info:
        settings_parse.parse_hyperparameters(raw)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert fragment in str(info.value)


def test_precision_hardware_matrix():
    hopper, blackwell, rtx_blackwell, ampere = (9, 0), (10, 0), (12, 0), (8, 0)
    assert all(hardware.precision_supported_on(p, blackwell) for p in hardware.PRECISIONS)
    assert hardware.precision_supported_on("fp8", hopper) and not hardware.precision_supported_on(
        "mxfp8", hopper
    )
    assert not hardware.precision_supported_on("nvfp4", hopper)
    assert not hardware.precision_supported_on("mxfp8", rtx_blackwell)
    assert not hardware.precision_supported_on("fp8", ampere) and hardware.precision_supported_on(
        "bf16", ampere
    )
    with pytest.raises(ValueError, match="precision must be one of"):
        hardware.precision_supported_on("int8", blackwell)


def test_instance_types_by_precision():
    assert hardware.DEFAULT_INSTANCE_TYPE in hardware.GPU_INSTANCE_TYPES
    blackwell = hardware.instance_types_supporting("mxfp8")
    assert set(blackwell) == {"ml.p6-b200.48xlarge", "ml.p6-b300.48xlarge", "ml.p6e-gb200.36xlarge"}
    assert "ml.p5.48xlarge" in hardware.instance_types_supporting("fp8")
    assert "ml.p4d.24xlarge" not in hardware.instance_types_supporting("fp8")
    assert set(hardware.instance_types_supporting("bf16")) == set(hardware.GPU_INSTANCE_TYPES)


def test_parameter_counts_match_the_preset_names():
    billions = {name: shape.parameter_count() / 1e9 for name, shape in shapes.MODEL_PRESETS.items()}
    for name, count in billions.items():
        nominal = float(re.search(r"(?:^|-)([0-9.]+)b(?:-|$)", name).group(1))
        assert 0.7 * nominal <= count <= 1.3 * nominal, (name, count)


def test_activation_checkpointing_keeps_true_and_false_and_names_its_modes():
    spec = settings_table.HYPERPARAMETERS_BY_NAME["activation_checkpointing"]
    assert [spec.parse(v) for v in (True, False, "true", "False", "full", "selective", "none")] == [
        "full",
        "none",
        "full",
        "none",
        "full",
        "selective",
        "none",
    ]
    assert (
        hardware.fp8_recipe_for("auto", (9, 0)) == "current"
        and hardware.fp8_recipe_for("auto", (10, 0)) == "mxfp8"
    )
    assert hardware.fp8_recipe_for("delayed", (10, 0)) == "delayed"


def test_sagemaker_hyperparameters_are_strings_with_contract_names():
    rendered = settings_parse.to_sagemaker_hyperparameters(
        {"num-layers": 4, "activation_checkpointing": True, "precision": "fp8"}
    )
    assert rendered == {"num_layers": "4", "activation_checkpointing": "true", "precision": "fp8"}
    assert settings_parse.parse_hyperparameters(rendered)["num_layers"] == 4
    with pytest.raises(settings_table.ContractError, match="unknown setting"):
        settings_parse.to_sagemaker_hyperparameters({"colour": "red"})


def test_metric_definitions_fit_sagemaker_limits():
    definitions = metric_lines.metric_definitions()
    assert len(definitions) <= 40
    assert len({d.name for d in definitions}) == len(definitions)
    for definition in definitions:
        assert len(definition.regex) <= 500
        assert re.compile(definition.regex).groups == 1
        assert definition.as_sagemaker() == {"Name": definition.name, "Regex": definition.regex}


def test_a_throughput_warmup_as_long_as_the_run_is_accepted():
    # the trainer shortens it with a note (tests/training/test_resume.py); refusing it failed short runs
    values = settings_parse.parse_hyperparameters({"max_steps": "3", "throughput_warmup_steps": "3"})
    assert values["throughput_warmup_steps"] == 3


def test_step_lines_show_progress_and_still_parse():
    line = metric_lines.format_step_line(30, {"loss": 2.5, "lr": 1e-3}, max_steps=120, elapsed=75.4, eta=3725)
    assert line == "step=30/120 25.0% elapsed=0:01:15 eta=1:02:05 loss=2.5 lr=0.001"
    assert metric_lines.parse_metric_line(line) == {"train:loss": 2.5, "train:lr": 1e-3}


def test_validation_lines_give_val_loss_and_no_train_metric():
    line = metric_lines.format_validation_line(200, 1000, 1.234567)
    assert line == "validation step=200/1000 val_loss=1.23457"
    assert metric_lines.parse_metric_line(line) == {"val_loss": 1.23457}
    summary = metric_lines.format_summary_line({"steps": 1000, "final_loss": 1.5, "val_loss": 1.25})
    assert metric_lines.parse_metric_line(summary) == {"final:final_loss": 1.5, "final:val_loss": 1.25}


def test_peak_table_covers_every_blackwell_instance_gpu_and_its_precisions():
    for instance in hardware.GPU_INSTANCE_TYPES.values():
        if instance.sm[0] == 10:
            peaks = hardware.PEAK_TFLOPS[instance.gpu]
            assert {p for p in hardware.PRECISIONS if instance.supports(p)} <= set(peaks)
            assert peaks["mxfp8"] == peaks["fp8"] == 2 * peaks["bf16"]  # dense figures, no sparsity
    assert hardware.PEAK_TFLOPS["B200"]["fp32"] == 75.0  # HGX B200 datasheet: 600 TFLOPS per 8 GPUs


def test_metric_lines_round_trip_through_the_regexes():
    step = metric_lines.format_step_line(
        120,
        {
            "loss": 2.345678,
            "lr": 3e-4,
            "grad_norm": 0.75,
            "tokens_per_sec": 51234.5,
            "tflops_per_gpu": 812.3,
            "mfu": 0.361,
            "mfu_bf16": 0.722,
            "peak_mem_gb": 22.8,
            "step_time": 2.56,
        },
    )
    assert " mfu=0.361 mfu_bf16=0.722 " in step
    assert metric_lines.parse_step_line(step)[1]["mfu_bf16"] == 0.722  # the trainer's own parser reads it too
    parsed = metric_lines.parse_metric_line(step)
    assert parsed == {
        "train:loss": 2.34568,
        "train:lr": 3e-4,
        "train:grad_norm": 0.75,
        "train:tokens_per_sec": 51234.5,
        "train:tflops_per_gpu": 812.3,
        "train:mfu": 0.361,
        "train:mfu_bf16": 0.722,
        "train:peak_mem_gb": 22.8,
        "train:step_time": 2.56,
    }
    # a bf16 run prints no mfu_bf16, and its mfu= is never read as mfu_bf16= (nor the other way round)
    assert metric_lines.parse_metric_line("step=3 mfu=0.4") == {"train:mfu": 0.4}
    assert metric_lines.parse_metric_line("summary mfu_bf16=0.5") == {"final:mfu_bf16": 0.5}
    summary = metric_lines.format_summary_line(
        {"steps": 1000, "final_loss": 1.5, "tokens_per_sec": 6000.0, "train_seconds": 3600}
    )
    assert metric_lines.parse_metric_line(summary) == {
        "final:final_loss": 1.5,
        "final:tokens_per_sec": 6000.0,
        "final:train_seconds": 3600.0,
    }


def test_config_line_never_matches_a_metric():
    line = metric_lines.format_config_line(settings_parse.parse_hyperparameters({"max_steps": "50"}))
    assert line.startswith("config ") and "max_steps=50" in line
    assert metric_lines.parse_metric_line(line) == {}


def test_step_summary_and_config_lines_parse_back():
    step = metric_lines.format_step_line(
        7, {"loss": 2.25, "tokens_per_sec": 1234.5, "mfu": 0.375, "step_time": 0.125}
    )
    assert metric_lines.parse_step_line(f"[1,mpirank:0,algo-1]<stdout>:{step}") == (
        7,
        {"loss": 2.25, "tokens_per_sec": 1234.5, "mfu": 0.375, "step_time": 0.125},
    )
    summary = metric_lines.format_summary_line({"steps": 9, "final_loss": 1.5, "train_seconds": 12.0})
    assert metric_lines.parse_summary_line(summary) == {"steps": 9, "final_loss": 1.5, "train_seconds": 12.0}
    config = metric_lines.format_config_line(
        {"max_steps": 9, "precision": "fp8", "activation_checkpointing": True}
    )
    assert metric_lines.parse_config_line(config) == {
        "max_steps": "9",
        "precision": "fp8",
        "activation_checkpointing": "true",
    }
    # every setting the trainer prints, fp8_recipe (a digit in its name) included
    full = metric_lines.format_config_line({hp.name: hp.default for hp in settings_table.HYPERPARAMETERS})
    assert metric_lines.parse_config_line(full) == {
        hp.name: full.split(f" {hp.name}=")[1].split()[0] for hp in settings_table.HYPERPARAMETERS
    }
    assert metric_lines.parse_config_line(full)["fp8_recipe"] == "auto"
    validation = metric_lines.format_validation_line(40, 100, 2.125)
    assert metric_lines.parse_validation_line(f"[rank0]: {validation}") == (40, {"val_loss": 2.125})
    assert (
        metric_lines.parse_validation_line(step) is None and metric_lines.parse_step_line(validation) is None
    )
    for other in ("steps=3 loss=1", "summary", "configure max_steps=1", "model saved to /opt/ml/model"):
        assert metric_lines.parse_validation_line(other) is None
        assert metric_lines.parse_step_line(other) is None
        assert metric_lines.parse_summary_line(other) is None
        assert metric_lines.parse_config_line(other) is None


def test_the_trainers_progress_lines_parse_back_and_validation_lines_are_not_steps():
    line = metric_lines.format_step_line(
        30, {"loss": 2.5, "mfu": 0.41}, max_steps=120, elapsed=75.4, eta=3725
    )
    assert metric_lines.parse_step_line(f"[rank0]: {line}") == (30, {"loss": 2.5, "mfu": 0.41})
    assert metric_lines.parse_step_line(metric_lines.format_validation_line(200, 1000, 1.25)) is None


def test_every_instance_type_has_a_price_entry_and_costs_scale_with_count_and_time():
    assert set(hardware.ON_DEMAND_USD_PER_HOUR) == set(hardware.GPU_INSTANCE_TYPES)
    price = hardware.ON_DEMAND_USD_PER_HOUR[hardware.DEFAULT_INSTANCE_TYPE]
    assert price is not None and price > 0
    assert hardware.estimate_cost_usd(hardware.DEFAULT_INSTANCE_TYPE, 2, 1800) == pytest.approx(price)
    assert hardware.estimate_cost_usd(hardware.DEFAULT_INSTANCE_TYPE, 1, 0) == 0
    unpriced = [name for name, usd in hardware.ON_DEMAND_USD_PER_HOUR.items() if usd is None]
    assert unpriced and hardware.estimate_cost_usd(unpriced[0], 1, 3600) is None
    assert hardware.estimate_cost_usd("ml.m5.large", 1, 3600) is None


# ---------------------------------------------------------------------------------------------------------------
# Llama 3.x: grouped-query attention, tied embeddings, RoPE scaling
# ---------------------------------------------------------------------------------------------------------------

LLAMA = {  # (layers, hidden, heads, kv heads, intermediate, tied, rope factor) of each model's config.json
    "llama3.2-1b": (16, 2048, 32, 8, 8192, True, 32.0),
    "llama3.2-3b": (28, 3072, 24, 8, 8192, True, 32.0),
    "llama3.1-8b": (32, 4096, 32, 8, 14336, False, 8.0),
    "llama3.1-70b": (80, 8192, 64, 8, 28672, False, 8.0),
}
PUBLISHED_BILLIONS = {"llama3.2-1b": 1.23, "llama3.2-3b": 3.21, "llama3.1-8b": 8.03, "llama3.1-70b": 70.6}
"""Meta's model cards (Llama 3.2: 1.23B and 3.21B) and Hugging Face's model pages (8.03B, 70.6B)."""


@pytest.mark.parametrize("name", LLAMA)
def test_the_llama_presets_are_the_published_models(name):
    layers, hidden, heads, kv, ffn, tied, factor = LLAMA[name]
    shape = shapes.MODEL_PRESETS[name]
    assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.kv_heads) == (
        layers,
        hidden,
        heads,
        kv,
    )
    assert (shape.ffn_hidden_size, shape.vocab_size, shape.tie_embeddings) == (ffn, 128_256, tied)
    published = PUBLISHED_BILLIONS[name] * 1e9
    assert abs(shape.parameter_count() - published) / published < 0.005  # the cards round (1.2358B: "1.23B")
    values = settings_parse.parse_hyperparameters({"model_preset": name})
    assert (values["rope_theta"], values["rope_scaling"], values["rope_scaling_factor"]) == (
        500000.0,
        "llama3",
        factor,
    )
    assert (values["rope_low_freq_factor"], values["rope_high_freq_factor"]) == (1.0, 4.0)
    assert values["rope_original_max_position_embeddings"] == 8192 and values["num_kv_heads"] == kv


def test_grouped_query_attention_and_tying_are_counted():
    mha = shapes.ModelShape(2, 64, 8, 128, 100)
    gqa = shapes.ModelShape(2, 64, 8, 128, 100, num_kv_heads=2)
    tied = shapes.ModelShape(2, 64, 8, 128, 100, num_kv_heads=2, tie_embeddings=True)
    assert mha.block_parameter_count() - gqa.block_parameter_count() == 2 * 64 * (64 - 16)
    assert gqa.root_parameter_count() - tied.root_parameter_count() == 100 * 64
    assert shapes.ModelShape(2, 64, 8, 128, 100, num_kv_heads=8) == shapes.ModelShape(
        2, 64, 8, 128, 100, num_kv_heads=8
    )
    # the tied head is still a matmul: the same FLOPs as untied
    assert (
        shapes.flops_per_token(tied, 128)
        == shapes.flops_per_token(gqa, 128)
        < shapes.flops_per_token(mha, 128)
    )


@pytest.mark.parametrize(
    ("raw", "field", "fragment"),
    [
        ({"num_kv_heads": "3"}, "num_kv_heads", "must divide num_heads (16); got 3"),
        ({"rope_scaling": "llama3"}, "rope_scaling_factor", "must be set when rope_scaling=llama3"),
        ({"rope_scaling_factor": "8"}, "rope_scaling_factor", "only with rope_scaling=llama3"),
        (
            {"model_preset": "llama3.1-8b", "rope_low_freq_factor": "4"},
            "rope_high_freq_factor",
            "must be above rope_low_freq_factor (4); got 4",
        ),
        (
            {"model_preset": "llama3.1-8b", "position_encoding": "none"},
            "rope_scaling",
            "llama3 needs position_encoding=rope",
        ),
        ({"rope_scaling": "yarn"}, "rope_scaling", "one of none, llama3"),
    ],
)
def test_grouped_query_attention_and_rope_scaling_are_checked(raw, field, fragment):
    with pytest.raises(settings_table.ContractError) as info:
        settings_parse.parse_hyperparameters(raw)
    assert info.value.field == field and fragment in str(info.value)


def test_presets_fill_only_what_the_request_leaves_out():
    mine = settings_parse.parse_hyperparameters(
        {"model_preset": "llama3.1-8b", "rope_scaling": "none", "num_heads": "16"}
    )
    assert (
        mine["rope_scaling"] == "none"
        and mine["rope_scaling_factor"] is None
        and mine["rope_theta"] == 500000.0
    )
    assert mine["num_kv_heads"] == 8  # the preset's key/value heads, which divide the 16 heads asked for
    assert (
        settings_parse.parse_hyperparameters({"model_preset": "8b", "num_heads": "16"})["num_kv_heads"] == 16
    )
    custom = {
        "model_preset": "custom",
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "ffn_hidden_size": 64,
    }
    assert settings_parse.parse_hyperparameters({**custom, "vocab_size": 10})["tie_embeddings"] is False


def test_fp8_dims_follow_the_recipe_that_runs_mxfp8_on_blackwell_current_scaling_elsewhere():
    settings = {"precision": "fp8", "model_preset": "custom", "num_layers": 2, "hidden_size": 1040,
                "num_heads": 10, "ffn_hidden_size": 4096, "vocab_size": 1000}  # fmt: skip
    assert settings_parse.parse_hyperparameters(settings, sm=(9, 0))["hidden_size"] == 1040  # 16 | 1040
    assert (
        settings_parse.parse_hyperparameters(settings)["hidden_size"] == 1040
    )  # GPU not known: the recipe's own rule
    with pytest.raises(settings_table.ContractError) as info:
        settings_parse.parse_hyperparameters(settings, sm=(10, 0))
    assert info.value.field == "hidden_size"
    assert str(info.value) == (
        "hidden_size: must be a multiple of 32 for precision=fp8 with fp8_recipe=auto (MXFP8BlockScaling on SM "
        "10.0: blocks of 32 values); got 1040"
    )
    with pytest.raises(
        settings_table.ContractError, match=r"fp8_recipe=mxfp8 \(MXFP8BlockScaling: blocks of 32"
    ):
        settings_parse.parse_hyperparameters({**settings, "fp8_recipe": "mxfp8"}, sm=None)
    assert (
        settings_checks.dims_multiple("fp8", "current", (10, 0)) == 16
        and settings_checks.dims_multiple("fp8", "auto", (10, 0)) == 32
    )
    gqa = {**settings, "hidden_size": 1024, "num_heads": 128, "num_kv_heads": 1}  # QKV rows 1024 + 2 x 8
    with pytest.raises(
        settings_table.ContractError, match=r"^num_kv_heads: hidden_size \+ 2 x num_kv_heads x head_dim"
    ):
        settings_parse.parse_hyperparameters(gqa, sm=(10, 0))
    assert settings_parse.parse_hyperparameters(gqa, sm=(9, 0))["num_kv_heads"] == 1


def test_the_plan_checks_fp8_dims_for_its_instance_types_gpu():
    from training.plan import inputs

    request = {"precision": "fp8", "seq_length": 4112, "batch_size": 1}
    with pytest.raises(
        settings_table.ContractError, match="^seq_length: must be a multiple of 32 for precision=fp8"
    ):
        inputs.setup_from_request(request)  # ml.p6-b200.48xlarge
    assert inputs.setup_from_request({**request, "instance_type": "ml.p5.48xlarge"}).seq_length == 4112


def test_fp8_with_the_mxfp8_recipe_needs_a_blackwell_gpu_as_precision_mxfp8_does():
    with pytest.raises(
        settings_table.ContractError,
        match=r"^fp8_recipe: mxfp8 \(TE MXFP8BlockScaling\) needs a data-centre ",
    ):
        settings_parse.parse_hyperparameters({"precision": "fp8", "fp8_recipe": "mxfp8"}, sm=(9, 0))
    for sm in ((10, 0), (10, 3), None):  # Blackwell, or the GPU not known: nothing to refuse
        assert (
            settings_parse.parse_hyperparameters({"precision": "fp8", "fp8_recipe": "mxfp8"}, sm=sm)[
                "fp8_recipe"
            ]
            == "mxfp8"
        )
    # the recipe is read only with precision fp8; auto is current scaling on Hopper
    settings_parse.parse_hyperparameters({"precision": "bf16", "fp8_recipe": "mxfp8"}, sm=(9, 0))
    settings_parse.parse_hyperparameters({"precision": "fp8", "fp8_recipe": "auto"}, sm=(9, 0))
