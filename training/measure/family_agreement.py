"""Each family's agreement with transformers, measured: the figures behind the tests' tolerances (docs/open-weights.md,
"Agreement with transformers, measured").

``python -m training.measure.family_agreement`` builds, per family, the tests' own 2-layer random model
(``tests/models/tiny.py``, every distinguishing feature on) and prints one markdown table: the largest fp32 logit
difference against transformers (eager) on a short sequence, on one past the sliding window (where the family has
one) and on packed documents against each document alone; whether import then export without training gives every
tensor back bit for bit; how many tokens of the published chat template's loss mask agree with transformers'
``{% generation %}`` assistant mask; the largest logit difference between LoRA adapters loaded by peft and the
merged export; and each named size's parameter count against transformers' model built on the meta device.

A development measurement run from a checkout (it imports the tests' builders, which are not packaged): about a
minute on 2 CPU cores; no GPU. The tests assert the bounds (1e-4); this prints the values.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
import transformers

from training.models import registry

SHORT, LONG = 4, 13
"""Tokens of the plain comparison (within the 5-token window of the tiny windowed models) and past it."""
PACKED = [4, 9, 1, 2]
"""Packed document lengths: 9 is past the window."""


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def logit_differences(family: str) -> dict[str, float | None]:
    """Max |our logits - transformers'| fp32: plain, past the window (None where the family has none), packed."""
    from tests.training.model.test_decoder_families import _hf_model, _ours
    from training.trainer.model import doc_mask

    hf = _hf_model(family)
    ours = _ours(hf)
    generator = torch.Generator().manual_seed(1)
    short = torch.randint(0, 64, (2, SHORT), generator=generator)
    long = torch.randint(0, 64, (2, LONG), generator=generator)
    packed = torch.randint(0, 64, (1, sum(PACKED)), generator=generator)
    ids = torch.cat([torch.full((n,), i + 1) for i, n in enumerate(PACKED)]).unsqueeze(0)
    windowed = ours.config.sliding_window is not None and "sliding" in ours.config.layer_types
    with torch.no_grad():
        alone = torch.cat([hf(piece).logits for piece in packed.split(PACKED, dim=1)], dim=1)
        return {
            "plain": _max_diff(ours.logits(short), hf(short).logits),
            "window": _max_diff(ours.logits(long), hf(long).logits) if windowed else None,
            "packed": _max_diff(ours.logits(packed, doc_mask.Documents.from_ids(ids)), alone),
        }


def _init_world_of_one():
    """This process as a world of one (gloo, a free port), as the tests' ``process_group`` fixture makes it."""
    from training.trainer.distributed import parallel

    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    os.environ["MASTER_PORT"] = str(parallel._free_port())
    return parallel.init_distributed()


def round_trip(family: str, env, folder: Path) -> tuple[int, int]:
    """Import (``init_from``, FSDP2 ``loop.build``) then export without training: (tensors bit-identical, total)."""
    from tests.training.checkpoint.test_export_hf import exported_by_the_trainer
    from tests.training.checkpoint.test_families_hf import _source, _tensors
    from training.trainer import config

    _source(folder / "source", family)
    cfg = config.config_from_mapping(
        {"init_from": str(folder / "source"), "precision": "fp32", "seq_length": "16",
         "model_dir": str(folder / "m")}
    )  # fmt: skip
    _, out, _ = exported_by_the_trainer(cfg, env)
    exported, original = _tensors(out), _tensors(folder / "source")
    same = sum(name in exported and torch.equal(exported[name], t) for name, t in original.items())
    return same, len(original | exported)


def peft_difference(family: str, env, folder: Path) -> float:
    """Max |logits of peft's adapter on the transformers model - the merged export's| fp32, with the tests' LoRA
    (rank 4 on six module names, B made non-zero as after training)."""
    from peft import PeftModel

    from tests.training.checkpoint.test_families_hf import _ids, _source
    from training.trainer import config, loop
    from training.trainer.checkpoint import export_hf, export_peft, model_file
    from training.trainer.distributed import precision
    from training.trainer.model import lora

    source = folder / "source"
    _source(source, family)
    cfg = config.config_from_mapping(
        {"init_from": str(source), "precision": "fp32", "seq_length": "16", "model_dir": str(folder / "m"),
         "lora_rank": "4", "lora_targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,down_proj"}
    )  # fmt: skip
    net = loop.build(cfg, env, precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, param in lora.adapters(net):
            local = param.to_local() if hasattr(param, "to_local") else param
            local.copy_(torch.randn(local.shape, generator=generator) * 0.1)
    saved = model_file.save_model(net, cfg.model_dir, 0, cfg.as_dict(), env.rank, export_hf.data_info(cfg))
    export_hf.export_after_training(saved, cfg)
    export_peft.export_after_training(saved, cfg)
    with torch.no_grad():
        base = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
        peft = PeftModel.from_pretrained(base, saved.parent / export_peft.PEFT_DIR).eval()(_ids()).logits
        merged = transformers.AutoModelForCausalLM.from_pretrained(
            saved.parent / export_hf.HF_DIR, dtype=torch.float32
        )
        return _max_diff(peft, merged.eval()(_ids()).logits)


CHAT = {"llama3": "llama3.1", "qwen2": "qwen2.5", "qwen3": "qwen3", "mistral": "mistral", "gemma3": "gemma3"}
"""The published chat template each family's agreement is measured on (the tests' templates)."""


def mask_agreement(family: str, folder: Path) -> tuple[int, int]:
    """Tokens where our loss mask equals transformers' assistant mask of the ``{% generation %}``-marked template,
    and the tokens, over the tests' 60 random conversations."""
    from transformers import AutoTokenizer

    from tests.prepare import test_chat_data, test_chat_families
    from tests.training import chat_models
    from training.prepare import chat_data

    name = CHAT[family]
    if name in test_chat_families.FAMILIES:
        model = test_chat_families.model_folder(folder / name, name)
        marked, talks = test_chat_families.marked(name), test_chat_families.conversations(name, 60)
    else:
        model = chat_models.model_folder(folder / name, name)
        marked, talks = test_chat_data.marked(name), test_chat_data.conversations(60)
    tokenizer = AutoTokenizer.from_pretrained(model)
    renderer = chat_data.Renderer(*chat_data.load_tokenizer(str(model)))
    agreed = total = 0
    for messages in talks:
        example = renderer.render(*chat_data.messages_of({"messages": messages}, "t:1"), "t:1")
        reference = tokenizer.apply_chat_template(messages, chat_template=marked, tokenize=True, return_dict=True,
                                                  return_assistant_tokens_mask=True)  # fmt: skip
        if example.ids.tolist() != reference["input_ids"]:
            total += max(len(example.ids), len(reference["input_ids"]))  # ids differ: no token agrees
            continue
        agreed += sum(
            int(a == b) for a, b in zip(example.mask.tolist(), reference["assistant_masks"], strict=True)
        )
        total += len(example.ids)
    return agreed, total


def parameter_counts(family: str) -> list[tuple[str, int, int]]:
    """Each named size of the family: (name, our count, transformers' on the meta device)."""
    rows = []
    for name, size in registry.SIZES.items():
        if size.family != family:
            continue
        hf_config = transformers.AutoConfig.for_model(**registry.write_hf_config(size))
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config)
        rows.append((name, size.parameter_count(), sum(p.numel() for p in model.parameters())))
    return rows


def _cell(value: float | None) -> str:
    return "n/a (no window)" if value is None else f"{value:.2g}"


def table() -> str:
    """Every family's row, with the machine and versions above it."""
    import peft
    import torch.distributed as dist

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = [
        f"Measured {now} on {platform.machine()} CPU ({os.cpu_count()} cores), {platform.python_implementation()} "
        f"{platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"peft {peft.__version__}; fp32, tiny 2-layer random models (tests/models/tiny.py).",
        "",
        "| Family | max abs Δlogits: plain | past the window | packed vs each alone | Import → export "
        "| Chat mask = transformers' | peft vs merged export | Parameters: ours = transformers' (meta) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    transformers.utils.logging.disable_progress_bar()
    env = _init_world_of_one()
    rows = []
    try:
        for family in registry.FAMILIES:
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                logits = logit_differences(family)
                same, tensors = round_trip(family, env, folder / "trip")
                peft_diff = peft_difference(family, env, folder / "peft")
                agreed, total = mask_agreement(family, folder / "chat")
            sizes = parameter_counts(family)
            equal = sum(ours == theirs for _, ours, theirs in sizes)
            counts = f"{equal}/{len(sizes)} equal: " + "; ".join(
                f"{name} {ours:,}" + ("" if ours == theirs else f" (transformers {theirs:,})")
                for name, ours, theirs in sizes
            )
            trip = f"{'bit-identical' if same == tensors else 'differs'} ({same}/{tensors} tensors)"
            rows.append(
                f"| {family} | {_cell(logits['plain'])} | {_cell(logits['window'])} | {_cell(logits['packed'])} "
                f"| {trip} | {agreed}/{total} tokens ({CHAT[family]}) | {peft_diff:.2g} | {counts} |"
            )
    finally:
        dist.destroy_process_group()
    return "\n".join(head + rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.family_agreement", description=__doc__.splitlines()[0]
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parse_args(argv)
    print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
