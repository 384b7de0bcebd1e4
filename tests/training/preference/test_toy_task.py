"""docs/preference-tuning.md's toy task, its opening commands run as printed (one run, about two minutes of one CPU
thread): every prepared answer follows the tokens the model is given when it answers (the generation prompt), and the
issue's figures hold: held-out reward accuracy at least 0.9, the preferred style up at least 30 points and the
rejected one under 10% of greedy answers, at least 90% of them stopping at the end-of-turn token."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def page_commands() -> list[list[str]]:
    """The opening block's commands, each as argv (``.venv/bin/python`` read as this interpreter; the block's
    ``export OMP_NUM_THREADS=1`` is the test's environment). tests/docs/test_runs.py leaves the page to this test."""
    page = (ROOT / "docs" / "preference-tuning.md").read_text()
    block = page.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        argv = shlex.split(line.split("#", 1)[0])
        if argv and argv[0].endswith("bin/python"):
            commands.append([sys.executable, *argv[1:]])
        else:
            assert not argv or argv == ["export", "OMP_NUM_THREADS=1"], line
    assert len(commands) == 7, block
    return commands


def styles_of(output: str) -> dict[str, dict[str, int]]:
    """The ``styles`` command's counts of each model folder, by the folder's parent's name (``sft``, ``dpo``)."""
    found = {}
    for line in output.splitlines():
        match = re.match(r"^(\S+): sentence (\d+)/50, plain (\d+)/50, other \d+/50; right (\d+)/50; stopped at the "
                         r"end-of-turn token (\d+)/50$", line)  # fmt: skip
        if match:
            keys = ("sentence", "plain", "right", "stopped")
            found[Path(match.group(1)).parent.name] = dict(
                zip(keys, map(int, match.groups()[1:]), strict=True)
            )
    return found


def test_the_pages_commands_teach_the_preferred_style_and_answers_still_stop(tmp_path):
    from transformers import AutoTokenizer

    os.symlink(ROOT / "docs", tmp_path / "docs")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    outputs = []
    for argv in page_commands():
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(proc.stdout)
    dpo_summary = next(line for line in outputs[4].splitlines() if line.startswith("summary "))
    accuracy = float(re.search(r" val_reward_accuracy=(\S+)", dpo_summary).group(1))
    counts = styles_of(outputs[5])
    assert "| Llama 3.1 8B, full DPO |" in outputs[6], outputs[6]
    before, after = counts["sft"], counts["dpo"]
    print(dpo_summary, counts)
    assert accuracy >= 0.9, dpo_summary
    assert after["sentence"] - before["sentence"] >= 15, counts  # 30 points of 50 answers
    assert after["plain"] < 5, counts  # under 10%
    assert after["stopped"] >= 45, counts  # at least 90%
    assert after["right"] >= 45, counts  # and the numbers still right
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
