"""docs/preference-tuning.md's toy task: its opening commands run as printed, and every prepared answer follows the
tokens the model is given when it answers (the generation prompt), so that what DPO lifts and lowers is what the
``styles`` command's greedy generation then picks from."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def page_commands() -> list[list[str]]:
    """The opening block's ``setup`` and ``prepare`` commands, each as argv (``.venv/bin/python`` read as this
    interpreter; the plan command is tests/plan/test_preference_plan.py's)."""
    page = (ROOT / "docs" / "preference-tuning.md").read_text()
    block = page.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        argv = shlex.split(line.split("#", 1)[0])
        if "preference_example.py" in line or "training.prepare" in line:
            commands.append(
                [sys.executable if arg.endswith("bin/python") else arg for arg in argv if "=" not in arg]
            )
    assert len(commands) == 2, block
    return commands


def test_the_pages_commands_prepare_answers_that_follow_the_generation_prompt(tmp_path):
    from transformers import AutoTokenizer

    os.symlink(ROOT / "docs", tmp_path / "docs")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for argv in page_commands():
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    example = tmp_path / "example"
    meta = json.loads((example / "pairs" / "metadata.json").read_text())
    assert meta["kind"] == "preference"
    tokenizer = AutoTokenizer.from_pretrained(example / "model")
    ids = np.fromfile(example / "pairs" / "train.bin", dtype=meta["token_dtype"]).astype(np.int64)
    mask = np.fromfile(example / "pairs" / "train.mask", dtype=np.uint8).astype(bool)
    assert len(mask) == len(ids)
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]])) + 1
    assert len(starts) == meta["splits"]["train"]["sequences"]
    pairs = {
        json.loads(line)["prompt"][0]["content"]: json.loads(line)
        for line in (example / "pairs.jsonl").open()
    }
    seen = {"chosen": 0, "rejected": 0}
    for start, end in zip(starts, ends, strict=True):
        # the user's number is the last digits before the header that opens the answer
        before = tokenizer.decode(ids[max(0, start - 40) : start].tolist())
        number = before.rsplit("<|start_header_id|>user<|end_header_id|>\n\n", 1)[1].split("<|eot_id|>", 1)[0]
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": number}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        assert ids[start - len(prompt) : start].tolist() == prompt, (
            number,
            tokenizer.convert_ids_to_tokens(ids[start - 4 : end].tolist()),
            prompt[-4:],
        )
        answer = tokenizer.decode(ids[start:end].tolist(), skip_special_tokens=True)
        side = "chosen" if answer == pairs[number]["chosen"][0]["content"] else "rejected"
        assert answer == pairs[number][side][0]["content"]
        seen[side] += 1
    assert seen == {
        "chosen": meta["splits"]["train"]["examples"],
        "rejected": meta["splits"]["train"]["examples"],
    }
