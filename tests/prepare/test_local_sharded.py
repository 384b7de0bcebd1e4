"""``python -m training.prepare --sharded``: the cloud job's preparation on this machine (the same code as
``training.prepare.job``), what it takes and refuses, and the trainer reading what it wrote."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.training.input_formats import write_corpus
from tests.training.runner import TINY
from training.prepare import corpus, job
from training.prepare.kinds import stable_fraction
from training.prepare.store import LocalStore
from training.request import data_manifest as manifest
from training.trainer import config, preflight
from training.trainer.data import token_files

DOCUMENTS: dict[str, list[str]] = {}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    DOCUMENTS.update(write_corpus(folder))
    return folder


def written(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in LocalStore(folder).listing()}


def test_the_command_writes_what_the_processing_script_writes(inputs, tmp_path, capsys):
    code = corpus.main([str(inputs), "--sharded", "--output", str(tmp_path / "local"), "--validation-fraction",
                        "0.2", "--workers", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert job.main(["--input", str(inputs), "--output", str(tmp_path / "job"), "--validation-fraction", "0.2",
                     "--workers", "2"]) == 0  # fmt: skip
    assert written(tmp_path / "local") == written(tmp_path / "job")
    meta = json.loads((tmp_path / "local" / manifest.MANIFEST_FILE).read_text())
    assert meta["format"] == manifest.FORMAT and len(meta["shards"]) == 7
    assert "prepared 7 input objects into" in out and "(sharded, split by hash)" in out
    assert (
        f"train with: --dataset channel --data_dir {tmp_path / 'local'} --vocab_size 257 --token_dtype uint16"
        in out
    )


def test_a_file_named_is_the_object_of_its_name_and_the_default_fraction_is_the_cloud_jobs(inputs, tmp_path):
    code = corpus.main([str(inputs / "nested"), str(inputs / "a.jsonl"), "--sharded", "--output", str(tmp_path / "o"),
                        "--validation-fraction", "0"])  # fmt: skip
    assert code == 0
    meta = json.loads((tmp_path / "o" / manifest.MANIFEST_FILE).read_text())
    keys = [shard["key"] for shard in meta["shards"]]
    assert keys == sorted(keys) and "a.jsonl" in keys and all(not k.startswith("nested/") for k in keys)
    assert set(keys) - {"a.jsonl"} == set(job.local_inputs(inputs / "nested"))
    settings = json.loads((tmp_path / "o" / job.SETTINGS_FILE).read_text())
    assert settings["validation_fraction"] == 0
    assert job.input_keys([str(inputs)]) == job.local_inputs(inputs)
    # without --validation-fraction: 0.01, as the DataPreparation state machine's default
    held_out = any(stable_fraction(d.encode()) < 0.01 for docs in DOCUMENTS.values() for d in docs)
    assert corpus.main(["--sharded", str(inputs), "--output", str(tmp_path / "d")]) == (0 if held_out else 2)
    assert json.loads((tmp_path / "d" / job.SETTINGS_FILE).read_text())["validation_fraction"] == 0.01


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["{in}/a.jsonl", "{in}/a.jsonl"],
            "error: input: {in}/a.jsonl and {in}/a.jsonl would both be the object a.jsonl; give each once",
        ),  # fmt: skip
        (["{in}/README.json"], "error: input: {in}/README.json is not an input format (.txt, "),
        (["{in}/missing"], "error: input: {in}/missing is neither a file nor a folder"),
        (["{in}", "--block-tokens", "64"], "error: --block-tokens: not with --sharded"),
        (["{in}", "--validation-file", "{in}/a.jsonl"], "error: --validation-file: not with --sharded"),
    ],
)
def test_refusals_name_the_input_or_option_and_write_nothing(inputs, tmp_path, capsys, argv, said):
    code = corpus.main(
        [a.format(**{"in": inputs}) for a in argv] + ["--sharded", "--output", str(tmp_path / "o")]
    )
    assert code == 2
    assert capsys.readouterr().err.startswith(said.format(**{"in": inputs}))
    assert not (tmp_path / "o").exists()


def test_an_output_holding_a_position_split_preparation_is_refused_before_any_shard(inputs, tmp_path, capsys):
    corpus.prepare([str(inputs / "a.jsonl")], str(tmp_path / "o"), validation_fraction=0)
    before = written(tmp_path / "o")
    assert corpus.main([str(inputs), "--sharded", "--output", str(tmp_path / "o")]) == 2
    assert (
        "holds a metadata.json of another preparation (no prepare.json: not sharded)"
        in capsys.readouterr().err
    )
    assert written(tmp_path / "o") == before


def test_the_trainer_reads_a_sharded_text_preparation_as_the_manifest_lists_it(inputs, tmp_path):
    out = tmp_path / "data"
    assert corpus.main([str(inputs), "--sharded", "--output", str(out), "--validation-fraction", "0.2"]) == 0
    meta = json.loads((out / manifest.MANIFEST_FILE).read_text())
    raw = {**TINY, "vocab_size": "257", "seq_length": "8", "batch_size": "2", "dataset": "channel",
           "data_dir": str(out), "checkpoint_dir": str(tmp_path / "ckpt"), "model_dir": str(tmp_path / "model")}  # fmt: skip
    cfg = config.config_from_mapping(raw)
    (note,) = preflight.check(cfg, 1)
    assert note.startswith(
        f"data ok: {len(meta['splits']['train']['files']) + len(meta['splits']['validation']['files'])} files"
    )
    for split in ("train", "validation"):
        files = token_files.split_files(str(out), split)
        assert [f.relative_to(out).as_posix() for f in files] == meta["splits"][split]["files"]
        stream = np.concatenate([token_files.open_tokens(f, "uint16") for f in files])
        assert len(stream) == meta["splits"][split]["tokens"]
    dataset = token_files.make_dataset(cfg, 0, 1)
    assert dataset.windows == sum(len(a) // 9 for a in dataset.arrays) > 0
    tokens, _ = dataset.next_batch()[:2]
    assert tuple(tokens.shape) == (2, 8)


def test_without_sharded_a_parquet_or_compressed_file_is_refused_not_read_as_text(inputs, tmp_path, capsys):
    code = corpus.main([str(inputs / "b.jsonl.gz"), "--output", str(tmp_path / "o")])
    assert (code, capsys.readouterr().err) == (
        2,
        f"error: input: {inputs / 'b.jsonl.gz'} is gz: read with --sharded (docs/data.md)\n",
    )
    assert not (tmp_path / "o").exists()


def test_a_template_that_loops_without_end_is_stopped_by_template_seconds_as_locally(tmp_path, capsys):
    """The sharded path bounds each rendering as local prepare does (issue 53 item 9): --template-seconds is
    passed to every process of the pool, and the refusal names the template's file and the object and line."""
    from tests.prepare.test_chat_data import ENDLESS, GOOD
    from tests.training.chat_models import model_folder

    folder = model_folder(tmp_path / "model", "qwen2.5", template_text=ENDLESS)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "chats.jsonl").write_text(json.dumps(GOOD) + "\n")
    argv = [str(tmp_path / "in"), "--sharded", "--init-from", str(folder), "--output", str(tmp_path / "o"),
            "--validation-fraction", "0", "--workers", "1", "--template-seconds", "0.3"]  # fmt: skip
    assert corpus.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: chats.jsonl:1: the chat template of ") and len(err.splitlines()) == 1, err
    assert (
        f"{folder / 'tokenizer_config.json'} did not finish" in err
        and "within 0.3 s (--template-seconds)" in err
    )
    assert not (tmp_path / "o").exists()
    assert corpus.main([*argv[:-1], "0"]) == 2
    assert capsys.readouterr().err.startswith("error: template-seconds: must be above 0; got 0.0")


def test_conversations_are_read_as_local_prepare_reads_them_a_pair_among_them_refused_by_name(
    tmp_path, capsys
):
    """Issue 55 item 2: conversations "as prepare reads them locally" (TRL's forms: chat_data's in both); a
    preference pair among conversations is refused naming the object, the line and the kind that prepares it."""
    from tests.training.chat_models import model_folder

    folder = model_folder(tmp_path / "model", "qwen2.5")
    (tmp_path / "in").mkdir()
    good = {"conversations": [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "hello"}]}
    pair = {"prompt": "q", "chosen": "a", "rejected": "b"}
    (tmp_path / "in" / "chats.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(pair) + "\n")
    argv = [str(tmp_path / "in" / "chats.jsonl"), "--sharded", "--workers", "1", "--init-from", str(folder),
            "--output", str(tmp_path / "o3"), "--validation-fraction", "0"]  # fmt: skip
    assert corpus.main(argv) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("error: chats.jsonl:2: a preference pair ('chosen' and 'rejected') among conversations: "
                           "prepare pairs on their own, with --kind pairs"), said  # fmt: skip
    assert len(said.splitlines()) == 1 and not (tmp_path / "o3").exists()  # refused before any shard
    (tmp_path / "in" / "chats.jsonl").write_text(json.dumps(good) + "\n")
    assert corpus.main(argv) == 0
    meta = json.loads((tmp_path / "o3" / manifest.MANIFEST_FILE).read_text())
    assert meta["input_format"] == "conversations" and meta["examples"] == 1


def write_pairs(folder: Path, files: int = 3, per_file: int = 8) -> list[Path]:
    """Preference pairs in TRL's three forms, ``files`` JSON Lines files (sorted names)."""
    folder.mkdir(parents=True)
    paths = []
    for f in range(files):
        lines = []
        for i in range(per_file):
            q, a, b = f"question {f}.{i}", f"a good answer {i}" + " more" * (i % 4), f"a bad answer {f}"
            lines.append([{"prompt": q, "chosen": a, "rejected": b},
                          {"prompt": [{"role": "user", "content": q}], "chosen": [{"role": "assistant", "content": a}],
                           "rejected": [{"role": "assistant", "content": b}]},
                          {"chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                           "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": b}]}][i % 3])  # fmt: skip
        paths.append(folder / f"pairs-{f}.jsonl")
        paths[-1].write_text("".join(json.dumps(x) + "\n" for x in lines))
    return paths


def test_preference_pairs_sharded_are_local_prepares_pairs_and_the_trainer_reads_every_shard(
    tmp_path, capsys
):
    """Issue 55 items 1-3 for preference pairs: ``--sharded`` of pairs (told by the first record, as local prepare
    tells them) renders each pair as local ``prepare`` does, one shard per file; the Processing script's ``--kind
    pairs`` writes the same bytes; the manifest says ``kind: preference`` with pair histograms, the request check's
    reader accepts it; and the trainer's ``PreferencePairs`` reads every shard of a split, not the first."""
    from tests.training.chat_models import model_folder
    from training.prepare import pairs
    from training.request import sft_data
    from training.trainer.data.pairs import PreferencePairs

    model = model_folder(tmp_path / "model", "qwen2.5")
    files = write_pairs(tmp_path / "in")
    argv = [str(tmp_path / "in"), "--sharded", "--init-from", str(model), "--validation-fraction", "0", "--workers",
            "1", "--max-tokens", "258", "--too-long", "truncate"]  # fmt: skip
    assert corpus.main([*argv, "--output", str(tmp_path / "sharded")]) == 0
    out = capsys.readouterr().out
    assert "train with: --dataset channel" in out and f"--init_from {model}" in out
    assert job.main(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "job"), "--kind", "pairs", "--model",
                     str(model), "--validation-fraction", "0", "--workers", "2", "--max-tokens", "258", "--too-long",
                     "truncate"]) == 0  # fmt: skip
    assert written(tmp_path / "sharded") == written(tmp_path / "job")
    local = pairs.prepare_pairs(files, str(tmp_path / "local"), str(model), validation_fraction=0, max_tokens=258,
                                too_long="truncate")  # fmt: skip
    meta = json.loads((tmp_path / "sharded" / manifest.MANIFEST_FILE).read_text())
    train = meta["splits"]["train"]
    assert meta["kind"] == "preference" and len(train["files"]) == 3 and len(meta["shards"]) == 3
    for name in ("pairs", "examples", "tokens", "trained_tokens", "max_example_tokens", "max_sequence_tokens",
                 "input_format", "token_dtype"):  # fmt: skip
        assert meta[name] == local[name], name
    assert meta["counts"] == local["counts"] and meta["counts"]["truncated"] > 0
    assert train["lengths"] == local["splits"]["train"]["lengths"] and train["sequences"] == 48
    assert sft_data.meta_problems(meta) == []
    for key, suffix in (("files", ".bin"), ("masks", ".mask")):
        stream = b"".join((tmp_path / "sharded" / name).read_bytes() for name in train[key])
        assert stream == (tmp_path / "local" / f"train{suffix}").read_bytes()
    read = {name: PreferencePairs(tmp_path / name, "train", token_dtype=meta["token_dtype"], seq_length=264,
                                  batch_size=1, seed=0, rank=0, world_size=1, shuffle=False)
            for name in ("sharded", "local")}  # fmt: skip
    assert read["sharded"].pairs == read["local"].pairs == 24
    assert np.array_equal(read["sharded"].offsets, read["local"].offsets)
    for index in range(read["local"].window_count):
        for mine, theirs in zip(read["sharded"].window(index), read["local"].window(index), strict=True):
            assert np.array_equal(mine, theirs)
    raw = {**TINY, "vocab_size": str(meta["vocab_size"]), "seq_length": "264", "batch_size": "2", "dataset": "channel",
           "data_dir": str(tmp_path / "sharded"), "checkpoint_dir": str(tmp_path / "ckpt"),
           "model_dir": str(tmp_path / "out-model")}  # fmt: skip
    note = preflight.check_data(config.config_from_mapping(raw), 1)  # as the trainer checks it before a step
    assert (
        note.startswith(f"data ok: 3 files of {meta['tokens']} tokens")
        and "preference pairs: 24 training pairs" in note
    )


def test_a_refused_run_keeps_its_complete_shards_for_the_same_command_to_go_on(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "fine"}\n')
    (tmp_path / "in" / "b.jsonl").write_text('{"text": "fine too"}\n{"text": 3}\n')
    out = tmp_path / "made" / "o"
    argv = [
        str(tmp_path / "in"),
        "--sharded",
        "--workers",
        "1",
        "--output",
        str(out),
        "--validation-fraction",
        "0",
    ]
    assert corpus.main(argv) == 2
    assert capsys.readouterr().err.startswith("error: b.jsonl:2: ")
    assert len(list(out.glob("shards/*/record.json"))) == 1 and not (out / manifest.MANIFEST_FILE).exists()
    (tmp_path / "in" / "b.jsonl").write_text('{"text": "fine too"}\n')
    assert corpus.main(argv) == 0
    assert "1 already complete, 1 to prepare" in capsys.readouterr().out
    # refused before any shard: the folder it made, and the parent it made, are gone
    (tmp_path / "in" / "c.jsonl").write_text('{"text": 3}\n')
    assert (
        corpus.main([str(tmp_path / "in" / "c.jsonl"), *argv[1:-3], str(tmp_path / "new" / "o"), *argv[-2:]])
        == 2
    )
    assert not (tmp_path / "new").exists()
