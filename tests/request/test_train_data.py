"""train_data_uri's folder as the request reads it before launch (training.request.reads, through decide_request):
the dtype its token files were written in decides the trainer's ``token_dtype`` (a conflicting one is refused in the
trainer's words), conversation metadata that lists no token files or records a token dtype that is no integer type
is refused, and a prepared conversation folder without its metadata.json is refused rather than trained as plain
tokens. docs/fine-tuning.md's own workflow example, decided on a Llama 3 sized vocabulary (uint32 tokens), passes the
trainer's own data check with the decided hyperparameters."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.request_corpus import LLAMA_8B
from tests.training.chat_models import model_folder
from training.prepare import chat
from training.request.decision import decide_request
from training.request.reads import Reads
from training.request.rules import RequestRules
from training.trainer import preflight
from training.trainer.config import config_from_mapping

RULES = RequestRules(bucket_name="my-training-bucket")
PAGE = Path(__file__).resolve().parents[2] / "docs" / "fine-tuning.md"
LLAMA3_SPECIAL_FROM = 128_000
"""Where Llama 3's special tokens start (its vocabulary: 128,000 BPE tokens, then 256 reserved and special)."""


def page_request() -> dict:
    """The execution input docs/fine-tuning.md shows under "In the workflow" (Llama 3.1 8B on support chats)."""
    section = PAGE.read_text(encoding="utf-8").split("## In the workflow", 1)[1]
    block = re.search(r"```json input[^\n]*\n(.*?)```", section, re.S)
    assert block is not None, "docs/fine-tuning.md: the workflow section has no json input block"
    return json.loads(block.group(1))


def llama3_sized(folder: Path) -> Path:
    """A model folder with Llama 3.1's chat template and a byte-level tokenizer padded to Llama 3's vocabulary
    (the special tokens at 128,000 and above), and Llama 3.1 8B's config.json: data prepared from it needs uint32
    token ids, as the real model's does."""
    model_folder(folder, "llama3.1")
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"<reserved_{i}>": i for i in range(len(vocab), LLAMA3_SPECIAL_FROM)})
    for offset, added in enumerate(tokenizer["added_tokens"]):
        added["id"] = LLAMA3_SPECIAL_FROM + offset
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (folder / "config.json").write_text(json.dumps(LLAMA_8B))
    (folder / "model.safetensors").write_bytes(b"{}")
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train_data")
    model = llama3_sized(root / "model")
    lines = [{"prompt": f"question {i}: " + "x" * 900, "completion": "y" * 900} for i in range(40)]
    (root / "chats.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    meta = chat.prepare_chat([root / "chats.jsonl"], str(root / "data"), str(model), validation_fraction=0)
    assert meta["token_dtype"] == "uint32"
    return {"root": root, "model": model, "data": root / "data"}


def decide(folders: dict[str, Path], request: dict, data: Path | None = None):
    reads = Reads(local_init_from=folders["model"], local_train_data=data or folders["data"])
    return decide_request(request, RULES, reads=reads)


def edited(folders: dict[str, Path], name: str, edit) -> Path:
    """A copy of the prepared data folder that ``edit(folder, meta)`` changed (its metadata.json written back
    unless ``edit`` removed it)."""
    copy = folders["root"] / name
    if not copy.exists():
        shutil.copytree(folders["data"], copy)
        meta = json.loads((copy / "metadata.json").read_text())
        edit(copy, meta)
        if (copy / "metadata.json").exists():
            (copy / "metadata.json").write_text(json.dumps(meta))
    return copy


def test_the_pages_workflow_example_launches_a_job_whose_trainer_accepts_the_data(folders):
    """Issue 53 item 2: the page's example (Llama 3.1 8B, a 128,256-token vocabulary, so uint32 tokens) launched
    with the trainer's default token_dtype uint16, which the trainer refuses at start. The data's recorded dtype
    now decides, and the trainer's own data check passes with the decided hyperparameters."""
    decision = decide(folders, page_request())
    assert decision.problems == [], decision.problems
    assert decision.hyperparameters["token_dtype"] == "uint32"
    job_settings = {**decision.hyperparameters, "init_from": str(folders["model"]),
                    "data_dir": str(folders["data"]), "checkpoint_dir": str(folders["root"] / "checkpoints"),
                    "model_dir": str(folders["root"] / "model_out")}  # fmt: skip
    cfg = config_from_mapping(job_settings)
    world = 8 * decision.config["instance_count"]  # ml.p6-b200.48xlarge: 8 GPUs
    said = preflight.check_data(cfg, world)
    assert said.startswith("data ok:"), said


def test_a_token_dtype_that_contradicts_the_data_is_refused_in_the_trainers_words(folders):
    request = {**page_request(), "hyperparameters": {"max_steps": "2000", "token_dtype": "uint16"}}
    decision = decide(folders, request)
    assert decision.problems == [
        "hyperparameters.token_dtype: must be uint32, the dtype the data was written in "
        "(s3://my-training-bucket/data/support-chats/metadata.json); got uint16"
    ]
    agreeing = {**page_request(), "hyperparameters": {"max_steps": "2000", "token_dtype": "uint32"}}
    assert decide(folders, agreeing).problems == []


@pytest.mark.parametrize(
    ("name", "edit", "said"),
    [
        ("float_dtype", lambda f, m: m.update(token_dtype="float32"),
         'token_dtype: must be one of uint16, uint32 (the integer types the trainer reads); got "float32"'),
        ("no_files", lambda f, m: m["splits"]["train"].update(files=[]),
         'splits.train.files: must be a list of one file name (["train.bin"] from prepare); got []'),
        ("no_masks", lambda f, m: m["splits"]["train"].pop("masks"),
         'splits.train.masks: must be a list of one file name (["train.mask"] from prepare); got null'),
    ],
)  # fmt: skip
def test_conversation_metadata_the_trainer_cannot_read_is_refused_before_launch(folders, name, edit, said):
    """Issue 53 item 3: metadata whose splits list no token files, or whose token_dtype is no integer type."""
    decision = decide(folders, page_request(), edited(folders, name, edit))
    (problem,) = decision.problems
    assert problem.startswith("train_data_uri: s3://my-training-bucket/data/support-chats/metadata.json: ")
    assert said in problem, problem


def test_a_prepared_conversation_folder_without_its_metadata_is_refused_not_trained_as_plain_tokens(folders):
    """Issue 53 item 3: without metadata.json the trainer reads train.bin as plain tokens: the masks are ignored
    and the user turns trained."""
    bare = edited(folders, "no_metadata", lambda f, m: (f / "metadata.json").unlink())
    (problem,) = decide(folders, page_request(), bare).problems
    assert problem == (
        "train_data_uri: s3://my-training-bucket/data/support-chats/ holds train.docs, train.mask (conversation "
        "data as prepare writes it) but no metadata.json: without it the trainer would read its token files as "
        "plain text, training every token (the user turns too) and ignoring the masks and the examples' "
        "boundaries; upload the metadata.json prepare wrote with them"
    )
