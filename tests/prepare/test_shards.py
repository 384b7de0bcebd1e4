"""training.prepare: every input format -> shards + manifest, the split by hash, bad records, reruns, no overwrite."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.training.chat_models import model_folder
from tests.training.input_formats import write_corpus
from training.prepare import job
from training.prepare.kinds import stable_fraction
from training.prepare.shard import record_name
from training.prepare.store import LocalStore, StoreError
from training.request import data_manifest as manifest
from training.trainer.data import packing

FRACTION = 0.2


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    folder = tmp_path_factory.mktemp("corpus")
    return folder, write_corpus(folder)


def prepare(inputs: Path, output: Path, workers: int = 1, **options) -> job.Outcome:
    options.setdefault("validation_fraction", FRACTION)
    here = job.local_inputs(inputs)
    return job.run(
        job.Options(**options), LocalStore(output), sorted(here), here, workers=workers, say=lambda s: None
    )


def stream(folder: Path, split: str, key: str = "files") -> bytes:
    meta = json.loads((folder / manifest.MANIFEST_FILE).read_text())
    return b"".join((folder / name).read_bytes() for name in meta["splits"][split][key])


def test_every_format_becomes_the_documents_in_key_order_split_by_their_own_hash(corpus, tmp_path):
    folder, docs = corpus
    outcome = prepare(folder, tmp_path / "out")
    assert (outcome.prepared, outcome.skipped, outcome.manifest) == (7, 0, True)
    expected: dict[str, list] = {"train": [], "validation": []}
    for key in sorted(docs):  # key order, each object's records in order
        for text in docs[key]:
            split = "validation" if stable_fraction(text.encode()) < FRACTION else "train"
            expected[split].append(np.append(np.frombuffer(text.encode(), np.uint8), 256).astype(np.uint16))
    for split in ("train", "validation"):
        assert stream(tmp_path / "out", split) == np.concatenate(expected[split]).tobytes(), split
    meta = json.loads((tmp_path / "out" / manifest.MANIFEST_FILE).read_text())
    assert [s["key"] for s in meta["shards"]] == sorted(docs)  # README.json is no input
    assert meta["documents"] == sum(map(len, docs.values())) and meta["token_dtype"] == "uint16"
    assert meta["splits"]["validation"]["documents"] == len(expected["validation"]) > 0
    # the duplicated document went to the same split both times
    first = docs["a.jsonl"][0]
    assert (stable_fraction(first.encode()) < FRACTION) == (
        stable_fraction(docs["z.jsonl"][0].encode()) < FRACTION
    )
    assert manifest.meta_problems(meta) == []
    sizes = LocalStore(tmp_path / "out").listing()
    assert manifest.listing_problems(meta, sizes, "s3://b/p/") == []
    assert_split_digests(tmp_path / "out", meta, ("files",))


def assert_split_digests(folder: Path, meta: dict, keys: tuple[str, ...]) -> None:
    """Each split's ``sha256`` (the field a local preparation writes, for the trainer to verify) names every file of
    the split with its bytes' digest."""
    for split, entry in meta["splits"].items():
        names = [name for key in keys for name in entry[key]]
        digests = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in names}
        assert entry["sha256"] == digests, split


def test_a_process_pool_writes_the_same_bytes(corpus, tmp_path):
    folder, _ = corpus
    prepare(folder, tmp_path / "one", workers=1)
    prepare(folder, tmp_path / "two", workers=2)
    one, two = LocalStore(tmp_path / "one").listing(), LocalStore(tmp_path / "two").listing()
    assert one == two
    assert all((tmp_path / "one" / n).read_bytes() == (tmp_path / "two" / n).read_bytes() for n in one)


def test_a_bad_record_names_its_object_and_line_and_leaves_no_shard_half_written(corpus, tmp_path):
    folder, _ = corpus
    inputs = tmp_path / "in"
    shutil.copytree(folder, inputs)
    good = (inputs / "nested/deeper/e.jsonl").read_text().splitlines()
    (inputs / "nested/deeper/e.jsonl").write_text("\n".join([*good[:2], '{"text": 3}', *good[3:]]) + "\n")
    with pytest.raises(job.ShardError, match=r"^nested/deeper/e\.jsonl:3: field 'text' is not a string$"):
        prepare(inputs, tmp_path / "out")
    written = LocalStore(tmp_path / "out").listing()
    assert record_name("nested/deeper/e.jsonl") not in written
    assert not any("partial" in name for name in written)
    assert manifest.MANIFEST_FILE not in written
    assert manifest.unfinished_problem(written, "s3://b/out/")[0].startswith(
        "s3://b/out/ holds 4 complete shards"
    )
    # fixed, the rerun prepares only what is missing and writes the manifest
    (inputs / "nested/deeper/e.jsonl").write_text("\n".join(good) + "\n")
    outcome = prepare(inputs, tmp_path / "out")
    assert (outcome.prepared, outcome.skipped, outcome.manifest) == (3, 4, True)
    prepare(folder, tmp_path / "reference")
    assert stream(tmp_path / "out", "train") == stream(tmp_path / "reference", "train")


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("x.jsonl", b'{"text": "ok"}\n{"text": "broken\n', r"^x\.jsonl:2: not valid JSON"),
        ("x.jsonl", b'{"text": "ok"}\n\xff\xfe\n', r"^x\.jsonl:2: not UTF-8"),
        ("x.jsonl", b'{"body": "ok"}\n', r"^x\.jsonl:1: not a JSON object with a string field 'text'"),
        ("x.jsonl.gz", b"not gzip at all", r"^x\.jsonl\.gz: cannot be read as \.gz"),
        ("x.jsonl.zst", b"not zstd at all", r"^x\.jsonl\.zst: cannot be read as \.zst"),
        ("x.parquet", b"PAR1 not parquet", r"^x\.parquet: not a Parquet file"),
    ],
)
def test_refusals_are_one_line(tmp_path, name, content, said):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(content)
    with pytest.raises(job.ShardError, match=said) as caught:
        prepare(tmp_path / "in", tmp_path / "out")
    assert "\n" not in str(caught.value)
    assert not [n for n in LocalStore(tmp_path / "out").listing() if n.startswith("shards/")]


def test_a_rerun_skips_complete_shards_and_never_overwrites(corpus, tmp_path):
    folder, _ = corpus
    prepare(folder, tmp_path / "out")
    before = {n: (tmp_path / "out" / n).read_bytes() for n in LocalStore(tmp_path / "out").listing()}
    again = prepare(folder, tmp_path / "out")
    assert (again.prepared, again.skipped, again.manifest) == (0, 7, False)  # the manifest was there already
    assert {n: (tmp_path / "out" / n).read_bytes() for n in before} == before
    meta = json.loads((tmp_path / "out" / manifest.MANIFEST_FILE).read_text())
    damaged = meta["splits"]["train"]["files"][1]
    (tmp_path / "out" / damaged).write_bytes(b"\0\0" + (tmp_path / "out" / damaged).read_bytes()[2:])
    with pytest.raises(StoreError, match=f"{damaged}: not the bytes its record lists"):
        prepare(folder, tmp_path / "out")
    with pytest.raises(StoreError, match="prepared with other settings"):
        prepare(folder, tmp_path / "out", validation_fraction=0.1)


def test_the_request_checks_side_finds_missing_and_changed_files(corpus, tmp_path):
    folder, _ = corpus
    prepare(folder, tmp_path / "out")
    meta = json.loads((tmp_path / "out" / manifest.MANIFEST_FILE).read_text())
    sizes = LocalStore(tmp_path / "out").listing()
    first, second = meta["splits"]["train"]["files"][:2]
    del sizes[first]
    sizes[second] += 2
    found = manifest.listing_problems(meta, sizes, "s3://b/p/")
    assert found[0].startswith(f"s3://b/p/metadata.json lists 1 files that are not there ({first})")
    assert found[1].startswith(f"s3://b/p/metadata.json disagrees with 1 of its files ({second} (")
    assert manifest.meta_problems({**meta, "shards": meta["shards"][::-1]}) == [
        "shards: must be in the order of their keys"
    ]


def test_conversations_make_the_chat_manifest_the_request_check_reads(tmp_path):
    from training.request import sft_data

    model = model_folder(tmp_path / "model", "llama3.1")
    (tmp_path / "in").mkdir()
    for part in range(2):
        lines = [{"messages": [{"role": "user", "content": f"q{part} {i}"}, {"role": "assistant", "content": f"a {i}"}]}
                 for i in range(30)]  # fmt: skip
        lines.append({"prompt": "p", "completion": "c" * 400})
        (tmp_path / "in" / f"chat-{part}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    prepare(tmp_path / "in", tmp_path / "out", kind="chat", init_from=str(model), max_tokens=300)
    meta = json.loads((tmp_path / "out" / manifest.MANIFEST_FILE).read_text())
    assert (
        meta["kind"] == "chat" and meta["counts"]["read"] == 62 and meta["counts"]["dropped_for_length"] == 2
    )
    assert meta["chat_template"]["end_of_turn"] == ["<|eot_id|>"] and meta["input_format"] == "messages"
    assert sft_data.meta_problems(meta) == []
    assert_split_digests(tmp_path / "out", meta, ("files", "masks", "documents"))
    files = {name: (model / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    assert sft_data.check_against_model(meta, files, None, str(model)) == []
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == files["tokenizer.json"]
    for split in ("train", "validation"):
        tokens = np.frombuffer(stream(tmp_path / "out", split), np.uint16)
        mask = np.frombuffer(stream(tmp_path / "out", split, "masks"), np.uint8)
        lengths = dict(map(tuple, meta["splits"][split]["lengths"]))
        assert (
            len(tokens)
            == len(mask)
            == sum(n * c for n, c in lengths.items())
            == meta["splits"][split]["tokens"]
        )
        assert sum(lengths.values()) == meta["splits"][split]["examples"]
        read, trained, offsets = packing.read_split(
            tmp_path / "out", split, "uint16"
        )  # as the trainer reads it
        assert read.tobytes() == tokens.tobytes() and trained.tobytes() == mask.tobytes()
        assert sorted(np.diff(offsets).tolist()) == sorted(n for n, c in lengths.items() for _ in range(c))


def test_the_request_check_refuses_a_prepared_folder_unfinished_or_disagreeing_with_its_manifest(
    corpus, tmp_path
):
    import boto3
    from moto import mock_aws

    from training.request.reads import prepared_problems

    folder, _ = corpus
    prepare(folder, tmp_path / "out")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data-bucket")
        for name in LocalStore(tmp_path / "out").listing():
            s3.upload_file(str(tmp_path / "out" / name), "data-bucket", f"data/ready/{name}")
        s3.put_object(Bucket="data-bucket", Key="data/plain/train.bin", Body=b"\0\0")
        assert prepared_problems(s3, "s3://data-bucket/data/ready/") == []
        assert prepared_problems(s3, "s3://data-bucket/data/plain/") == []  # no shards: another kind of data
        meta = json.loads((tmp_path / "out" / manifest.MANIFEST_FILE).read_text())
        s3.delete_object(Bucket="data-bucket", Key=f"data/ready/{meta['splits']['train']['files'][0]}")
        (found,) = prepared_problems(s3, "s3://data-bucket/data/ready/")
        assert found.startswith(
            "train_data_uri: s3://data-bucket/data/ready/metadata.json lists 1 files that are not"
        )
        s3.delete_object(Bucket="data-bucket", Key="data/ready/metadata.json")
        (found,) = prepared_problems(s3, "s3://data-bucket/data/ready/")
        assert found.startswith(
            "train_data_uri: s3://data-bucket/data/ready/ holds 7 complete shards but no metadata"
        )


def test_preference_pairs_make_the_preference_manifest_the_request_check_reads(tmp_path):
    """Issue 55 items 1, 2 and 4 for preference pairs: ``kind`` pairs splits each pair by its own hash, writes two
    sequences per pair (offsets in ``documents``), a manifest with ``kind: preference``, pair histograms (both
    sequences) and ``max_sequence_tokens``, which the request check reads as a sharded conversation manifest; a bad
    pair or a conversation among pairs is one line naming the object and the line."""
    import boto3
    from moto import mock_aws

    from training.prepare.kinds import stable_fraction as fraction_of
    from training.request import sft_data
    from training.request.reads import prepared_problems

    model = model_folder(tmp_path / "model", "llama3.1")
    (tmp_path / "in").mkdir()
    for part in range(2):
        lines = [{"prompt": f"q{part} {i}", "chosen": f"yes {i}", "rejected": "no"} for i in range(20)]
        (tmp_path / "in" / f"pairs-{part}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    prepare(tmp_path / "in", tmp_path / "out", kind="pairs", init_from=str(model))
    meta = json.loads((tmp_path / "out" / manifest.MANIFEST_FILE).read_text())
    assert meta["kind"] == "preference" and meta["input_format"] == "standard" and meta["pairs"] == 40
    assert meta["counts"] == {"read": 40, "truncated": 0, "dropped_for_length": 0, "examples": 40}
    assert meta["chat_template"]["end_of_turn"] == ["<|eot_id|>"] and meta["max_sequence_tokens"] > 0
    held = sum(
        fraction_of(json.dumps(x, sort_keys=True, separators=(",", ":")).encode()) < FRACTION
        for part in range(2)
        for x in ({"prompt": f"q{part} {i}", "chosen": f"yes {i}", "rejected": "no"} for i in range(20))
    )
    assert (
        meta["splits"]["validation"]["examples"] == held > 0
        and meta["splits"]["train"]["examples"] == 40 - held
    )
    assert sft_data.meta_problems(meta) == []
    files = {name: (model / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    assert sft_data.check_against_model(meta, files, None, str(model)) == []
    for split, entry in meta["splits"].items():
        _, _, offsets = packing.read_split(tmp_path / "out", split, meta["token_dtype"])
        sides = np.diff(offsets)
        assert len(sides) == entry["sequences"] == 2 * entry["examples"]
        pair_lengths = (sides[0::2] + sides[1::2]).tolist()
        assert sorted(pair_lengths) == sorted(n for n, c in entry["lengths"] for _ in range(c))
        assert max(sides) <= meta["max_sequence_tokens"] and max(pair_lengths) <= meta["max_example_tokens"]
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="data-bucket")
        for name in LocalStore(tmp_path / "out").listing():
            s3.upload_file(str(tmp_path / "out" / name), "data-bucket", f"pairs/{name}")
        assert prepared_problems(s3, "s3://data-bucket/pairs/") == []
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "p.jsonl").write_text(
        json.dumps({"prompt": "q", "chosen": "a", "rejected": "a"}) + "\n"
    )
    with pytest.raises(job.ShardError, match=r"^p\.jsonl:1: 'chosen' and 'rejected' are the same answer"):
        prepare(tmp_path / "bad", tmp_path / "out-bad", kind="pairs", init_from=str(model))
    (tmp_path / "bad" / "p.jsonl").write_text(
        json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n"
        + json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n"
    )  # fmt: skip
    with pytest.raises(
        job.ShardError, match=r"^p\.jsonl:2: a preference pair is a JSON object with 'chosen'"
    ):
        prepare(tmp_path / "bad", tmp_path / "out-bad2", kind="pairs", init_from=str(model))
    assert not list((tmp_path / "out-bad2").rglob("*.bin"))
