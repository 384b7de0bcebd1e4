"""The checks of a sealed checkpoint, one damage mode at a time (one process, no torchrun), folder naming, the
``on_unusable_checkpoints`` setting and its summary, and refusals written to SageMaker's failure file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.training import checkpoint_places as places
from tests.training.runner import TINY, cli_args
from training.contract import metric_lines, settings_table
from training.trainer import config, refusal, sagemaker_job
from training.trainer.__main__ import main
from training.trainer.checkpoint import folder as checkpoint_folder
from training.trainer.checkpoint import manager as checkpoint_manager
from training.trainer.checkpoint import names
from training.trainer.checkpoint.folder import checksum_problem, size_problem
from training.trainer.checkpoint.names import MARKER

FILES = {
    ".metadata": b"m" * 40,
    "__0_0.distcp": b"a" * 300,
    "__1_0.distcp": b"b" * 300,
    "rank_00000.pt": b"r" * 90,
}


def sealed(folder: Path, files: dict[str, bytes] = FILES, checksums: bool = True) -> Path:
    """A folder sealed the way ``CheckpointManager.save`` seals it (the checks do not read the files' content)."""
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    marker: dict = {
        "world_size": 2,
        "step": 5,
        "files": {name: len(content) for name, content in files.items()},
    }
    if checksums:
        marker["sha256"] = {name: hashlib.sha256(content).hexdigest() for name, content in files.items()}
    (folder / MARKER).write_text(json.dumps(marker))
    return folder


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


DAMAGES = [
    ("truncated .distcp", lambda f: truncate(f / "__1_0.distcp"), "__1_0.distcp has 150 bytes, COMPLETE lists 300"),
    ("truncated .metadata", lambda f: truncate(f / ".metadata"), ".metadata has 20 bytes, COMPLETE lists 40"),
    ("truncated rank_*.pt", lambda f: truncate(f / "rank_00000.pt"), "rank_00000.pt has 45 bytes, COMPLETE lists 90"),
    ("missing file", lambda f: (f / "__0_0.distcp").unlink(), "__0_0.distcp is missing"),
    ("file not listed", lambda f: (f / "extra.bin").write_bytes(b"x"), "extra.bin is not listed in COMPLETE"),
    ("unreadable marker", lambda f: (f / MARKER).write_text('{"files": {".metad'), "unreadable COMPLETE marker (JSONDecodeError: "),
    ("marker without files", lambda f: (f / MARKER).write_text("{}"), "unreadable COMPLETE marker (KeyError: 'files')"),
    ("marker of another form", lambda f: (f / MARKER).write_text('{"files": [1]}'), "unreadable COMPLETE marker (TypeError: "),
]  # fmt: skip


@pytest.mark.parametrize(("mode", "damage", "reason"), DAMAGES, ids=[d[0] for d in DAMAGES])
def test_every_damage_to_a_sealed_checkpoint_fails_its_checks_with_its_reason(tmp_path, mode, damage, reason):
    folder = sealed(tmp_path / "step_00000005")
    assert size_problem(folder) is None and checksum_problem(folder, sorted(FILES)) is None
    damage(folder)
    assert (size_problem(folder) or "").startswith(reason)
    assert not checkpoint_folder.complete_checkpoints(tmp_path)
    assert not checkpoint_folder.incomplete_folders(tmp_path)  # sealed: damaged, not an interrupted write


def test_a_checksum_mismatch_is_found_by_the_rank_whose_share_holds_the_file(tmp_path):
    folder = sealed(tmp_path / "step_00000005")
    flip(folder / "__0_0.distcp")
    assert size_problem(folder) is None  # same size
    assert checksum_problem(folder, [".metadata", "__1_0.distcp"]) is None  # another rank's share
    assert checksum_problem(folder, ["__0_0.distcp", "rank_00000.pt"]) == "checksum mismatch in __0_0.distcp"


def test_a_marker_from_before_checksums_is_checked_by_size_only(tmp_path):
    folder = sealed(tmp_path / "step_00000005", checksums=False)
    flip(folder / ".metadata")
    assert size_problem(folder) is None and checksum_problem(folder, sorted(FILES)) is None
    truncate(folder / ".metadata")
    assert size_problem(folder) == ".metadata has 20 bytes, COMPLETE lists 40"


def test_folders_by_kind_and_order(tmp_path):
    for name in ("step_00000005", "step_00000010", "step_00000010-2", "step_00000003.unusable"):
        sealed(tmp_path / name)
    (tmp_path / "step_00000015").mkdir()  # no COMPLETE: an interrupted write (e.g. a partial sync)
    sealed(tmp_path / "step_00000020.tmp")  # sealed but never renamed: still an interrupted write
    (tmp_path / "step_00000025-2.tmp").mkdir()
    (tmp_path / "notes").mkdir()
    sealed(tmp_path / "step_00000030")  # set aside by an earlier run: its record beside it
    (tmp_path / "step_00000030.unusable").write_text(json.dumps({"reason": "rank 1: checksum mismatch in x"}))
    (tmp_path / "step_00000035").mkdir()  # set aside with an unreadable record (and, here, no COMPLETE)
    (tmp_path / "step_00000035.unusable").write_text("{")
    assert [(s, p.name) for s, p in checkpoint_folder.complete_checkpoints(tmp_path)] == [
        (5, "step_00000005"), (10, "step_00000010"), (10, "step_00000010-2")
    ]  # fmt: skip
    assert [p.name for p in checkpoint_folder.incomplete_folders(tmp_path)] == [
        "step_00000015", "step_00000020.tmp", "step_00000025-2.tmp"
    ]  # fmt: skip
    assert checkpoint_folder.set_aside_folders(tmp_path) == [
        ("step_00000030", "rank 1: checksum mismatch in x"),
        ("step_00000035", "its record step_00000035.unusable is unreadable (JSONDecodeError)"),
    ]


@pytest.mark.parametrize(
    ("name", "order"),
    [("step_00000007", (7, 1)), ("step_00000007-2", (7, 2)), ("step_00000007-12", (7, 12)),
     ("step_00000007-1", None), ("step_00000007-02", None), ("step_00000007.tmp", None),
     ("step_00000007.unusable", None), ("step_7", None)],
)  # fmt: skip
def test_checkpoint_folder_names(name, order):
    assert names.order(name) == order
    if order is not None:
        assert names.step_dir_name(*order) == name


def test_on_unusable_checkpoints_is_a_setting_with_two_values():
    cfg = config.config_from_mapping({**TINY, "checkpoint_dir": "c", "model_dir": "m"})
    assert cfg.on_unusable_checkpoints == "restart"
    with pytest.raises(settings_table.ContractError) as err:
        config.config_from_mapping({**TINY, "on_unusable_checkpoints": "retry"})
    assert str(err.value) == "on_unusable_checkpoints: must be one of restart, fail; got 'retry'"


def test_a_restart_from_nothing_is_in_the_summary_line_and_its_metric():
    line = metric_lines.format_summary_line({"steps": 12, "final_loss": 2.5, "unusable_checkpoints": 3})
    assert (
        line
        == "summary steps=12 final_loss=2.5 unusable_checkpoints=3 restarted_from: none (3 checkpoints unusable)"
    )
    assert metric_lines.parse_metric_line(line) == {
        "final:final_loss": 2.5,
        "final:unusable_checkpoints": 3.0,
    }
    assert metric_lines.parse_summary_line(line) == {
        "steps": 12.0,
        "final_loss": 2.5,
        "unusable_checkpoints": 3.0,
    }
    one = metric_lines.format_summary_line({"steps": 12, "unusable_checkpoints": 1})
    assert one.endswith("unusable_checkpoints=1 restarted_from: none (1 checkpoint unusable)")
    assert "restarted_from" not in metric_lines.format_summary_line({"steps": 12, "final_loss": 2.5})


@pytest.fixture
def in_job(monkeypatch, tmp_path) -> Path:
    """A SageMaker job's environment (as the toolkit sets it); returns where the failure file goes."""
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))
    monkeypatch.setenv("SM_OUTPUT_DIR", str(tmp_path / "output"))
    return tmp_path / "output" / "failure"


def test_outside_sagemaker_a_refusal_is_only_its_line(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("SM_MODEL_DIR", raising=False)
    monkeypatch.setattr(sagemaker_job, "RESOURCE_CONFIG", tmp_path / "absent.json")
    assert sagemaker_job.failure_file() is None
    assert refusal.refuse("batch_size: no") == 2
    assert capsys.readouterr().err == "error: batch_size: no\n"
    assert list(tmp_path.iterdir()) == []


def test_in_a_job_the_first_refusal_is_the_failure_reason_and_is_never_overwritten(in_job, capsys):
    assert sagemaker_job.failure_file() == in_job
    refusal.refuse("first reason")
    refusal.refuse("second reason", report=False)
    assert in_job.read_text() == "first reason\n"
    assert capsys.readouterr().err == "error: first reason\n"


def test_main_writes_a_bad_setting_to_the_failure_file(in_job, tmp_path, capsys):
    args = cli_args(
        {**TINY, "num_heads": "5", "checkpoint_dir": str(tmp_path / "c"), "model_dir": str(tmp_path / "m")}
    )
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    expected = "invalid setting num_heads: must divide hidden_size (64); got 5"
    assert capsys.readouterr().err == f"error: {expected}\n"
    assert in_job.read_text() == expected + "\n"


def test_main_writes_a_failed_check_to_the_failure_file(in_job, tmp_path, capsys):
    args = cli_args({**TINY, "dataset": "channel", "data_dir": str(tmp_path / "nowhere"),
                     "checkpoint_dir": str(tmp_path / "c"), "model_dir": str(tmp_path / "m")})  # fmt: skip
    assert main(args) == 2
    expected = f"invalid setting dataset: the data folder {tmp_path / 'nowhere'} does not exist"
    assert capsys.readouterr().err == f"error: {expected}\n"
    assert in_job.read_text() == expected + "\n"


def test_an_unknown_option_is_written_to_the_failure_file(in_job):
    with pytest.raises(SystemExit):
        config.parse_args(["--num_layerz", "2"])
    assert in_job.read_text() == "invalid command line: unrecognized arguments: --num_layerz 2 (see --help)\n"


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group and the ``DistEnv`` fields ``CheckpointManager`` reads."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield SimpleNamespace(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), cpu_group=None)
    finally:
        dist.destroy_process_group()


def base_name(where) -> str:
    """The checkpoint's name in what ``save`` returned (a folder, or a URI)."""
    return str(where).rstrip("/").rsplit("/", 1)[-1]


def test_a_set_aside_folder_and_its_record_are_never_reused_counted_or_pruned(one_rank, place, tmp_path):
    aside = places.copy_in(place, sealed(tmp_path / "files" / "step_00000004"), "step_00000004")
    place.write("step_00000004.unusable", json.dumps({"reason": "rank 0: checksum mismatch in x"}).encode())
    place.write("step_00000008.unusable", b"{}")  # a record whose folder is gone: its name stays taken
    before = {k: v for k, v in place.contents().items() if k.startswith(f"{aside}/")}
    net = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(net.parameters())
    manager = checkpoint_manager.CheckpointManager(place.setting, 1, one_rank)
    assert manager.load_latest(net, optimizer) is None  # nothing to load: the earlier set-aside one is named
    assert manager.skipped == [("step_00000004", "set aside earlier: rank 0: checksum mismatch in x")]
    saved = [base_name(manager.save(step, net, optimizer, {"step": step})) for step in (4, 8, 12)]
    assert saved == ["step_00000004-2", "step_00000008-2", "step_00000012"]
    assert place.names() == [
        "step_00000004",
        "step_00000004.unusable",
        "step_00000008.unusable",
        "step_00000012",
    ]  # fmt: skip  (keep_checkpoints=1 pruned this run's -2 folders only)
    assert {k: v for k, v in place.contents().items() if k.startswith(f"{aside}/")} == before
    assert places.complete(place) == ["step_00000012"]


def test_a_folder_that_appears_while_a_save_is_written_is_never_replaced(one_rank, place, monkeypatch):
    """A folder of the save's name (a folder), or its ``COMPLETE`` (S3), that appears while the save is written
    is never replaced: the save raises on every rank, naming it."""
    net = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(net.parameters())
    manager = checkpoint_manager.CheckpointManager(place.setting, 3, one_rank)
    storage = manager.storage
    if place.kind == "folder":
        hashing, root = storage._node_digests, Path(place.setting)

        def meanwhile(path: Path):
            (root / "step_00000004").mkdir()
            (root / "step_00000004" / "theirs").write_text("x")
            return hashing(path)

        monkeypatch.setattr(storage, "_node_digests", meanwhile)
        match = r"step_00000004 appeared while .*step_00000004\.tmp was written"
    else:
        digests = storage._digests

        def meanwhile(pending):  # type: ignore[misc]
            if "step_00000004/COMPLETE" not in place.listed():
                place.write("step_00000004/COMPLETE", b"theirs")
            return digests(pending)

        monkeypatch.setattr(storage, "_digests", meanwhile)
        match = r"step_00000004/COMPLETE appeared meanwhile; not replacing it"
    with pytest.raises(FileExistsError, match=match):
        manager.save(4, net, optimizer, {"step": 4})
    if place.kind == "folder":
        root = Path(place.setting)
        assert [p.name for p in (root / "step_00000004").iterdir()] == ["theirs"]
        assert (
            root / "step_00000004.tmp" / MARKER
        ).is_file()  # the new one is kept, sealed, under its .tmp name
    else:
        assert place.read("step_00000004/COMPLETE") == b"theirs"


def place_bytes(place, name: str) -> dict[str, bytes]:
    return {k.split("/", 1)[1]: v for k, v in place.contents().items() if k.startswith(f"{name}/")}


def test_a_background_save_of_a_run_that_fails_is_sealed_once_its_files_are_written(one_rank, place):
    """An exception ends the run while a background save is written: ``close`` (the run's ``finally``) waits for
    it and, the world being this node (S3: every rank's receipt being there), seals it, as the next step boundary
    would have."""
    net, reference = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(net.parameters())
    manager = checkpoint_manager.CheckpointManager(place.setting, 3, one_rank)
    written = manager.save(4, net, optimizer, {"step": 4}, background=True)
    assert base_name(written) == ("step_00000004.tmp" if place.kind == "folder" else "step_00000004")
    manager.close()
    assert place.names() == ["step_00000004"]
    assert places.complete(place) == ["step_00000004"]
    found = json.loads(place.read(f"step_00000004/{MARKER}"))
    files = place_bytes(place, "step_00000004")
    assert found["sha256"] == {k: hashlib.sha256(v).hexdigest() for k, v in files.items() if k != MARKER}
    assert (found["step"], found["world_size"]) == (4, 1)
    loader = checkpoint_manager.CheckpointManager(place.setting, 3, one_rank)
    state = loader.load_latest(reference, torch.optim.AdamW(reference.parameters()))
    assert state is not None and state["step"] == 4 and torch.equal(reference.weight, net.weight)


def test_a_save_written_whole_but_unsealed_is_sealed_at_the_next_start_and_an_unfinished_one_left(
    one_rank, place
):
    """The next start seals a save written whole but never sealed (``COMPLETE`` the same bytes a seal had
    written, every file unchanged; a folder's ``.tmp`` renamed) and resumes from it; one whose DCP write did not
    finish (no ``.metadata``) or lost a file it lists stays an interrupted write, reported and left exactly as it
    is."""
    net = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(net.parameters())
    writer = checkpoint_manager.CheckpointManager(place.setting, 5, one_rank)
    whole = base_name(writer.save(4, net, optimizer, {"step": 4}))
    sealed_bytes = place_bytes(place, whole)
    found_as = place.unseal(whole)
    unfinished = place.unseal(base_name(writer.save(8, net, optimizer, {"step": 8})))
    place.delete(f"{unfinished}/.metadata")
    lost = place.unseal(base_name(writer.save(12, net, optimizer, {"step": 12})))
    place.delete(f"{lost}/__0_0.distcp")
    left = {name: place_bytes(place, name) for name in (unfinished, lost)}
    manager = checkpoint_manager.CheckpointManager(place.setting, 5, one_rank)
    state = manager.load_latest(net, optimizer)
    assert state is not None and state["step"] == 4
    assert manager.adopted == [(found_as, "step_00000004")]
    assert place_bytes(place, "step_00000004") == sealed_bytes
    assert [name for name, _ in manager.incomplete] == [unfinished, lost]
    assert {name: place_bytes(place, name) for name in (unfinished, lost)} == left
    if place.kind == "folder":
        root = Path(place.setting)
        view = checkpoint_folder.node_view(root / lost, root / "step_00000012")
        assert checkpoint_folder.written_whole([view]) == "__0_0.distcp is missing or cut short"
