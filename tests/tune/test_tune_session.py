"""A whole tuning session (``session.run``) where no trial runs ok, on one host and as the leader of two whose
hand-over fails: the report is written either way, the driver exits 0 with ``winner: null``; and the convergence
runs' settings in each precision are ones the trainer accepts. The trials here are refused by the trainer's own
rules before anything starts (no process), so these tests are quick."""

from __future__ import annotations

import json

import pytest

from training.contract import settings_parse, settings_table, tuning
from training.tune import convergence, driver, hosts, session
from training.tune.hosts import Hosts

REFUSED = "batch_size=1,precision=mxfp8,activation_checkpointing=selective"
"""A trial the trainer refuses (selective checkpointing cannot run with a Transformer Engine precision)."""


def job_in(tmp_path, *extra: str) -> driver.Job:
    return driver.parse_args(["--tune_trials", f"{REFUSED};{REFUSED}", "--checkpoint_dir", str(tmp_path / "ckpt"),
                              "--seq_length", "64", *extra])  # fmt: skip


def test_no_trial_ok_still_writes_the_report_and_exits_0_with_no_winner(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(driver.SCRATCH_ENV, str(tmp_path / "scratch"))
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    assert session.run(job_in(tmp_path), Hosts(("localhost",), "localhost"), share_port=47_611) == 0
    folder = tmp_path / "ckpt" / "tune"
    report = json.loads((folder / tuning.TUNE_REPORT_FILE).read_text())
    assert report["winner"] is None and [r["status"] for r in report["rows"]] == ["failed", "failed"]
    assert "selective cannot run with precision=mxfp8" in report["rows"][0]["error"]
    assert json.loads((folder / tuning.TUNE_WINNER_FILE).read_text()) == {"trial": None, "settings": None}
    assert (folder / tuning.TUNE_RECORDS_FILE).is_file() and not (folder / tuning.TUNE_REQUEST_FILE).exists()
    assert "tune: no winner: no trial ran ok (2 tried)" in capsys.readouterr().out


def test_a_failed_hand_over_between_hosts_keeps_the_report_and_skips_convergence_with_a_note(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(driver.SCRATCH_ENV, str(tmp_path / "scratch"))
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    monkeypatch.setattr(hosts, "SHARE_TIMEOUT_SECONDS", 1.0)  # the other host never connects
    job = job_in(tmp_path, "--tune_convergence_precisions", "mxfp8", "--tune_convergence_steps", "20")
    leader = Hosts(("localhost", "algo-2"), "localhost")
    assert session.run(job, leader, share_port=47_612) == 0
    report = json.loads((tmp_path / "ckpt" / "tune" / tuning.TUNE_REPORT_FILE).read_text())
    assert len(report["rows"]) == 2 and report["convergence"] == []
    assert any(n.startswith("convergence runs skipped: the hand-over of the winner between hosts failed (Timeout")
               for n in report["notes"]), report["notes"]  # fmt: skip


def test_without_convergence_the_hosts_exchange_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(driver.SCRATCH_ENV, str(tmp_path / "scratch"))
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    monkeypatch.setattr(hosts, "SHARE_TIMEOUT_SECONDS", 30.0)
    follower = Hosts(("leader-that-does-not-exist.invalid", "localhost"), "localhost")
    assert session.run(job_in(tmp_path), follower, share_port=47_614) == 0  # no wait for a leader


@pytest.mark.parametrize(
    ("base", "winner", "precision", "changed"),
    [
        ({"precision": "mxfp8", "quantized_model_init": "true"}, {"batch_size": 2}, "bf16", {"quantized_model_init"}),
        ({"precision": "mxfp8", "quantized_model_init": "true"}, {"batch_size": 2}, "fp8", set()),
        ({"precision": "bf16", "compile": "true", "attention_backend": "flash"},
         {"activation_checkpointing": "selective"}, "mxfp8", {"compile", "attention_backend", "activation_checkpointing"}),
        ({"precision": "bf16"}, {"batch_size": 2}, "mxfp8", set()),
    ],
)  # fmt: skip
def test_a_convergence_run_takes_only_settings_its_precision_runs(base, winner, precision, changed):
    full = {"seq_length": "64", **base}
    with pytest.raises(settings_table.ContractError) if changed else _nothing():
        settings_parse.parse_hyperparameters({**full, **{k: settings_parse.format_setting(v) for k, v in winner.items()},
                                        "precision": precision})  # fmt: skip
    settings, notes = convergence.run_settings(full, winner, precision)
    assert settings["precision"] == precision and len(notes) == len(changed)
    assert {n.split(": ")[1].split("=")[0] for n in notes} == changed
    merged = {**full, **{k: settings_parse.format_setting(v) for k, v in settings.items()}}
    settings_parse.parse_hyperparameters(merged)  # the trainer's rules accept it


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
