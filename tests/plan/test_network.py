"""The network model (training.plan.network), the plan's layout hook (data_parallel_replicate, per-layout
memory, the exposed network time) and the layout comparison (training.plan.layouts): closed form, no torch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from training.contract import settings_table
from training.plan import estimate, inputs, layouts, memory, network, report, timing

B200 = network.INTERCONNECTS["ml.p6-b200.48xlarge"]
GB = 1e9


def request(preset="llama3.1-8b", count=2, batch=2, ac="none", **settings):
    return {
        "instance_type": "ml.p6-b200.48xlarge",
        "instance_count": count,
        "precision": "bf16",
        "seq_length": 8192,
        "batch_size": batch,
        "activation_checkpointing": ac,
        "hyperparameters": {"model_preset": preset, **settings},
    }


def test_a_shard_group_inside_one_instance_sends_nothing_over_efa():
    layout = network.Layout(nodes=2, gpus=8, replicate=2)
    traffic = network.gather(8 * GB, layout, size=layout.shard)
    assert traffic.node_bytes == 0.0
    assert traffic.gpu_bytes == pytest.approx(8 * GB * 7 / 8)


def test_full_sharding_over_two_instances_moves_a_rings_share_into_each():
    layout = network.Layout(nodes=2, gpus=8, replicate=1)
    traffic = network.gather(8 * GB, layout, size=layout.shard)
    assert traffic.node_bytes == pytest.approx(
        8 * GB * 15 / 16
    )  # N (k-1)/k: the ring's one entry, not N (m-1)/m
    assert traffic.gpu_bytes == pytest.approx(8 * GB * 15 / 16)


def ring_bytes_into_each_instance(
    layout: network.Layout, size: int, consecutive: bool, total: float
) -> float:
    """NCCL's ring all-gather simulated: each group's ranks in a ring ordered by instance (NCCL's rings keep an
    instance's GPUs together), ``size - 1`` steps in each of which every rank passes one ``total / size`` chunk
    to the next; the bytes that cross into each instance, the busiest one's."""
    into: dict[int, float] = {}
    for group in network._groups(layout, size, consecutive):
        ring = sorted(group, key=lambda rank: (rank // layout.gpus, rank))
        for _ in range(size - 1):
            for position, rank in enumerate(ring):
                nxt = ring[(position + 1) % size]
                if rank // layout.gpus != nxt // layout.gpus:
                    into[nxt // layout.gpus] = into.get(nxt // layout.gpus, 0.0) + total / size
    return max(into.values(), default=0.0)


@pytest.mark.parametrize(
    ("nodes", "gpus", "replicate"),
    [(2, 8, 1), (2, 8, 2), (2, 8, 16), (4, 8, 4), (4, 8, 2), (3, 8, 2), (4, 1, 1)],
)
def test_the_efa_bytes_are_nccls_ring_moved_chunk_by_chunk(nodes, gpus, replicate):
    """Issue 53 item 15: the per-instance EFA bytes were the lower bound ``N (m-1)/m``, which a ring with several
    ranks per instance exceeds about twice. Each of the layout's collectives now moves what NCCL's ring does,
    counted here chunk by chunk."""
    layout = network.Layout(nodes=nodes, gpus=gpus, replicate=replicate)
    shards = network.gather(8 * GB, layout, size=layout.shard)
    assert shards.node_bytes == pytest.approx(
        ring_bytes_into_each_instance(layout, layout.shard, True, 8 * GB)
    )
    replicas = network.gather(8 * GB, layout, size=layout.replicate, consecutive=False)
    simulated = ring_bytes_into_each_instance(layout, layout.replicate, False, 8 * GB)
    assert replicas.node_bytes == pytest.approx(simulated)


def test_one_group_of_every_rank_moves_about_twice_what_one_replica_per_instance_moves():
    """replicate 16 x shard 1 and replicate 2 x shard 8 on two instances of 8 showed the same EFA bytes; the first's
    all-reduce is one ring of 16 that enters each instance with 15/16 of the gradient twice, the second's eight
    rings of 2 carry an eighth each, once per instance."""
    model = network.Model(block_params=200_000_000, root_params=0, layers=4, gather_bytes=2.0)
    wide = network.step(model, network.Layout(2, 8, 16), B200, 10.0).node_bytes
    per_instance = network.step(model, network.Layout(2, 8, 2), B200, 10.0).node_bytes
    gradient = 4 * 200_000_000 * 4.0  # fp32
    assert per_instance == pytest.approx(2 * gradient / 8 * 1 / 2 * 8)
    assert wide == pytest.approx(2 * gradient * 15 / 16)
    assert wide / per_instance == pytest.approx(1.875)


def test_a_shard_group_straddling_instances_counts_the_busiest_instances_efa_bytes():
    # 3 instances of 8, replicate 2: shards of 12 ranks, 8 + 4 and 4 + 8; the middle instance holds 4 of each, and
    # each group's ring enters it once: 2 x N 11/12 (before: counted as inside one instance, no EFA)
    layout = network.Layout(nodes=3, gpus=8, replicate=2)
    traffic = network.gather(12 * GB, layout, size=layout.shard)
    assert traffic.node_bytes == pytest.approx(2 * 12 * GB * 11 / 12)
    assert traffic.latency == pytest.approx(network.ring_latency(12, 2))
    # the replicas: rank r and r + 12, on two instances for every r
    assert network.all_reduce(1 * GB, layout).node_bytes > 0


def test_the_replicas_all_reduce_crosses_instances_twice_per_shard():
    layout = network.Layout(nodes=4, gpus=8, replicate=4)
    traffic = network.all_reduce(1 * GB, layout)  # each rank's shard of the gradient
    assert traffic.node_bytes == pytest.approx(2 * 8 * 1 * GB * 3 / 4)  # 2 g D (R-1)/R
    assert traffic.gpu_bytes == pytest.approx(2 * 1 * GB * 3 / 4)


def test_nccl_ring_latency_counts_network_steps():
    assert network.ring_latency(8, 1) == pytest.approx(1e-6 * (8.4 + 7 * 3.4))
    assert network.ring_latency(16, 2) == pytest.approx(1e-6 * (8.4 + 14 * 3.4 + 9.6))


def test_a_layout_must_divide_the_gpus():
    with pytest.raises(ValueError, match="replicate 3 does not divide 16 GPUs"):
        network.Layout(nodes=2, gpus=8, replicate=3)
    assert network.layout_problem(3, 16) == "must divide the number of GPUs (16); got 3"
    assert network.layout_problem(2, 16) is None


MODEL = network.Model(block_params=200_000_000, root_params=1_000_000_000, layers=32, gather_bytes=2.0)


def test_compute_hides_the_block_collectives_but_not_the_first_gather_and_the_last_reduction():
    layout = network.Layout(nodes=2, gpus=8, replicate=1)
    slow = network.step(MODEL, layout, B200, compute_seconds=1e6)
    assert 0 < slow.exposed_seconds < slow.busy_seconds
    assert slow.share == pytest.approx(slow.exposed_seconds / (1e6 + slow.exposed_seconds))
    fast = network.step(MODEL, layout, B200, compute_seconds=0.0)
    assert fast.exposed_seconds == pytest.approx(fast.busy_seconds)
    assert fast.hidden == pytest.approx(0.0)


def test_gradient_accumulation_repeats_full_shardings_inter_instance_gathers_but_not_hybrid_sharding():
    accumulated = replace(MODEL, micro_batches=8)
    full = [network.step(m, network.Layout(4, 8, 1), B200, 10.0).node_bytes for m in (MODEL, accumulated)]
    hybrid = [network.step(m, network.Layout(4, 8, 4), B200, 10.0).node_bytes for m in (MODEL, accumulated)]
    assert full[1] > 3 * full[0]
    assert hybrid[1] == pytest.approx(hybrid[0])


def test_one_instance_moves_nothing_over_efa():
    one = network.step(MODEL, network.Layout(1, 8, 1), B200, 10.0)
    assert one.node_bytes == 0.0 and one.gpu_bytes > 0


def test_lora_reduces_only_the_adapters_gradients():
    """FSDP2 reduces the gradients there are: with LoRA the adapters' alone, so hybrid sharding's all-reduce
    across instances is the adapters' (MB), not the 70B base's (before: 282 GB per instance per step, as full
    fine-tuning's)."""
    full = inputs.setup_from_request(request("llama3.1-70b", batch=1, ac="full", data_parallel_replicate=2))
    adapted = replace(full, lora_rank=16, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    compute = 9.0
    full_net, lora_net = timing.step_network(full, compute), timing.step_network(adapted, compute)
    adapters = memory.lora_block_parameters(adapted) * adapted.shape.num_layers
    # inside each instance the same gathers; across them only the replicas' all-reduce of the adapters' shards
    assert lora_net.node_bytes == pytest.approx(8 * 2 * adapters * 4 / 8 / 2)  # g 2 (D/shard) (R-1)/R, fp32
    assert full_net.node_bytes > 1000 * lora_net.node_bytes
    assert lora_net.gpu_bytes < full_net.gpu_bytes and lora_net.busy_seconds < full_net.busy_seconds
    frozen_root = network.step(replace(MODEL, trained_block_params=0, trained_root_params=0),
                               network.Layout(2, 8, 2), B200, 10.0)  # fmt: skip
    gathers_only = network.step(MODEL, network.Layout(2, 8, 2), B200, 10.0)
    assert frozen_root.node_bytes == 0.0 and frozen_root.busy_seconds < gathers_only.busy_seconds


def test_auto_replicates_per_instance_when_one_instance_holds_the_sharded_states():
    eight_b = inputs.setup_from_request(request())
    assert (eight_b.replicate, eight_b.shard_size) == (2, 8)
    # 70B at micro-batch 4 with AC does not fit on one instance: every state is sharded over all 16 GPUs
    seventy_b = inputs.setup_from_request(request("llama3.1-70b", batch=4, ac="full"))
    assert (seventy_b.replicate, seventy_b.shard_size) == (1, 16)
    assert not memory.estimate_memory(replace(seventy_b, data_parallel_replicate=2)).fits
    assert inputs.setup_from_request(request(count=1)).replicate == 1


def test_the_per_gpu_memory_of_one_replica_per_instance_is_one_instances():
    one = memory.estimate_memory(inputs.setup_from_request(request(count=1)))
    hybrid = memory.estimate_memory(inputs.setup_from_request(request(count=4, data_parallel_replicate=4)))
    full = memory.estimate_memory(inputs.setup_from_request(request(count=4, data_parallel_replicate=1)))
    assert hybrid.peak_gib == pytest.approx(one.peak_gib)
    assert full.peak_gib < hybrid.peak_gib - 5  # sharded parameters and AdamW moments over 32 GPUs, not 8
    assert full.parts["AdamW state"] == pytest.approx(hybrid.parts["AdamW state"] / 4)


def test_a_replicate_count_that_does_not_divide_the_gpus_is_refused_by_name():
    with pytest.raises(settings_table.ContractError) as refused:
        inputs.setup_from_request(request(count=2, data_parallel_replicate=3))
    assert str(refused.value) == (
        "data_parallel_replicate: must divide the number of GPUs (16); got 3 (2 x ml.p6-b200.48xlarge); or leave "
        "it auto"
    )
    spec = settings_table.HYPERPARAMETERS_BY_NAME["data_parallel_replicate"]
    assert spec.parse("auto") == "auto" and spec.parse("AUTO") == "auto" and spec.parse("4") == 4
    with pytest.raises(settings_table.ContractError, match="must be auto or an integer in"):
        spec.parse("0")


def test_the_plan_says_its_layout_and_network_and_adds_only_what_one_instance_would_not_expose():
    one = estimate.make_plan(request(count=1)).to_dict()
    assert one["data_parallel"] == {"replicate": 1, "shard": 8}
    assert one["network"]["efa_gb_per_instance"] == 0.0
    two = estimate.make_plan(request(count=2)).to_dict()
    assert two["data_parallel"] == {"replicate": 2, "shard": 8}
    assert two["network"]["layout"] == "replicate 2 x shard 8" and two["network"]["efa_gb_per_instance"] > 10
    assert "aws.amazon.com/ec2/instance-types/p6" in two["network"]["source"]
    assert 0 < two["network"]["share"] < 0.05
    # the article's points are one instance's: one instance's own exposure is not added again
    base = inputs.setup_from_request(request(count=1))
    unlinked = timing.estimate_time(replace(base, instance_type="ml.p6e-gb200.36xlarge"))  # no network model
    assert unlinked.network is None
    assert one["step_seconds"] == pytest.approx(base.tokens / one["tokens_per_sec_per_gpu"], rel=1e-3)
    assert two["step_seconds"] > one["step_seconds"]


def test_the_plans_text_names_the_layout_and_its_network():
    text = report.format_plan(estimate.make_plan(request(count=2)))
    assert "network per step (replicate 2 x shard 8): " in text and "GB per instance over EFA" in text
    assert "for 2 x ml.p6-b200.48xlarge" in text  # the time and cost are both instances'


@pytest.mark.parametrize(
    ("instance_type", "why"),
    [
        ("ml.p6e-gb200.36xlarge", "its NVLink domain spans the UltraServer's instances (up to 72 GPUs)"),
        ("ml.p5.4xlarge", "one GPU per instance, so every collective crosses the network"),
    ],
)
def test_an_instance_type_without_published_links_says_why_its_time_and_cost_are_a_floor(instance_type, why):
    """Issue 53 item 15: two ml.p5.4xlarge or two ml.p6e-gb200.36xlarge printed no network line and no reason,
    and time and cost with nothing to say they leave the collectives out."""
    req = {**request(preset="1b", count=2), "instance_type": instance_type}
    planned = estimate.make_plan(req)
    assert planned.timing.network is None
    note = planned.to_dict()["network_note"]
    assert note == (f"not estimated for 2 x {instance_type}: {why}{note.split(why, 1)[1]}") and note.endswith(
        "the step time, run time and cost leave out the collectives' time (a floor for 2 instances)"
    )
    text = report.format_plan(planned)
    assert f"network per step: {note}" in text and f"for 2 x {instance_type}" in text
    one_gpu = estimate.make_plan({**req, "instance_type": "ml.p5.4xlarge", "instance_count": 1}).to_dict()
    assert one_gpu["network_note"] is None and "network" not in report.format_plan(estimate.make_plan(
        {**req, "instance_type": "ml.p5.4xlarge", "instance_count": 1}))  # fmt: skip


def test_layouts_compares_full_and_hybrid_sharding_and_marks_autos_choice():
    rows = layouts.compare(request(count=4))
    assert [(r.setup.replicate, r.setup.shard_size, r.auto) for r in rows] == [(1, 32, False), (4, 8, True)]
    assert [r.setup.replicate for r in layouts.compare(request(count=1))] == [1]
    hours, cost = rows[1].hours_and_cost()
    assert hours > 0 and cost is not None and cost > 0
    args = layouts.parse_args(["--preset", "llama3.1-8b", "--nodes", "1,2", "--batch", "2"])
    text = layouts.table(args)
    assert text.splitlines()[0] == layouts.HEADER[0]
    assert len(text.splitlines()) == 2 + 3
    assert "replicate 2 x shard 8 (auto)" in text
    bands = rows[1].bands()  # an estimate: throughput, step, hours and cost each with its low-high band
    assert bands is not None and bands["hours"][0] <= hours <= bands["hours"][1]
    assert bands["cost"] is not None and bands["cost"][0] <= cost <= bands["cost"][1]
    assert f"({bands['tokens_per_sec_per_gpu'][0]:,.0f}-" in layouts.format_row(rows[1])


def test_tune_compares_the_layouts_on_several_instances():
    from training.request import tuning

    assert "data_parallel_replicate" not in tuning.default_space("ml.p6-b200.48xlarge")
    assert tuning.default_space("ml.p6-b200.48xlarge", 4)["data_parallel_replicate"] == (1, 4)
    settings, problems = tuning.parse_tune({}, "ml.p6-b200.48xlarge", instance_count=2)
    assert problems == [] and settings is not None
    assert settings.search_space["data_parallel_replicate"] == (1, 2)
    values, setup = inputs.parse_request(request(count=2))
    found = tuning.candidates(values, setup, {"data_parallel_replicate": [1, 2]})
    by_layout = {c.overrides["data_parallel_replicate"]: c.plan for c in found.ranked}
    assert set(by_layout) == {1, 2}
    assert by_layout[1].memory.peak_gib < by_layout[2].memory.peak_gib
    assert by_layout[1].timing.network.layout.describe() == "shard 16"


def test_the_request_check_refuses_a_layout_that_does_not_divide_the_jobs_gpus_and_plans_the_rest():
    from training.request.decision import prepare_request, validate_request
    from training.request.rules import RequestRules

    rules = RequestRules(region="us-west-2", bucket_name="my-bucket", workflow_segment="Test").with_limits()
    wrong = {"instance_count": 2, "hyperparameters": {"data_parallel_replicate": "3"}}
    assert validate_request(wrong, rules) == [
        "hyperparameters.data_parallel_replicate: must divide the number of GPUs (16); got 3 "
        "(2 x ml.p6-b200.48xlarge); or leave it auto"
    ]
    prepared = prepare_request(
        {"instance_count": 2, "hyperparameters": {"model_preset": "llama3.1-8b"}}, rules
    )
    assert prepared.problems == []
    assert prepared.plan["data_parallel"] == {"replicate": 2, "shard": 8}
    assert prepared.plan["network"]["layout"] == "replicate 2 x shard 8"


def test_a_tuning_run_on_several_instances_compares_the_layouts_by_default():
    """The request's ``tune`` block is parsed with its instance count: the default search space has full sharding
    and one replica per instance, and each trial is planned on its layout."""
    from training.request.decision import decide_request
    from training.request.rules import RequestRules

    rules = RequestRules(region="us-west-2", bucket_name="my-bucket", workflow_segment="Test").with_limits()
    base = {"instance_count": 2, "hyperparameters": {"model_preset": "llama3.1-8b", "max_steps": "200"}}
    decision = decide_request({**base, "tune": {}}, rules)
    assert decision.valid, decision.problems
    assert decision.request.tune.settings.search_space["data_parallel_replicate"] == (1, 2)
    trials = decision.tune["plan"]["trials"]
    assert trials and all(t["settings"]["data_parallel_replicate"] in (1, 2) for t in trials)
    one = decide_request({**base, "instance_count": 1, "tune": {}}, rules)
    assert "data_parallel_replicate" not in one.request.tune.settings.search_space
    assert decision.tune["plan"]["considered"] == 2 * one.tune["plan"]["considered"]


def test_a_tuning_candidate_whose_layout_does_not_divide_the_gpus_is_refused_by_name():
    from training.request.decision import decide_request
    from training.request.rules import RequestRules

    rules = RequestRules(region="us-west-2", bucket_name="my-bucket", workflow_segment="Test").with_limits()
    raw = {"instance_count": 2, "hyperparameters": {"model_preset": "llama3.1-8b", "max_steps": "200"},
           "tune": {"search_space": {"data_parallel_replicate": [3, 2, "auto"]}}}  # fmt: skip
    decision = decide_request(raw, rules)
    assert decision.valid, decision.problems
    tuned = decision.tune["plan"]
    assert [t["settings"]["data_parallel_replicate"] for t in tuned["trials"]] in ([2, "auto"], ["auto", 2])
    assert tuned["refused_by_the_trainer"] == [
        "data_parallel_replicate=3: data_parallel_replicate: must divide the number of GPUs (16); got 3 "
        "(2 x ml.p6-b200.48xlarge); or leave it auto"
    ]


def test_the_layout_is_checked_once_where_the_settings_are_read(monkeypatch):
    """``data_parallel_replicate`` against the job's GPUs: once per decision, in ``value.read_settings`` (the
    request's settings read once), never again by the plan's setup."""
    from training.request.decision import decide_request
    from training.request.rules import RequestRules
    from training.request.value import read_settings

    checked: list[tuple[object, int, str]] = []
    real = inputs.replicate_setting

    def counting(values, count, instance_type):
        checked.append((values["data_parallel_replicate"], count, instance_type))
        return real(values, count, instance_type)

    monkeypatch.setattr(inputs, "replicate_setting", counting)
    rules = RequestRules(region="us-west-2").with_limits()
    raw = {
        "instance_count": 2,
        "hyperparameters": {"model_preset": "llama3.1-8b", "data_parallel_replicate": "2"},
    }
    decision = decide_request(raw, rules)
    assert decision.valid and decision.plan["data_parallel"] == {"replicate": 2, "shard": 8}
    assert checked == [(2, 2, "ml.p6-b200.48xlarge")]
    assert decision.request.settings.values["data_parallel_replicate"] == 2
    # the plan's setup takes the checked value as it is
    assert decision.request.setup().data_parallel_replicate == 2 and len(checked) == 1
    assert read_settings.__doc__ is not None and "replicate_setting" in read_settings.__doc__
