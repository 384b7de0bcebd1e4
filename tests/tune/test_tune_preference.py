"""A tuning run of preference tuning (``objective`` dpo, or auto on preference pairs): the driver decides the
objective from the data as the trainer does and names it in the base settings, so a trial's row is planned as a DPO
step and its measurement record says it timed one (``tuning.measured_step``: dpo and its reference); such a record
stands for DPO runs only, and a plan built on it applies the reference's cost once, not on top of the measured step
(the adapter-off forward is in it already); a next-token record of the same settings stands for a DPO run scaled
once. Before launch, the tuning plan ranks and costs DPO candidates as DPO steps, each trial with its own reference
pass over the data. Pure Python: the trials' measurements are written here as a tuning job's report writes them."""

from __future__ import annotations

import dataclasses
import json
import random
import sys

import pytest

from tests.request.test_fine_tuning_request import REQUEST, RULES
from tests.request.test_preference_request import PAIRS
from tests.request.test_preference_request import folders as preference_folders  # noqa: F401 - the fixture
from training.contract import hardware
from training.plan import measured
from training.prepare import chat
from training.request import tuning, tuning_plan
from training.request.decision import decide_request
from training.request.reads import Reads
from training.tune import driver, report
from training.tune.outcome import TrialResult
from training.tune.stability import Spread

B200 = "ml.p6-b200.48xlarge"
TAGGED = dataclasses.replace(RULES, image_uri="012345678901.dkr.ecr.us-west-2.amazonaws.com/training:abc123")
STEP_SECONDS = 0.5
"""The median step time of the measured trial: 512 tokens a step per GPU, so 1,024 tokens/s per GPU."""
CHATS = "s3://b/data/more-chats/"


@pytest.fixture(scope="module")
def folders(preference_folders, tmp_path_factory):  # noqa: F811 - the imported fixture, extended
    """The preference request's model and pairs, and conversations with enough held-out windows of 512 tokens for
    one global batch of 8 GPUs (a next-token run of the same settings)."""
    root = tmp_path_factory.mktemp("tune_preference")
    rng = random.Random(1)
    lines = [
        {"prompt": "x" * rng.randint(20, 80), "completion": "y" * rng.randint(10, 40)} for _ in range(400)
    ]
    (root / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([root / "chats.jsonl"], str(root / "chats"), str(preference_folders["model"]),
                      validation_fraction=0.1)  # fmt: skip
    return {**preference_folders, CHATS: root / "chats"}


def decide(folders, data: str = PAIRS, records=(), tune=None, **hyperparameters: str):
    raw = {**REQUEST, "train_data_uri": data, "seq_length": 512,
           "hyperparameters": {"max_steps": "100", **hyperparameters}}  # fmt: skip
    if tune is not None:
        raw["tune"] = tune
    reads = Reads(
        local_init_from=folders["model"], local_train_data=folders[data], measurements=list(records)
    )
    decision = decide_request(raw, TAGGED, reads=reads)
    assert decision.problems == [], decision.problems
    return decision


def tuning_job(folders, data: str, **settings: str) -> driver.Job:
    """The tuning job's driver as ``train.sh`` starts it on the request's data and model (one trial: the request's
    own micro-batch)."""
    argv = ["--tune_trials", "batch_size=1", "--dataset", "channel", "--data_dir", str(folders[data]),
            "--init_from", str(folders["model"]), "--seq_length", "512", "--precision", "bf16", "--max_steps", "100"]  # fmt: skip
    for name, value in settings.items():
        argv += [f"--{name}", value]
    return driver.parse_args(argv)


def measured_records(job: driver.Job) -> tuple[report.Row, list[dict]]:
    """The job's one trial as measured on the instance's GPUs and the records its report writes."""
    where = report.Where(B200, 1, "cuda", hardware.GPU_INSTANCE_TYPES[B200].gpu, 8, "abc123", "2.9.0", "2.11.0",
                         "tune-job", "2026-11-29T12:00:00+00:00", "algo-1")  # fmt: skip
    times = [STEP_SECONDS] * 10
    result = TrialResult(1, {"batch_size": 1}, status="ok", step_times=times, spread=Spread.of(times),
                         summary={"max_allocated_gb": 20.0, "max_reserved_gb": 24.0})  # fmt: skip
    base = {k: v for k, v in job.base.items() if k in driver.settings_table.HYPERPARAMETERS_BY_NAME}
    row = report.make_row(result, base, where, job.architecture)
    return row, report.records([row], base, where, job.architecture)


def test_a_dpo_trials_record_says_so_and_a_plan_on_it_applies_the_adapter_off_cost_once(folders):
    job = tuning_job(folders, PAIRS, lora_rank="8")
    row, records = measured_records(job)
    assert row.measured_tokens_per_sec == pytest.approx(512 / STEP_SECONDS)
    decision = decide(folders, records=records, lora_rank="8")
    timing, part = decision.estimate.timing, decision.plan["preference"]
    # the measured DPO step is the plan's step: the adapter-off forward is not added to it a second time
    assert timing.basis == "measured" and part["step_factor"] > 1.3
    assert timing.step_seconds == pytest.approx(STEP_SECONDS)
    assert timing.run_seconds == pytest.approx(100 * STEP_SECONDS)
    assert part["step_measured"] is True and "in the measured DPO step's time already" in part["summary"]
    assert job.base["objective"] == "dpo"  # auto on preference pairs, named for the trials and the records
    (record,) = records
    settings = record["key"]["settings"]
    assert (settings["objective"], settings["dpo_reference"], settings["lora_rank"]) == (
        "dpo",
        "adapter_off",
        8,
    )
    assert measured.dpo_step(record)
    # the same settings training the next-token loss do not take a DPO step's figure
    assert decide(folders, CHATS, records=records, lora_rank="8").estimate.timing.basis == "estimate"


def test_a_next_token_record_stands_for_a_dpo_run_scaled_once(folders):
    job = tuning_job(folders, CHATS, lora_rank="8")
    assert "objective" not in job.base  # conversations: the next-token loss, as given
    _, records = measured_records(job)
    assert not measured.dpo_step(records[0]) and "objective" not in records[0]["key"]["settings"]
    decision = decide(folders, records=records, lora_rank="8")
    part = decision.plan["preference"]
    assert decision.estimate.timing.basis == "measured" and part["step_measured"] is False
    assert decision.estimate.timing.step_seconds == pytest.approx(
        STEP_SECONDS * part["step_factor"], rel=1e-3
    )


def test_a_tuning_job_whose_objective_does_not_fit_its_data_is_refused_before_any_trial():
    with pytest.raises(driver.settings_table.ContractError) as refused:
        driver.parse_args(["--tune_trials", "batch_size=1", "--objective", "dpo"])  # synthetic data
    assert refused.value.field == "objective" and "synthetic data is not; got dpo" in str(refused.value)


def test_a_dpo_trials_row_predicts_the_dpo_step(folders):
    dpo, _ = measured_records(tuning_job(folders, PAIRS, lora_rank="8"))
    next_token, _ = measured_records(tuning_job(folders, CHATS, lora_rank="8"))
    factor = decide(folders, lora_rank="8").plan["preference"]["step_factor"]
    assert next_token.predicted_tokens_per_sec / dpo.predicted_tokens_per_sec == pytest.approx(
        factor, rel=1e-3
    )


def test_dpo_candidates_are_ranked_and_costed_as_dpo_steps_each_with_its_own_reference_pass(folders):
    block = {"search_space": {"batch_size": [1]}, "max_trials": 1, "probe_memory_edge": False}
    defaults = tuning.TuneSettings(search_space={})
    steps = defaults.warmup_steps + defaults.max_measured_steps
    for lora, reference in (({"lora_rank": "8"}, "adapter_off"), ({}, "precomputed")):
        run = decide(
            folders, **lora
        )  # the request's own plan: a DPO run's (tests/request/test_preference_request.py)
        (trial,) = decide(folders, tune=block, **lora).tune["plan"]["trials"]
        step, part, s = run.estimate.timing, run.plan["preference"], run.estimate.setup
        assert part["reference"] == reference
        assert trial["predicted_tokens_per_sec_per_gpu"] == round(step.tokens_per_sec_per_gpu)
        reference_pass = (
            part["reference_pass_seconds"] or 0.0
        )  # precomputed: each trial scores the data again
        assert (reference_pass > 0) == (reference == "precomputed")
        save = 12.0 * s.shape.parameter_count() / s.world_size / 1e9 / tuning_plan.SAVE_GB_PER_SECOND_PER_GPU
        expected = tuning_plan.TRIAL_START_SECONDS + reference_pass + steps * step.step_seconds + save
        assert trial["expected_seconds"] == pytest.approx(expected, abs=1)


@pytest.mark.slow
def test_a_lora_dpo_tuning_job_runs_its_trial_as_a_dpo_run_and_records_a_dpo_step(tmp_path, monkeypatch):
    """The driver, for real on this machine (one trial: a fresh train.sh and torchrun, one process, 1 warm-up and 3
    timed steps): a LoRA base on preference pairs with objective auto trains DPO with the adapters switched off in
    every step, so its timed steps are DPO steps; the report's record, row and winning request say so."""
    from tests.training.chat_models import model_folder
    from tests.training.preference.test_trl_agreement import records as pair_records
    from training.contract import tuning as contract_tuning
    from training.prepare import pairs as prepare_pairs
    from training.tune import hosts, session

    model_folder(tmp_path / "model", "llama3.1", with_weights=True, layers=2, hidden=64)
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pair_records()))
    prepare_pairs.prepare_pairs([tmp_path / "pairs.jsonl"], str(tmp_path / "data"), str(tmp_path / "model"),
                                validation_fraction=0)  # fmt: skip
    monkeypatch.setenv(driver.SCRATCH_ENV, str(tmp_path / "scratch"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHON", sys.executable)
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    job = driver.parse_args(["--tune_trials", "batch_size=2", "--dataset", "channel", "--data_dir", str(tmp_path / "data"),
                             "--init_from", str(tmp_path / "model"), "--seq_length", "512", "--precision", "fp32",
                             "--lora_rank", "4", "--max_steps", "100", "--tune_warmup_steps", "1",
                             "--tune_max_measured_steps", "3", "--tune_window_steps", "3", "--tune_cv_target", "0",
                             "--tune_instance_type", B200, "--checkpoint_dir", str(tmp_path / "ckpt")])  # fmt: skip
    assert session.run(job, hosts.Hosts(("localhost",), "localhost"), share_port=47_631) == 0
    folder = tmp_path / "ckpt" / contract_tuning.TUNE_REPORT_FOLDER
    (row,) = json.loads((folder / contract_tuning.TUNE_REPORT_FILE).read_text())["rows"]
    assert row["status"] == "ok", row
    log = (folder / "trials" / "trial-01.log").read_text()
    assert "objective dpo loss=sigmoid beta=0.1 sft_weight=0 reference=adapter_off" in log
    steps = [line for line in log.splitlines() if line.startswith("step=")]
    # every timed step a DPO step
    assert len(steps) == 4 and all("reward_accuracy=" in line for line in steps)
    (record,) = json.loads((folder / contract_tuning.TUNE_RECORDS_FILE).read_text())["records"]
    assert measured.dpo_step(record) and record["key"]["settings"]["dpo_reference"] == "adapter_off"
    winning = json.loads((folder / contract_tuning.TUNE_REQUEST_FILE).read_text())
    assert winning["hyperparameters"]["objective"] == "dpo" and winning["hyperparameters"]["lora_rank"] == "4"
