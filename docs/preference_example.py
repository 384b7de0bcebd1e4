"""docs/preference-tuning.md's example: a tiny model learns to prefer one style of answer, on a CPU in minutes.

    .venv/bin/python docs/preference_example.py setup example/
    .venv/bin/python docs/preference_example.py styles example/sft/hf example/dpo/hf example/heldout.jsonl

``setup`` writes ``example/model/`` (a tiny random ``LlamaForCausalLM`` with Llama 3.1's published chat template,
as docs/fine-tuning.md's example does), ``example/styles.jsonl`` (conversations for a first, supervised
fine-tuning: the user names a three-digit number, the assistant answers with the next one, mostly plainly, ``418``,
sometimes as a sentence, ``The next number is 418.``), ``example/pairs.jsonl`` (preference pairs on the same
prompts: the sentence chosen, the plain answer rejected) and ``example/heldout.jsonl`` (numbers in neither).
``styles`` loads each exported Hugging Face folder with ``transformers``, answers every held-out prompt greedily
through ``apply_chat_template(..., add_generation_prompt=True)``, and prints the share of answers in each style, of
right numbers and of answers that stopped at the end-of-turn token.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.training.chat_models import model_folder, template  # noqa: E402

NUMBERS = range(100, 1000)
HELD_OUT = 50
PREFERRED_SHARE = 0.25
"""The share of the supervised conversations answered in the preferred style: the fine-tuned model has seen it, but
answers the other way (a greedy answer takes the more likely first token)."""
STYLES = {
    "sentence": re.compile(r"^The next number is (\d+)\.$"),
    "plain": re.compile(r"^(\d{3,4})$"),
}
"""How an answer is told apart: the preferred style (chosen in the pairs) and the rejected one."""


def answer(number: int, style: str) -> str:
    return f"The next number is {number + 1}." if style == "sentence" else str(number + 1)


def data(folder: Path, seed: int = 0) -> None:
    """``styles.jsonl``, ``pairs.jsonl`` and ``heldout.jsonl`` (see the module doc)."""
    rng = random.Random(seed)
    held = set(rng.sample(list(NUMBERS), HELD_OUT))
    train = [n for n in NUMBERS if n not in held]
    rng.shuffle(train)
    conversations = [
        {"prompt": str(n), "completion": answer(n, "sentence" if rng.random() < PREFERRED_SHARE else "plain")}
        for n in train
    ]
    pairs = [
        {"prompt": [{"role": "user", "content": str(n)}],
         "chosen": [{"role": "assistant", "content": answer(n, "sentence")}],
         "rejected": [{"role": "assistant", "content": answer(n, "plain")}]}
        for n in train
    ]  # fmt: skip
    for name, lines in (("styles.jsonl", conversations), ("pairs.jsonl", pairs)):
        (folder / name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / "heldout.jsonl").write_text(
        "".join(
            json.dumps({"prompt": str(n), "completion": answer(n, "sentence")}) + "\n" for n in sorted(held)
        )
    )


def setup(folder: Path, layers: int = 2, hidden: int = 128, seed: int = 0) -> None:
    """The model folder (its tokenizer's merges learnt from the template's rendering of the conversations, as
    docs/fine_tuning_example.py makes it) and the data."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    folder.mkdir(parents=True, exist_ok=True)
    data(folder, seed)
    render = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        template("llama3.1")
    )
    corpus = []
    for line in (folder / "styles.jsonl").read_text().splitlines()[:200]:
        record = json.loads(line)
        messages = [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["completion"]},
        ]
        corpus.append(render.render(messages=messages, bos_token="", add_generation_prompt=False))
    model_folder(folder / "model", "llama3.1", with_weights=True, layers=layers, hidden=hidden, seed=seed,
                 corpus=corpus, newline_runs=True)  # fmt: skip


def style_of(text: str) -> str:
    return next((name for name, pattern in STYLES.items() if pattern.match(text)), "other")


def styles(model_dir: Path, heldout: Path, show: int = 3) -> dict[str, Any]:
    """Greedy answers of the exported model ``model_dir`` to every held-out prompt: the share of each style, of
    right numbers and of answers that stopped at the end-of-turn token."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    counts = {"sentence": 0, "plain": 0, "other": 0, "right": 0, "stopped": 0, "total": 0}
    for index, line in enumerate(heldout.read_text().splitlines()):
        number = int(json.loads(line)["prompt"])
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": str(number)}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)  # fmt: skip
        out = model.generate(**prompt, max_new_tokens=16, do_sample=False)
        new = out[0, prompt["input_ids"].shape[1] :].tolist()
        stopped = bool(new) and new[-1] in model.generation_config.eos_token_id
        text = tokenizer.decode(new, skip_special_tokens=True)
        style = style_of(text)
        match = STYLES[style].match(text) if style != "other" else None
        counts[style] += 1
        counts["right"] += int(bool(match) and int(match.group(1)) == number + 1)
        counts["stopped"] += int(stopped)
        counts["total"] += 1
        if index < show:
            print(f"  {number!r} -> {text!r}{'' if stopped else ' (did not stop)'}")
    total = counts["total"]
    print(f"{model_dir}: sentence {counts['sentence']}/{total}, plain {counts['plain']}/{total}, other "
          f"{counts['other']}/{total}; right {counts['right']}/{total}; stopped at the end-of-turn token "
          f"{counts['stopped']}/{total}")  # fmt: skip
    return counts


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "setup":
        setup(Path(sys.argv[2]))
    elif len(sys.argv) >= 4 and sys.argv[1] == "styles":
        for folder in sys.argv[2:-1]:
            styles(Path(folder), Path(sys.argv[-1]))
    else:
        sys.exit(__doc__)
