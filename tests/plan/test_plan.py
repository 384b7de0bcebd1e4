"""The memory/time/cost plan (training.plan): its closed form against traced steps, the issue's refusals and
acceptance, the advice (each suggestion is re-checked to fit), the time and cost arithmetic, and its CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from training.contract import hardware, settings_parse, settings_table, shapes
from training.measure import plan_agreement
from training.models import registry
from training.plan import (
    advice,
    band,
    estimate,
    inputs,
    memory,
    memory_attention,
    memory_terms,
    refusal,
    report,
)
from training.plan import timing as plan_timing

EIGHT_B_NO_AC_B200 = {  # the issue's first example: ~290+ GB of activations per GPU against 180 GB
    "hyperparameters": {"model_preset": "8b"},
    "seq_length": 8192,
    "batch_size": 8,
    "activation_checkpointing": False,
    "instance_type": "ml.p6-b200.48xlarge",
}
SIXTY_FOUR_B_P5 = {"hyperparameters": {"model_preset": "64b"}, "instance_type": "ml.p5.48xlarge"}
SEED_HEADLINE = {  # 1b, mxfp8, 8192 tokens, batch 16, AC, one B200 node
    "precision": "mxfp8",
    "seq_length": 8192,
    "batch_size": 16,
    "activation_checkpointing": True,
    "instance_type": "ml.p6-b200.48xlarge",
    "instance_count": 1,
}


def test_plan_imports_no_torch():
    code = "import sys, training.plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    "row",
    [
        plan_agreement.Row("1b", 2, 32_000, 1, True, 8),
        plan_agreement.Row("8b", 2, 128_256, 1, False, 16),
        plan_agreement.Row("8b", 2, 256, 1, True, 8, seq=4096),
        # fp32 computes in 4 bytes (activations, gathered weights, gradients): 44% under when taken as bf16
        plan_agreement.Row("1b", 2, 32_000, 2, True, 8, precision="fp32"),
        plan_agreement.Row("1b", 2, 32_000, 1, False, 8, precision="fp32", loss_chunk_tokens=0),
        # RoPE's rotated query and key are saved per layer (the default); NoPE saves neither
        plan_agreement.Row("1b", 2, 32_000, 2, False, 8, position_encoding="none"),
        # grouped-query attention (8 key/value heads: narrower QKV, key and value) and tied embeddings (Llama 3.2)
        plan_agreement.Row("llama3.1-8b", 2, 128_256, 1, False, 8),
        plan_agreement.Row("llama3.2-1b", 2, 128_256, 1, False, 16),
        plan_agreement.Row("llama3.2-3b", 2, 128_256, 2, True, 8),
        # selective AC keeps the QKV projection's output: h + 2 x key/value width with grouped-query attention
        plan_agreement.Row("llama3.2-1b", 4, 32_000, 4, "selective", 8),
        # attention_backend math keeps its fp32 score matrix per layer, and two more in its backward
        plan_agreement.Row("llama3.2-1b", 2, 32_000, 2, False, 8, seq=2048, attention="math"),
        plan_agreement.Row("1b", 2, 32_000, 2, True, 8, seq=2048, attention="math"),
        # the other families (2 of their blocks): Qwen 2.5's q/k/v bias; Qwen 3 32B's query wider than its hidden
        # size and its query/key norms; Gemma 3's (1 + w) norms after attention and the MLP, and its first layer
        # windowed (1,024 of 4,096 tokens: a mask, its bias, the key and value repeated), with and without AC
        plan_agreement.Row("qwen2.5-7b", 2, 32_000, 1, False, 8, seq=4096),
        plan_agreement.Row("qwen3-32b", 2, 32_000, 1, True, 8, seq=4096),
        plan_agreement.Row("mistral-7b-v0.3", 2, 32_000, 1, False, 8, seq=4096),
        plan_agreement.Row("gemma3-12b", 2, 32_000, 1, False, 8, seq=4096),
        plan_agreement.Row("gemma3-12b", 2, 32_000, 2, True, 8, seq=4096),
    ],
    ids=lambda row: row.label(),
)
def test_closed_form_within_5_percent_of_the_traced_step(row):
    """Two layers instead of the preset's 16/32 (the trace's time grows with layers; every per-layer term is in)."""
    result = plan_agreement.evaluate(row)
    assert abs(result["difference"]) <= plan_agreement.TOLERANCE, result


def test_agreement_table_has_at_least_12_traced_rows_covering_the_grid():
    traced = [r for r in plan_agreement.ROWS if r.traceable]
    assert len(traced) >= 12
    for attribute, values in (
        ("preset", {"1b", "8b"}),
        ("batch", {1, 4}),
        ("ac", {True, False}),
        ("world", {8, 16}),
        ("vocab", {32_000, 128_256}),
    ):
        assert {getattr(r, attribute) for r in traced} >= values, attribute


def test_the_issues_two_examples_are_refused_with_advice_that_fits():
    for request in (EIGHT_B_NO_AC_B200, SIXTY_FOUR_B_P5):
        planned = estimate.make_plan(request, max_instance_count=4)
        line = refusal.refusal(planned)
        assert line is not None and not planned.memory.fits
        assert line.startswith("memory: estimated peak") and "ignore_memory_estimate" in line
        assert planned.advice, line
    eight_b = estimate.make_plan(EIGHT_B_NO_AC_B200, max_instance_count=4)
    assert (
        eight_b.memory.parts["saved activations"] * memory_terms.GIB / 1e9 > 290
    )  # the issue's "about 290 GB"
    assert eight_b.advice[0].startswith("activation_checkpointing true")
    sixty_four = estimate.make_plan(SIXTY_FOUR_B_P5, max_instance_count=4)
    weights = sum(sixty_four.memory.parts[k] for k in ("sharded parameters", "AdamW state"))
    assert weights * memory_terms.GIB / 1e9 > 80  # the issue's weights + AdamW alone exceed an H100's 80 GB
    assert any(a.startswith("instance_count 3 with activation_checkpointing true") for a in sixty_four.advice)


EIGHT_B_BATCH_2_P5 = {**EIGHT_B_NO_AC_B200, "batch_size": 2, "instance_type": "ml.p5.48xlarge"}
"""Refused on an H100 (80 GB), fits on GPUs with more memory: the advice names instance types too."""


@pytest.mark.parametrize("request_", [EIGHT_B_NO_AC_B200, SIXTY_FOUR_B_P5, EIGHT_B_BATCH_2_P5])
def test_every_suggestion_fits_when_applied(request_):
    setup = inputs.setup_from_request(request_)
    lines = advice.advice(setup, max_instance_count=4, instance_types=tuple(hardware.GPU_INSTANCE_TYPES))
    for line in lines:
        if line.startswith("instance_type "):
            names = line.removeprefix("instance_type ").split(" or ")
            assert names and all(
                memory.estimate_memory(replace(setup, instance_type=n)).fits for n in names
            ), line
            continue
        changed = setup
        for field, value in (
            ("activation_checkpointing", "activation_checkpointing true" in line),
            ("batch_size", int(line.split()[1]) if line.startswith("batch_size") else None),
            ("instance_count", int(line.split()[1]) if line.startswith("instance_count") else None),
        ):
            if value:
                changed = replace(changed, **{field: value})
        assert changed != setup and memory.estimate_memory(changed).fits, line
    assert lines and not memory.estimate_memory(setup).fits
    if request_ is EIGHT_B_BATCH_2_P5:
        assert any(line.startswith("instance_type ml.p6-b200.48xlarge") for line in lines), lines


def test_the_seed_headline_configuration_is_accepted():
    planned = estimate.make_plan(SEED_HEADLINE)
    assert planned.memory.fits and refusal.refusal(planned) is None and planned.advice == []
    assert planned.setup.world_size == 8


def test_loss_term_is_bounded_by_the_chunk():
    setup = inputs.setup_from_request(SEED_HEADLINE)
    assert setup.loss_chunk_tokens == settings_table.HYPERPARAMETERS_BY_NAME["loss_chunk_tokens"].default
    unchunked = replace(setup, loss_chunk_tokens=0)
    tokens = 16 * 8192
    assert memory.loss_bytes(unchunked) == 12 * 32_000 * tokens
    assert memory.loss_bytes(replace(setup, loss_chunk_tokens=4096)) == 6 * 32_000 * 4096 + 4 * tokens
    assert memory.loss_bytes(replace(setup, loss_chunk_tokens=10**6)) == 6 * 32_000 * tokens + 4 * tokens
    assert memory.estimate_memory(setup).tensors_gib < memory.estimate_memory(unchunked).tensors_gib / 2
    request = {**SEED_HEADLINE, "hyperparameters": {"loss_chunk_tokens": "0"}}
    assert inputs.setup_from_request(request).loss_chunk_tokens == 0


def test_rope_and_fp32_terms():
    bf16 = inputs.setup_from_request(
        {**SEED_HEADLINE, "precision": "bf16", "activation_checkpointing": False}
    )
    nope = replace(bf16, position_encoding="none")
    h = bf16.shape.hidden_size
    assert (
        memory.layer_activation_bytes(bf16) - memory.layer_activation_bytes(nope) == 4 * h
    )  # rotated q and k
    assert memory_attention.rope_layer_bytes(nope) == memory_attention.rope_table_bytes(nope) == 0
    fp32 = replace(bf16, precision="fp32")
    assert fp32.compute_bytes == 4 and bf16.compute_bytes == 2
    assert memory.estimate_memory(fp32).tensors_gib > 1.5 * memory.estimate_memory(bf16).tensors_gib


def test_te_precisions_add_quantized_weight_copies_and_shrink_saved_inputs():
    bf16 = inputs.setup_from_request(
        {**SEED_HEADLINE, "precision": "bf16", "activation_checkpointing": False}
    )
    mxfp8 = replace(bf16, precision="mxfp8")
    assert memory.layer_activation_bytes(mxfp8) < memory.layer_activation_bytes(bf16)
    assert memory.estimate_memory(mxfp8).parts["quantized weight copies"] == pytest.approx(
        16 * (1 + 1 / 32) * bf16.shape.block_parameter_count() / memory_terms.GIB
    )
    quantized = replace(mxfp8, quantized_model_init=True)
    assert (
        memory.estimate_memory(quantized).parts["sharded parameters"]
        < memory.estimate_memory(mxfp8).parts["sharded parameters"]
    )
    # NVFP4 keeps its first and last nvfp4_bf16_blocks in bf16: they save bf16 activations
    nvfp4 = replace(bf16, precision="nvfp4")
    edges = memory.saved_per_block(nvfp4)
    assert nvfp4.high_precision_blocks == {0, nvfp4.shape.num_layers - 1}
    per_token = memory.layer_activation_bytes(bf16) - memory.layer_activation_bytes(nvfp4)
    assert edges[0] == edges[-1] == edges[1] + per_token * nvfp4.tokens and per_token > 0
    assert memory.saved_per_block(replace(nvfp4, nvfp4_bf16_blocks=0))[0] == edges[1]
    # quantized primary weights: the blocks' fp32 masters sit with AdamW's moments (master_weights.py)
    blocks = bf16.shape.parameter_count() - bf16.shape.root_parameter_count()
    step = memory._moments(quantized)["optimizer step"]
    assert step["AdamW state"] - memory._moments(mxfp8)["optimizer step"]["AdamW state"] == pytest.approx(
        4 * blocks / quantized.world_size
    )


def test_throughput_reproduces_the_seed_figures_and_cost_is_price_times_time():
    # The seed's runs had an unchunked loss; the chunked one adds a second head GEMM (2hV FLOPs per token).
    headline = replace(inputs.setup_from_request(SEED_HEADLINE), loss_chunk_tokens=0)
    assert plan_timing.estimate_time(headline).tokens_per_sec_per_gpu == pytest.approx(51_000)
    batch_one = replace(headline, batch_size=1, activation_checkpointing=False)
    assert plan_timing.estimate_time(batch_one).tokens_per_sec_per_gpu == pytest.approx(6_000)
    chunked = replace(headline, loss_chunk_tokens=4096)
    extra = 2 * 2048 * 32_000 / shapes.flops_per_token(headline.shape, 8192)
    assert plan_timing.estimate_time(chunked).tokens_per_sec_per_gpu == pytest.approx(51_000 / (1 + extra))
    # fp32 GEMMs run at the GPU's fp32 peak (no TF32), not its bf16 peak
    fp32 = plan_timing.estimate_time(replace(headline, precision="fp32")).tokens_per_sec_per_gpu
    assert fp32 == pytest.approx(
        51_000 * hardware.PEAK_TFLOPS["B200"]["fp32"] / hardware.PEAK_TFLOPS["B200"]["bf16"]
    )
    timing = plan_timing.estimate_time(replace(headline, instance_count=2, max_steps=500))
    assert timing.step_seconds == pytest.approx(16 * 8192 / timing.tokens_per_sec_per_gpu)
    assert timing.run_seconds == pytest.approx(500 * timing.step_seconds)
    price = hardware.ON_DEMAND_USD_PER_HOUR["ml.p6-b200.48xlarge"]
    assert timing.cost_usd == pytest.approx(price * 2 * timing.run_seconds / 3600)
    assert plan_timing.estimate_time(replace(headline, instance_type="ml.p6-b300.48xlarge")).cost_usd is None


def test_a_run_longer_than_max_runtime_gets_a_warning_naming_the_step_it_reaches():
    setup = replace(inputs.setup_from_request(SEED_HEADLINE), max_steps=100_000, max_runtime_seconds=3600)
    timing = plan_timing.estimate_time(setup)
    reached = int(3600 // timing.step_seconds)
    assert timing.warning is not None and f"near step {reached}" in timing.warning
    assert plan_timing.estimate_time(replace(setup, max_runtime_seconds=10**7)).warning is None


def test_bad_settings_are_named():
    with pytest.raises(settings_table.ContractError, match="instance_type"):
        inputs.setup_from_request({"instance_type": "ml.g5.xlarge"})
    with pytest.raises(settings_table.ContractError, match="batch_size"):
        inputs.setup_from_request({"batch_size": 0})


def test_cli_prints_the_plan_and_json(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(EIGHT_B_NO_AC_B200))
    assert report.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "DOES NOT FIT" in text and "saved activations" in text and "fits with:" in text
    assert report.main([str(path), "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["fits"] is False and as_json["parts_gib"]["saved activations"] > 300
    path.write_text("[1]")
    assert report.main([str(path)]) == 2


def test_the_llama_plans_table_says_what_fits_on_one_and_two_b200_instances(capsys):
    from training.measure import preset_plans

    assert (
        preset_plans.main(["--presets", "llama3.1-8b,llama3.1-70b", "--seq", "8192", "--instances", "1,2"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 8 and lines[0].startswith("| preset | instances (GPUs) | AC |")
    seventy = [line for line in lines if line.startswith("| llama3.1-70b |")]
    # with AC only: on one instance at the edge (fused AdamW, no foreach temporaries), on two with room
    assert [("| yes |" in line) for line in seventy] == [False, True, False, True]
    assert all("| yes |" in line for line in lines if line.startswith("| llama3.1-8b |"))
    # every figure an estimate with its low-high band from the plan's spread (none is the article's configuration)
    assert "tokens/s per GPU, estimate (low-high)" in lines[0]
    top = preset_plans.row("llama3.1-8b", 8192, 1, False, "bf16")
    low, high = top["tokens_per_sec_per_gpu_band"]
    assert (
        round(low) <= top["tokens_per_sec_per_gpu"] <= round(high)
        and f"{top['tokens_per_sec_per_gpu']:,} ({low:,.0f}-" in lines[2]
    )


def test_selective_ac_counts_grouped_query_attentions_narrower_key_and_value():
    """The QKV output a selective block keeps is h + 2kv wide, and the recompute's share of a block's forward
    FLOPs has 2h^2 + 2h kv (not 4h^2) for the attention projections."""
    llama = inputs.setup_from_request(
        {"activation_checkpointing": "selective", "seq_length": 8192,
         "hyperparameters": {"model_preset": "llama3.1-8b"}}
    )  # fmt: skip
    h, f, kv, nh = 4096, 14336, 8 * 128, 32
    assert (llama.shape.hidden_size, llama.shape.kv_heads * llama.shape.head_dim) == (h, kv)
    assert memory.selective_saved_bytes(llama) == 2 * (3 * h + 2 * kv + 2 * f) + 4 * nh
    share = (h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h * 8192)
    assert plan_timing.recompute_overhead(llama) == pytest.approx(
        1 + (band.AC_OVERHEAD - 1) * share, rel=1e-12
    )
    without_gqa = replace(llama, shape=replace(llama.shape, num_kv_heads=None))
    assert memory.selective_saved_bytes(without_gqa) == 2 * (5 * h + 2 * f) + 4 * nh
    # the recompute share slows the step and lowers the MFU the run would report (model FLOPs, GQA's counted)
    none = plan_timing.estimate_time(replace(llama, activation_checkpointing="none"))
    selective = plan_timing.estimate_time(llama)
    slower = plan_timing.recompute_overhead(llama)
    assert 1.0 < slower < band.AC_OVERHEAD
    assert selective.step_seconds == pytest.approx(none.step_seconds * slower, rel=1e-12)
    assert selective.mfu_bf16 == pytest.approx(none.mfu_bf16 / slower, rel=1e-12)
    flops = shapes.flops_per_token(llama.shape, 8192)
    assert (
        flops
        == 6 * (32 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h + 128_256 * h) + 12 * 32 * h * 8192
    )
    peak = hardware.PEAK_TFLOPS["B200"]["bf16"] * 1e12
    assert selective.mfu_bf16 == pytest.approx(selective.tokens_per_sec_per_gpu * flops / peak, rel=1e-12)


def test_math_attention_counts_its_score_matrix_and_refuses_what_cannot_fit():
    """The review's example: math attention at 8K, micro-batch 4, the 1b preset keeps a 16 GiB fp32 score matrix per
    layer; without activation checkpointing that cannot fit a B200, with it it does."""
    from training.request.decision import validate_request
    from training.request.rules import RequestRules

    request = {"batch_size": 4, "seq_length": 8192, "hyperparameters": {"attention_backend": "math"}}
    setup = inputs.setup_from_request(request)
    per_layer = memory_attention.math_attention_bytes(setup) * setup.tokens / memory_terms.GIB
    assert (
        per_layer == 16.0 + 0.75 - 1 / 512
    )  # the scores (16 heads x 8192 x 4 bytes a token), fp32 q, k, v, no LSE
    assert memory_attention.math_attention_bytes(replace(setup, attention_backend="auto")) == 0.0
    (refused,) = validate_request(request, RequestRules())
    assert refused.startswith("memory: estimated peak 372.0 GiB per GPU (saved activations 308.6, ")
    assert "at last block backward, in its attention (math)" in refused
    assert "fits with: activation_checkpointing true" in refused
    assert validate_request({**request, "activation_checkpointing": True}, RequestRules()) == []
    flash = memory.estimate_memory(inputs.setup_from_request({**request, "hyperparameters": {}}))
    assert flash.fits and flash.peak_gib < 100  # the same request with the default kernel


def test_a_run_whose_plan_cannot_finish_one_optimizer_step_in_its_time_limit_is_refused():
    from training.request.decision import validate_request
    from training.request.rules import RequestRules

    (refused,) = validate_request({"hyperparameters": {"grad_accum_steps": "65536"}}, RequestRules())
    assert refused.startswith(
        "max_runtime_seconds: the plan expects one optimizer step to take 25:14:11 (536,870,912 tokens per GPU: "
        "grad_accum_steps 65536 x batch_size 1 x seq_length 8192, at about 5,909 tokens/s per GPU, estimate), more "
        "than the run's limit of 24:00:00: it would be stopped before its first step; raise max_runtime_seconds"
    )
    longer = {"hyperparameters": {"grad_accum_steps": "65536"}, "max_runtime_seconds": 26 * 3600}
    assert (
        validate_request(longer, RequestRules()) == []
    )  # one step fits: the plan only warns about max_steps


@pytest.mark.parametrize("lora", [{}, {"lora_rank": "64"}], ids=["full", "lora"])
@pytest.mark.parametrize(("instances", "replicate"), [(1, "auto"), (4, "1"), (4, "4")])
def test_math_attention_is_counted_under_lora_and_every_layout(lora, instances, replicate):
    """Math's score matrix is activations: the same bytes per token whatever the data-parallel layout and with LoRA's
    adapters; the peak is inside its attention, and math's request that cannot fit is refused on any layout."""
    from training.request.decision import validate_request
    from training.request.rules import RequestRules

    hyperparameters = {"attention_backend": "math", "data_parallel_replicate": replicate, **lora}
    request = {
        "instance_count": instances,
        "batch_size": 2,
        "seq_length": 8192,
        "hyperparameters": hyperparameters,
    }
    math_setup = inputs.setup_from_request({**request, "activation_checkpointing": True})
    flash_setup = replace(math_setup, attention_backend="auto")
    assert math_setup.lora_rank == (64 if lora else 0)
    # micro-batch 2: half the review's example per layer (the scores, fp32 q, k, v, no LSE)
    assert (
        memory_attention.math_attention_bytes(math_setup) * math_setup.tokens / memory_terms.GIB
        == (16.0 + 0.75 - 1 / 512) / 2
    )
    math_memory, flash_memory = memory.estimate_memory(math_setup), memory.estimate_memory(flash_setup)
    assert math_memory.moment.endswith("in its attention (math)")
    assert (
        math_memory.peak_gib - flash_memory.peak_gib > 16.0
    )  # two 8 GiB fp32 score matrices in flight at least
    (refused,) = validate_request(request, RequestRules())  # no checkpointing: every layer's scores kept
    assert refused.startswith("memory: estimated peak ") and "in its attention (math)" in refused


@pytest.mark.parametrize("lora", [{}, {"lora_rank": "16"}], ids=["full", "lora"])
@pytest.mark.parametrize("replicate", ["1", "2"])
def test_a_step_longer_than_the_time_limit_is_refused_on_several_instances(lora, replicate):
    """On 2 instances (sharded over all 16 GPUs, or one replica per instance), with or without LoRA, the step time
    the check compares is the plan's, network included."""
    from training.request.decision import decide_request
    from training.request.rules import RequestRules

    hyperparameters = {"grad_accum_steps": "4096", "data_parallel_replicate": replicate, **lora}
    request = {
        "instance_count": 2,
        "batch_size": 8,
        "max_runtime_seconds": 3600,
        "hyperparameters": hyperparameters,
    }
    decision = decide_request(request, RequestRules())
    (refused,) = decision.problems
    step = decision.plan["step_seconds"]
    assert 3600 < step < 3 * 3600 and decision.plan["data_parallel"]["replicate"] == int(replicate)
    assert refused.startswith("max_runtime_seconds: the plan expects one optimizer step to take 1:")
    assert (
        "(268,435,456 tokens per GPU: grad_accum_steps 4096 x batch_size 8 x seq_length 8192, at about "
        in refused
    )
    ok = decide_request({**request, "max_runtime_seconds": int(step) + 3600}, RequestRules())
    assert ok.valid, ok.problems


def test_only_the_articles_own_configurations_are_published_and_every_other_figure_is_an_estimate_with_a_band():
    headline = replace(inputs.setup_from_request(SEED_HEADLINE), loss_chunk_tokens=0)
    batch_one = replace(headline, batch_size=1, activation_checkpointing=False)
    for point in (headline, batch_one):
        timing = plan_timing.estimate_time(point)
        assert timing.basis == "published" and timing.spread is None
        assert timing.source == band.REFERENCE_SOURCE and band.REFERENCE_URL in timing.source
    others = {
        "the default chunked loss": replace(headline, loss_chunk_tokens=2048),
        "batch 16 without AC": replace(headline, activation_checkpointing=False),
        "batch 1 with AC": replace(batch_one, activation_checkpointing=True),
        "AC on every other block": replace(headline, activation_checkpointing_interval=2),
        "bf16": replace(headline, precision="bf16"),
        "two instances": replace(headline, instance_count=2),
        "H100": replace(headline, instance_type="ml.p5.48xlarge"),
        "8b": replace(headline, shape=shapes.MODEL_PRESETS["8b"]),
        "LoRA": replace(headline, lora_rank=16, lora_targets=("q_proj", "v_proj")),
        "a tiny model": replace(batch_one, shape=shapes.ModelShape(2, 64, 2, 256, 256), seq_length=256),
    }
    for why, setup in others.items():
        t = plan_timing.estimate_time(setup)
        assert t.basis == "estimate" and t.spread is not None, why
        assert t.source == "scaled from " + band.REFERENCE_SOURCE, why
        low, high = t.spread.tokens_per_sec_per_gpu
        assert low <= t.tokens_per_sec_per_gpu <= high and low < high, why
        assert t.spread.step_seconds == pytest.approx((setup.tokens / high, setup.tokens / low)), why
        assert t.spread.run_seconds == pytest.approx(
            tuple(v * setup.max_steps for v in t.spread.step_seconds)
        )
        assert "MFU" in t.spread.assumptions, why
    # the tiny model: the centre holds the article's smaller point's MFU, the low end continues its trend down
    tiny = plan_timing.estimate_time(others["a tiny model"]).spread
    assert tiny is not None and tiny.tokens_per_sec_per_gpu[1] / tiny.tokens_per_sec_per_gpu[0] > 100


def test_the_band_names_its_sources_per_precision_and_gpu():
    headline = replace(inputs.setup_from_request(SEED_HEADLINE), loss_chunk_tokens=2048)
    b200 = plan_timing.estimate_time(headline).spread
    h100 = plan_timing.estimate_time(
        replace(headline, instance_type="ml.p5.48xlarge", precision="bf16")
    ).spread
    assert b200 is not None and h100 is not None
    assert band.TORCHAO_B200 in b200.assumptions and "mxfp8" in b200.assumptions
    assert (
        band.TORCHTITAN_H100 in h100.assumptions and "39.0% MFU" in h100.assumptions
    )  # torchtitan's 8B, compiled
    # the published peer figures read as MFU with this project's FLOPs count: torchtitan says 33-39% on H100
    by_gpu = {(p.gpus[0], p.precision): p.mfu_bf16 for p in band.PEER_FIGURES}
    assert 0.38 < by_gpu[("H100", "bf16")] < 0.40 and 0.21 < by_gpu[("B200", "bf16")] < 0.22
    # a higher published MFU widens only the high end: H100's band reaches higher over the article's curve
    assert h100.mfu_bf16[1] / plan_timing.estimate_time(replace(headline, instance_type="ml.p5.48xlarge",
                                                         precision="bf16")).mfu_bf16 > 1.5  # fmt: skip
    fp32 = plan_timing.estimate_time(replace(headline, precision="fp32")).spread
    assert fp32 is not None and "no published figure" in fp32.assumptions


def test_lora_step_time_comes_from_loras_flops():
    """The frozen weights run their forward and input-gradient GEMMs only (4N, plus 6 per adapter parameter): at
    the same MFU the step takes that share of full fine-tuning's work, not 6N's."""
    full = replace(
        inputs.setup_from_request(SEED_HEADLINE), loss_chunk_tokens=0, activation_checkpointing=False
    )
    lora = replace(full, lora_rank=16, lora_targets=("q_proj", "v_proj"))
    adapters = memory.lora_block_parameters(lora) * lora.shape.num_layers
    lora_flops = shapes.flops_per_token(lora.shape, 8192, adapters)
    assert lora_flops < 0.8 * shapes.flops_per_token(full.shape, 8192)  # 6N -> 4N, attention unchanged
    expected = band._reference_mfu(lora.tokens * lora_flops) * hardware.PEAK_TFLOPS["B200"]["bf16"] * 1e12
    timing = plan_timing.estimate_time(lora)
    assert timing.tokens_per_sec_per_gpu == pytest.approx(expected / lora_flops)
    assert timing.step_seconds == pytest.approx(lora.tokens / timing.tokens_per_sec_per_gpu)
    # the MFU the run would report counts the same FLOPs, so it is the curve's own
    assert timing.mfu_bf16 == pytest.approx(band._reference_mfu(lora.tokens * lora_flops))
    assert timing.step_seconds < plan_timing.estimate_time(full).step_seconds


@pytest.mark.parametrize("name", [n for n, size in registry.SIZES.items() if size.family != "llama3"])
def test_each_familys_named_size_is_planned_with_its_own_counts(name):
    """The plan of a named size of another family than Llama counts that model: its parameters (equal to
    transformers', ``tests/models/test_transformers.py``), its FLOPs per token (the query's width, a
    sliding-window layer at its window) and its LoRA adapters' shapes; and the plan's output names the count."""
    size = registry.named_size(name)
    request = {
        "activation_checkpointing": True,
        "instance_count": 2,
        "hyperparameters": {"model_preset": name},
    }
    setup = inputs.setup_from_request(request)
    assert setup.shape == size
    assert plan_timing.work_flops_per_token(setup) == size.flops_per_token(setup.seq_length)
    unwindowed = replace(size, layer_types=("full",) * size.num_layers)
    windowed = "sliding" in size.layer_types and size.sliding_window < setup.seq_length
    assert (size.flops_per_token(8192) < unwindowed.flops_per_token(8192)) == windowed
    lora = inputs.setup_from_request({**request, "hyperparameters": {"model_preset": name, "lora_rank": "8"}})
    q_rows, q_cols = size.projection_shapes()["q_proj"]
    assert memory.lora_block_parameters(lora) >= 8 * (q_rows + q_cols)
    assert memory.lora_block_parameters(lora) == size.lora_block_parameter_count(8, lora.lora_targets)
    # the trainer's MFU and the tuning report count the same (shapes.flops_per_token of the run's model)
    values = settings_parse.parse_hyperparameters({"model_preset": name, "lora_rank": "8"})
    assert settings_parse.lora_parameters(values) == size.num_layers * memory.lora_block_parameters(lora)
    assert shapes.flops_per_token(settings_parse.model_shape(values), 8192) == size.flops_per_token(8192)
    assert shapes.MODEL_PRESETS[name].head_dim == size.head_dim
    assert estimate.make_plan(request).to_dict()["parameters"] == size.parameter_count()


@pytest.mark.parametrize("ac", [False, True])
def test_a_windowed_mistral_is_planned_within_5_percent_of_its_trace(ac):
    """Mistral with a ``sliding_window`` shorter than the sequence (v0.1's 4,096; here 1,024 of 4,096 tokens on 2
    blocks, as an ``init_from`` folder would give it): every layer takes the mask, keeps its bias and the key and
    value repeated to its 32 query heads."""
    from training.measure import memory_trace
    from training.models import settings as model_settings

    size = registry.named_size("mistral-7b-v0.3").trimmed(2, 32_000)
    windowed = replace(size, layer_types=("sliding", "sliding"), sliding_window=1024)
    architecture = model_settings.to_settings(windowed)
    request = {"precision": "bf16", "num_layers": 2, "batch_size": 1 + ac, "seq_length": 4096,
               "activation_checkpointing": ac, "instance_type": hardware.DEFAULT_INSTANCE_TYPE}  # fmt: skip
    setup = inputs.setup_from_request(request, architecture)
    closed = memory.estimate_memory(setup).tensors_gib
    unwindowed = memory.estimate_memory(inputs.setup_from_request(request, model_settings.to_settings(size)))
    assert closed > unwindowed.tensors_gib  # the masks are counted
    traced = memory_trace.trace_request(request, architecture)["peak_gib"]
    assert abs(closed / traced - 1) <= plan_agreement.TOLERANCE, (closed, traced)
