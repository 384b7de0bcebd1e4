"""docs/fine-tuning.md's example: a task a tiny model learns on a CPU in minutes, end to end as a user runs it.

    .venv/bin/python docs/fine_tuning_example.py setup example/       # model folder + conversations
    .venv/bin/python docs/fine_tuning_example.py chat example/trained/hf example/heldout.jsonl

``setup`` writes ``example/model/`` (a tiny random ``LlamaForCausalLM`` with Llama 3.1's published chat template
and a byte-level tokenizer holding Llama 3's special tokens: the shape of a real instruct model folder, small
enough for a CPU), ``example/numbers.jsonl`` (the user names a three-digit number, the assistant answers with the
next one) and ``example/heldout.jsonl`` (10 numbers never trained on). ``chat`` loads an exported Hugging Face
folder with ``transformers``, renders each held-out prompt with ``apply_chat_template(..., add_generation_prompt=True)``,
generates greedily and prints how many answers are right and how many stopped at the end-of-turn token.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.training.chat_models import model_folder, template  # noqa: E402

NUMBERS = range(100, 1000)
HELD_OUT = 10
"""The three-digit numbers; 10 of them (chosen by the seed) never appear in the training conversations, so a right
answer to one needs the increment, not a memorised table. Every number the same length (each digit of the answer
at a fixed distance from the question's) and 890 different ones trained, each once, carries included. With 0-99
(90 numbers, each seen 8 times) a smaller model learnt to copy the tens digit but not to increment the units digit
(docs/fine-tuning.md)."""


def conversations(folder: Path, seed: int = 0, repeats: int = 1) -> tuple[Path, Path]:
    """``numbers.jsonl`` (each training number ``repeats`` times, in a seeded order, half as ``messages`` with a
    system turn, half as ``prompt``/``completion``) and ``heldout.jsonl`` (the others, as prompts)."""
    rng = random.Random(seed)
    held = set(rng.sample(list(NUMBERS), HELD_OUT))
    train = [n for n in NUMBERS if n not in held] * repeats
    rng.shuffle(train)
    lines = []
    for i, number in enumerate(train):
        if i % 2:
            lines.append({"prompt": str(number), "completion": str(number + 1)})
        else:
            lines.append({"messages": [{"role": "system", "content": "Answer with the next number."},
                                       {"role": "user", "content": str(number)},
                                       {"role": "assistant", "content": str(number + 1)}]})  # fmt: skip
    train_path, held_path = folder / "numbers.jsonl", folder / "heldout.jsonl"
    train_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    held_path.write_text(
        "".join(json.dumps({"prompt": str(n), "completion": str(n + 1)}) + "\n" for n in sorted(held))
    )
    return train_path, held_path


def setup(folder: Path, layers: int = 2, hidden: int = 128, seed: int = 0) -> None:
    """The model folder (its tokenizer's merges learnt from the template's own rendering of the conversations, as a
    real vocabulary holds the template's words) and the conversations."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    folder.mkdir(parents=True, exist_ok=True)
    train, _ = conversations(folder, seed)
    render = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
        template("llama3.1")
    )
    corpus = []
    for line in train.read_text().splitlines()[:200]:
        record = json.loads(line)
        messages = record.get("messages") or [{"role": "user", "content": record["prompt"]},
                                              {"role": "assistant", "content": record["completion"]}]  # fmt: skip
        corpus.append(render.render(messages=messages, bos_token="", add_generation_prompt=False))
    model_folder(
        folder / "model",
        "llama3.1",
        with_weights=True,
        layers=layers,
        hidden=hidden,
        seed=seed,
        corpus=corpus,
    )


def chat(model_dir: Path, heldout: Path) -> dict[str, Any]:
    """Greedy answers of the exported model to every held-out prompt: right, stopped, total and the answers
    (printed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    right = stopped = total = 0
    answers = []
    for line in heldout.read_text().splitlines():
        example = json.loads(line)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": example["prompt"]}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)  # fmt: skip
        out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
        new = out[0, prompt["input_ids"].shape[1] :].tolist()
        ended = bool(new) and new[-1] in model.generation_config.eos_token_id
        answer = tokenizer.decode(new, skip_special_tokens=True)
        answers.append(answer)
        right += int(answer == example["completion"])
        stopped += int(ended)
        total += 1
        print(f"{example['prompt']!r} -> {answer!r}{' (stopped)' if ended else ' (did not stop)'}")
    print(f"held-out accuracy {right}/{total}; stopped at the end-of-turn token {stopped}/{total}")
    return {"right": right, "stopped": stopped, "total": total, "answers": answers}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "setup":
        setup(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "chat":
        chat(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(__doc__)
