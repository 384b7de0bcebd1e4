"""Fine-tuning on conversations, decided before launch (training.request.fine_tuning through decide_request): the
prepared data's metadata.json against the init_from model (template, tokenizer, vocabulary: the trainer's own
check), seq_length against the longest example, the windows per global batch, the plan of the packed windows and
of the torch path's document mask, a tuning run's candidates keeping the data's constraints, and what an offline
decision says it did not check. The folders are read as local copies of their S3 URIs (what the CLI's
``validate --init-from/--data-folder`` does; the workflow reads the same files from S3: tests/workflow)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.training.chat_models import model_folder, template
from training.contract import settings_parse
from training.plan import inputs, memory, memory_attention, memory_terms
from training.prepare import chat
from training.request import hf_config, sft_data
from training.request.decision import decide_request
from training.request.reads import Reads
from training.request.rules import RequestRules
from training.trainer.data import packing

RULES = RequestRules(bucket_name="b")
DATA, MODEL, OTHER = "s3://b/data/chats/", "s3://b/data/model/", "s3://b/data/other/"
SHAPE = {"model_preset": "custom", "num_layers": "2", "hidden_size": "64", "num_heads": "4", "num_kv_heads": "2",
         "ffn_hidden_size": "128", "vocab_size": "272"}  # fmt: skip
REQUEST = {"init_from": MODEL, "train_data_uri": DATA, "precision": "bf16", "seq_length": 256, "batch_size": 1,
           "hyperparameters": {"max_steps": "100"}}  # fmt: skip


def weightless(folder: Path, template_text: str | None = None) -> Path:
    """A model folder as the request reads it: Llama 3.1's tokenizer files, a config.json, a safetensors file."""
    model_folder(folder, "llama3.1", template_text=template_text)
    config = hf_config.to_config(settings_parse.parse_hyperparameters(SHAPE))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"{}")
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fine_tuning_request")
    model = weightless(root / "model")
    other = weightless(
        root / "other", template("llama3.1").replace("Cutting Knowledge Date", "Knowledge cutoff")
    )
    rng = random.Random(0)
    lines = [{"prompt": "x" * rng.randint(1, 80), "completion": "y" * rng.randint(1, 40)} for _ in range(200)]
    (root / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    chat.prepare_chat([root / "chats.jsonl"], str(root / "data"), str(model), validation_fraction=0.1)
    return {"root": root, "model": model, "other": other, "data": root / "data"}


def decide(folders: dict[str, Path], request: dict | None = None):
    raw = {**REQUEST, **(request or {})}
    model = {MODEL: folders["model"], OTHER: folders["other"]}[raw["init_from"]]
    return decide_request(raw, RULES, reads=Reads(local_init_from=model, local_train_data=folders["data"]))


def unchecked(decision) -> list[str]:
    """What the decision says it could not check of the two folders (``Decision.skipped``)."""
    return [
        line for line in decision.skipped if line.startswith(("init_from:", "train_data_uri: its metadata"))
    ]


def test_best_fit_counted_from_the_lengths_is_the_trainers_own_packing():
    rng = np.random.default_rng(0)
    for capacity in (8, 64, 100, 4096):
        for sampled in (rng.integers(1, capacity + 1, 300), np.minimum(rng.lognormal(3, 1, 500).astype(int) + 1, capacity),
                        np.full(7, capacity), np.ones(50, dtype=int), rng.integers(capacity // 3, capacity // 2 + 2, 99)):  # fmt: skip
            histogram = {int(k): int(v) for k, v in zip(*np.unique(sampled, return_counts=True), strict=True)}
            assert sft_data.packed_windows(histogram, capacity) == len(
                packing.best_fit_decreasing(sampled, capacity)
            )


def test_prepare_records_each_splits_lengths(folders):
    meta = json.loads((folders["data"] / "metadata.json").read_text())
    for split in ("train", "validation"):
        offsets = np.fromfile(folders["data"] / f"{split}.docs", dtype=np.int64)
        assert sft_data.split_lengths(meta, split) == dict(
            zip(*np.unique(np.diff(offsets), return_counts=True), strict=True)
        )


def test_a_matching_fine_tuning_request_is_valid_and_its_plan_counts_the_packed_windows(folders):
    decision = decide(folders)
    assert decision.problems == [] and unchecked(decision) == []
    assert decision.request.chat.model == MODEL and decision.request.chat.mismatches == ()
    data = decision.plan["data"]
    windows = packing.Conversations(folders["data"], "train", token_dtype="uint16", seq_length=256, batch_size=1,
                                    seed=0, rank=0, world_size=1).windows  # fmt: skip
    assert (data["windows"], data["windows_exact"], data["packing"]) == (len(windows), True, True)
    assert data["steps_per_epoch"] == round(len(windows) / 8, 2)  # 8 GPUs x batch 1
    assert data["epochs"] == round(100 / (len(windows) / 8), 2)
    assert data["truncation"].startswith("no example was cut or dropped")
    assert "packed by best-fit decreasing" in data["summary"]
    unpacked = decide(folders, {"hyperparameters": {"max_steps": "100", "packing": "false"}}).plan["data"]
    assert unpacked["windows"] == data["examples"] > data["windows"]
    assert (
        decision.estimate.memory.parts["document mask"] == 256 * 256 / memory_terms.GIB
    )  # bf16: the torch path's mask


def test_the_job_names_init_froms_s3_uri_as_the_source_its_exports_record_unless_the_request_names_one(
    folders,
):
    """The job sees only the weights channel's folder: the decision passes init_from's S3 URI as the trainer's
    ``init_from_source``, which the peft adapter records as its base (issue 53 item 13); a Hub model id the request
    gives is kept."""
    decision = decide(folders)
    assert decision.valid, decision.problems
    assert decision.hyperparameters["init_from"] == "/opt/ml/input/data/weights"
    assert decision.hyperparameters["init_from_source"] == MODEL
    named = decide(
        folders, {"hyperparameters": {"max_steps": "100", "init_from_source": "meta-llama/Llama-3.1-8B"}}
    )
    assert named.valid and named.hyperparameters["init_from_source"] == "meta-llama/Llama-3.1-8B"
    refused = decide_request({"hyperparameters": {"init_from_source": "org/model"}}, RULES)
    assert any(
        p.startswith("hyperparameters.init_from_source: only with init_from") for p in refused.problems
    ), refused.problems


def test_data_rendered_with_another_template_is_refused_in_one_line_naming_the_field(folders):
    (problem,) = decide(folders, {"init_from": OTHER}).problems
    assert problem.startswith(f"train_data_uri: the chat template of {OTHER} (tokenizer_config.json, sha256 ")
    assert problem.endswith("prepare the data again with --init-from this folder") and "\n" not in problem


def test_a_seq_length_below_the_longest_example_is_refused(folders):
    meta = json.loads((folders["data"] / "metadata.json").read_text())
    longest = meta["max_example_tokens"]
    seq = (longest - 1) // 8 * 8  # bf16 runs need a multiple of 8
    (problem,) = decide(folders, {"seq_length": seq}).problems
    longer = sum(
        n
        for split in ("train", "validation")
        for t, n in sft_data.split_lengths(meta, split).items()
        if t > seq
    )
    assert problem == (
        f"seq_length: must be at least {longest}, the longest example of the conversation data in {DATA} ({longer} "
        f"examples longer than {seq}; prepared without --max-tokens); examples are never cut at training: raise "
        f"seq_length, or prepare the data again with --max-tokens {seq}; got {seq}"
    )
    assert decide(folders, {"seq_length": seq + 8}).problems == []


def test_fewer_windows_than_one_global_batch_are_refused(folders):
    windows = decide(folders).plan["data"]["windows"]
    batch = windows // 16 + 1  # 2 instances of 8 GPUs
    problems = decide(folders, {"batch_size": batch, "instance_count": 2}).problems
    assert len(problems) == 2 and problems[0] == (
        f"batch_size: the train split of {DATA} makes {windows} windows of seq_length 256 (180 examples, packed); "
        f"one global batch (batch_size {batch} x 16 GPUs) needs {16 * batch}: lower batch_size or seq_length, or "
        f"add data; got {batch}"
    )
    assert problems[1].startswith(f"batch_size: the validation split of {DATA} makes ")


def test_truncation_at_preparation_is_said_in_the_plan(folders, tmp_path):
    cut = (json.loads((folders["data"] / "metadata.json").read_text())["max_example_tokens"] - 16) // 8 * 8
    chat.prepare_chat([folders["root"] / "chats.jsonl"], str(tmp_path / "cut"), str(folders["model"]),
                              validation_fraction=0.1, max_tokens=cut, too_long="truncate")  # fmt: skip
    local = Reads(local_init_from=folders["model"], local_train_data=tmp_path / "cut")
    decision = decide_request({**REQUEST, "seq_length": cut}, RULES, reads=local)
    counts = json.loads((tmp_path / "cut" / "metadata.json").read_text())["counts"]
    assert decision.problems == [] and counts["truncated"] > 0
    assert decision.plan["data"]["truncation"] == (
        f"{counts['truncated']} examples cut to their first {cut} tokens (an answer cut there loses its end-of-turn "
        f"token) and {counts['dropped_for_length']} dropped for length, of 200 read (prepared with --max-tokens "
        f"{cut} --too-long truncate)"
    )


def test_offline_without_the_folders_it_says_what_it_did_not_check(folders):
    decision = decide_request(REQUEST, RULES)
    assert decision.problems == []
    model, data = unchecked(decision)
    assert model.startswith("init_from: the model folder's config.json (read from S3 before launch)")
    assert model.endswith("(offline: a local copy of the folder, --init-from DIR)")
    assert data.startswith(
        "train_data_uri: its metadata.json (read from S3 before launch): prepared conversations"
    )
    assert data.endswith("(offline: a local copy of the folder, --data-folder DIR)")
    data_only = decide_request(REQUEST, RULES, reads=Reads(local_train_data=folders["data"]))
    (model,) = unchecked(data_only)
    assert (
        "a tuning run's candidates, and the conversation data against its chat template, tokenizer and "
        in model
    )


def test_a_metadata_json_that_is_not_json_is_refused(folders, tmp_path):
    shutil.copytree(folders["data"], tmp_path / "data")
    (tmp_path / "data" / "metadata.json").write_text("{not json")
    decision = decide_request(
        REQUEST, RULES, reads=Reads(local_init_from=folders["model"], local_train_data=tmp_path / "data")
    )
    assert decision.problems[0].startswith(f"train_data_uri: {DATA}metadata.json is not valid JSON")


def test_tuning_candidates_keep_the_datas_constraints(folders):
    longest = json.loads((folders["data"] / "metadata.json").read_text())["max_example_tokens"]
    short = max(s for s in (64, 128, 256) if s < longest)
    tune = {"search_space": {"seq_length": [short, 256], "batch_size": [1]}, "max_trials": 4}
    decision = decide(folders, {"tune": tune, "hyperparameters": {"max_steps": "100", "grad_accum_steps": "2"},
                                "seq_length": 256, "batch_size": 1})  # fmt: skip
    assert decision.problems == [], decision.problems
    trials = decision.tune["plan"]["trials"]
    assert [t["settings"]["seq_length"] for t in trials if not t["probe"]] == [256]
    (refused,) = decision.tune["plan"]["refused_by_the_trainer"]
    assert refused.startswith(f"seq_length={short}, batch_size=1: seq_length: must be at least {longest}, ")


def test_the_document_mask_is_planned_on_the_torch_path_only():
    values = settings_parse.parse_hyperparameters({"model_preset": "llama3.1-8b", "precision": "bf16", "seq_length": "4096",
                                             "batch_size": "2", "activation_checkpointing": "none"})  # fmt: skip
    packed = inputs.setup_from_values(values, instance_type="ml.p6-b200.48xlarge", conversations=True)
    plain = inputs.setup_from_values(values, instance_type="ml.p6-b200.48xlarge")
    assert (
        memory_attention.document_mask_bytes(packed) == 2 * 4096 * 4096
        and memory_attention.document_mask_bytes(plain) == 0
    )
    h, kv, hd = 4096, 1024, 128
    bias = 2 * 2 * 4096 * 4096  # bf16 additive bias, [batch, 1, seq, seq]
    assert (
        memory_attention.document_mask_layer_bytes(packed)
        == bias + 2 * (h - 3 * kv) * 2 * 4096 + 4 * 2 * 1 * 4096 * hd
    )
    saved = memory.saved_per_block(packed)[0] - memory.saved_per_block(plain)[0]
    assert saved == memory_attention.document_mask_layer_bytes(packed)
    grown = memory.estimate_memory(packed).peak_gib - memory.estimate_memory(plain).peak_gib
    assert grown > 32 * bias / memory_terms.GIB  # every block keeps its bias without activation checkpointing
    mxfp8 = inputs.setup_from_values({**values, "precision": "mxfp8"}, instance_type="ml.p6-b200.48xlarge",
                                   conversations=True)  # fmt: skip
    assert (
        memory_attention.document_mask_bytes(mxfp8) == memory_attention.document_mask_layer_bytes(mxfp8) == 0
    )  # TE: cu_seqlens
    unpacked = inputs.setup_from_values({**values, "packing": False}, instance_type="ml.p6-b200.48xlarge",
                                      conversations=True)  # fmt: skip
    assert not unpacked.packed_documents


def edited_data(folders: dict[str, Path], name: str, edit) -> dict[str, Path]:
    """``folders`` with a copy of the prepared data whose metadata.json ``edit`` changed (a damaged or hostile file)."""
    copy = folders["root"] / name
    if not copy.exists():
        shutil.copytree(folders["data"], copy)
        meta = json.loads((folders["data"] / "metadata.json").read_text())
        edit(meta)
        (copy / "metadata.json").write_text(json.dumps(meta))
    return {**folders, "data": copy}


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("max_token_id", lambda m: m.update(max_token_id="abc")),
        ("max_example_tokens", lambda m: m.pop("max_example_tokens")),
        ("splits", lambda m: m.update(splits=[1, 2])),
        ("chat_template", lambda m: m.update(chat_template="x")),
        ("tokenizer.sha256", lambda m: m.update(tokenizer={"sha256": 5})),
        ("truncation.too_long", lambda m: m.update(truncation={"max_tokens": 8, "too_long": "x" * 300_000})),
        ("counts.read", lambda m: m.update(counts={"read": "y" * 300_000})),
        ("splits.train.lengths", lambda m: m["splits"]["train"].update(lengths=[[0, 5], [10, 3]])),
        ("splits.train.tokens", lambda m: m["splits"]["train"].update(tokens="x")),
        ("splits.validation.lengths", lambda m: m["splits"]["validation"].update(lengths=[[10.5, 2]])),
    ],
)
def test_a_damaged_metadata_json_is_refused_by_name_not_crashed_on(folders, field, edit):
    decision = decide(edited_data(folders, f"damaged_{field}", edit))
    assert not decision.valid
    [problem] = decision.problems
    assert problem.startswith(f"train_data_uri: {DATA}metadata.json: {field}: must be ")
    assert len(json.dumps(decision.state())) < 4096  # the hostile values are not carried into the state


def test_seq_length_is_checked_against_the_recorded_lengths_too(folders):
    """A metadata.json whose max_example_tokens is below its own lengths (hand-edited) does not let a seq_length
    the trainer refuses through."""
    data = edited_data(folders, "understated", lambda m: m.update(max_example_tokens=10))
    longest = max(length for split in ("train", "validation") for length, _ in json.loads(
        (folders["data"] / "metadata.json").read_text())["splits"][split]["lengths"])  # fmt: skip
    decision = decide(data, {"seq_length": (longest - 1) // 16 * 16})  # bf16: a multiple of 16
    assert any(p.startswith(f"seq_length: must be at least {longest},") for p in decision.problems)


def test_a_metadata_json_too_large_for_the_lambda_is_refused_before_it_is_read(folders, monkeypatch):
    from training.request import read_limits

    monkeypatch.setattr(read_limits, "MAX_JSON_BYTES", 100)
    decision = decide(folders)
    assert any(
        p.startswith(f"train_data_uri: {DATA}metadata.json takes ")
        and "more than the 100 the request check reads of such a file (its Lambda function has 256 MB)" in p
        for p in decision.problems
    ), decision.problems


def _math_saved_bytes(dtype, masked: bool) -> int:
    """Bytes torch's math SDPA saves for its backward beyond its inputs, for a grouped-query block's attention as
    ``model.causal_attention`` calls it (causal with ``enable_gqa``, or a block-causal mask with key and value
    repeated to the query's heads)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from training.trainer.model.decoder import causal_attention

    batch, heads, kv_heads, seq, head_dim = 2, 8, 2, 64, 16
    qkv = torch.randn(batch, seq, (heads + 2 * kv_heads) * head_dim, dtype=dtype, requires_grad=True)
    q, k, v = (part.view(batch, seq, -1, head_dim).transpose(1, 2)
               for part in qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], -1))  # fmt: skip
    mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool).tril() if masked else None
    storages: dict[int, int] = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), sdpa_kernel(SDPBackend.MATH):
        causal_attention(q, k, v, mask=mask)
    storages.pop(qkv.untyped_storage().data_ptr(), None)
    return sum(storages.values())


def test_with_math_attention_the_mask_adds_no_bias_nor_repeated_key_value_to_what_a_block_keeps():
    """torch's math kernel keeps the same tensors with a block-causal mask and repeated key/value as causal with
    enable_gqa (math_attention_bytes counts them): the plan adds only the per-document RoPE tables."""
    import torch

    for dtype in (torch.bfloat16, torch.float32):
        assert _math_saved_bytes(dtype, masked=True) == _math_saved_bytes(dtype, masked=False)
    values = settings_parse.parse_hyperparameters({"model_preset": "llama3.1-8b", "precision": "bf16", "seq_length": "4096",
                                             "batch_size": "2", "activation_checkpointing": "none",
                                             "attention_backend": "math"})  # fmt: skip
    packed = inputs.setup_from_values(values, instance_type="ml.p6-b200.48xlarge", conversations=True)
    plain = inputs.setup_from_values(values, instance_type="ml.p6-b200.48xlarge")
    per_document_rope = 4 * 2 * (2 - 1) * 4096 * 128
    assert memory_attention.document_mask_layer_bytes(packed) == per_document_rope
    assert memory.saved_per_block(packed)[0] - memory.saved_per_block(plain)[0] == per_document_rope


def test_a_tuning_run_counts_each_splits_windows_once_per_seq_length(folders, monkeypatch):
    """Best-fit decreasing over a long context's lengths takes a tenth of a second: a tuning run's candidates (up
    to tuning.MAX_COMBINATIONS, in the 30-second Lambda) ask the same few seq_length again, answered once each."""
    counted: list[int] = []
    real = sft_data.packed_windows

    def counting(histogram, capacity):
        counted.append(capacity)
        return real(histogram, capacity)

    monkeypatch.setattr(sft_data, "packed_windows", counting)
    tune = {
        "search_space": {"batch_size": [1, 2], "activation_checkpointing": ["none", "full"]},
        "max_trials": 4,
    }
    decision = decide(folders, {"tune": tune, "seq_length": 256})
    assert decision.problems == [], decision.problems
    assert sorted(counted) == [256, 256]  # the train and validation splits, once each


def edited_model(folders: dict[str, Path], name: str, edit) -> dict[str, Path]:
    """``folders`` with a copy of the model folder that ``edit`` changed (a hostile or damaged file)."""
    copy = folders["root"] / name
    if not copy.exists():
        shutil.copytree(folders["model"], copy)
        edit(copy)
    return {**folders, "model": copy}


def _config_with(folder: Path, text: str) -> None:
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(config.replace('"vocab_size": 272', f'"vocab_size": {text}'))


@pytest.mark.parametrize(
    ("name", "edit", "said"),
    [
        ("jinja", lambda f: (f / "chat_template.jinja").write_bytes(b"{{ messages }}\xff"),
         f"train_data_uri: {MODEL}chat_template.jinja is not UTF-8 text (byte 14: "),
        ("vocab_abc", lambda f: _config_with(f, '"abc"'),
         "config.json: vocab_size must be a positive integer; got 'abc'"),
        ("vocab_1e400", lambda f: _config_with(f, "1e400"),
         "config.json: vocab_size must be a positive integer; got inf"),
    ],
)  # fmt: skip
def test_a_hostile_model_file_is_refused_by_name_not_raised(folders, name, edit, said):
    """Issue 53 item 6: a chat_template.jinja that is not UTF-8 and a vocab_size of "abc" or 1e400 raised in
    sft_data (UnicodeDecodeError, ValueError, OverflowError) instead of refusing."""
    changed = edited_model(folders, f"hostile_{name}", edit)
    decision = decide_request(
        {**REQUEST}, RULES, reads=Reads(local_init_from=changed["model"], local_train_data=folders["data"])
    )
    if said.startswith("config.json"):  # the init_from read names the folder it read (here its local copy)
        assert any(p.startswith("init_from: ") and p.endswith(said) for p in decision.problems), (
            decision.problems
        )
    else:
        assert any(p.startswith(said) for p in decision.problems), decision.problems
