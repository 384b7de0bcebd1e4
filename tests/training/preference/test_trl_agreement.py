"""Preference tuning against TRL's ``DPOTrainer`` (trl 1.16.0, a test dependency only), on the same tiny model folder
and pairs, in fp32: each answer's reference log-probability (ours computed once before step 1, TRL's with
``precompute_ref_log_probs``) and, after training, the policy's; the first five steps' losses with the same settings
(the sigmoid loss, beta, AdamW's betas, the learning rate's cosine to 0.1 of its peak, gradient clipping, every
pair in one batch: unpacked as TRL batches them, and packed); step 1's loss is ln 2. With Llama 3.1's template both
train the same answer tokens (the answer and ``<|eot_id|>``); with Qwen 2.5's, TRL also scores the newline the
template writes after ``<|im_end|>``, which we do not train (docs/preference-tuning.md), so that comparison is on
TRL's tokens."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.chat_models import model_folder
from training.contract import metric_lines
from training.prepare import pairs as prepare_pairs
from training.trainer import config, loop
from training.trainer.data import pairs
from training.trainer.distributed import precision
from training.trainer.loss import IGNORE_INDEX
from training.trainer.preference import reference

STEPS, LEARNING_RATE, BETA = 5, 0.01, 0.1
TOLERANCE = 1e-4


def records(count: int = 8, seed: int = 0) -> list[dict]:
    """Pairs of varied lengths in TRL's conversational form with an explicit prompt."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        prompt = [{"role": "user", "content": f"question {index}: " + "x" * rng.randint(0, 6)}]
        if index % 3 == 0:
            prompt = [{"role": "system", "content": "Answer briefly."}, *prompt]
        out.append({"prompt": prompt,
                    "chosen": [{"role": "assistant", "content": "yes " * rng.randint(1, 4)}],
                    "rejected": [{"role": "assistant", "content": "no, " + "n" * rng.randint(1, 8)}]})  # fmt: skip
    return out


def folder_with(root: Path, family: str) -> Path:
    """A tiny model folder of ``family`` and the pairs, prepared with it (no validation split)."""
    model_folder(root / "model", family, with_weights=True, layers=2, hidden=64)
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
    prepare_pairs.prepare_pairs(
        [root / "pairs.jsonl"], str(root / "data"), str(root / "model"), validation_fraction=0
    )
    return root


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return folder_with(tmp_path_factory.mktemp("trl_llama"), "llama3.1")


def settings(root: Path, run: str, **more: str) -> dict[str, str]:
    """Our trainer's settings for TRL's: every pair in one batch, one micro-batch, no weight decay, no warm-up."""
    return {"dataset": "channel", "data_dir": str(root / "data"), "init_from": str(root / "model"),
            "seq_length": "512", "batch_size": str(len(records())), "packing": "false", "max_steps": str(STEPS),
            "precision": "fp32", "learning_rate": str(LEARNING_RATE), "lr_warmup_steps": "0", "weight_decay": "0",
            "dpo_beta": str(BETA), "log_interval": "1", "throughput_warmup_steps": "1", "deterministic": "true",
            "checkpoint_dir": str(root / run / "checkpoints"), "model_dir": str(root / run / "model"),
            **more}  # fmt: skip


def our_run(root: Path, run: str, env, **more: str) -> list[float]:
    """Our trainer in this process (a world of one): the loss of each step, as printed."""
    lines: list[str] = []
    loop.run(config.config_from_mapping(settings(root, run, **more)), env, emit=lines.append)
    return [metric_lines.parse_step_line(line)[1]["loss"] for line in lines if line.startswith("step=")]


def trl_trainer(
    root: Path,
    steps: int,
    loss: str = "sigmoid",
    adapter: Path | None = None,
    learning_rate: float = LEARNING_RATE,
):
    """TRL's DPOTrainer on the same model folder and pairs, with the same settings and ``loss``; trained for
    ``steps``. ``adapter``: a peft adapter folder (ours, exported at step 0): TRL trains a LoRA adapter of its
    config (``peft_config``: its reference is the model with the adapter disabled, every step) starting from that
    adapter's values."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(root / "trl"), per_device_train_batch_size=len(records()), max_steps=max(steps, 1),
        learning_rate=learning_rate, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1},
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95, max_grad_norm=1.0, beta=BETA,
        loss_type=[loss], precompute_ref_log_probs=adapter is None, max_length=None, logging_steps=1, report_to=[],
        save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True, bf16=False, fp16=False,  # fp32 throughout
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(root / "model")
    peft_config = None
    if adapter is not None:
        from peft import LoraConfig

        peft_config = LoraConfig.from_pretrained(str(adapter))
        peft_config.inference_mode = False  # the exported config says inference: TRL trains this one
    trainer = DPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(records()), processing_class=tokenizer,
        peft_config=peft_config,
    )  # fmt: skip
    if adapter is not None:  # our initial adapter's values (A seeded, B zeros) in TRL's freshly made one
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        result = set_peft_model_state_dict(trainer.model, load_file(adapter / "adapter_model.safetensors"))
        assert not [key for key in result.missing_keys if "lora_" in key]
    if steps:
        trainer.train()
    return trainer


def trl_answers(trainer) -> np.ndarray:
    """TRL's policy log-probability of every answer (``compute_ref_log_probs`` on the trained model): chosen and
    rejected alternating, as our sequence numbers."""
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    chosen, rejected = trainer.compute_ref_log_probs(trainer.model, batch)
    return torch.stack([chosen, rejected], dim=1).reshape(-1).numpy()


def our_answers(root: Path, model: Path, env) -> np.ndarray:
    """Our log-probability of every answer with the model in ``model`` (a Hugging Face folder), by our own path:
    the trainer's model built from it, ``reference.compute``."""
    cfg = config.config_from_mapping(settings(root, "score", init_from=str(model)))
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, env, plan, packed=True)
    return reference.compute(net, pairs.make(cfg, "train", 0, 1, shuffle=False), env, plan).numpy()


def test_log_probabilities_and_five_losses_agree_with_trl(llama, process_group):
    """Unpacked and packed: every step's loss within 1e-4 of TRL's (step 1's ln 2), each answer's reference
    log-probability and, after five steps, its policy log-probability within 1e-4."""
    trainer = trl_trainer(llama, STEPS)
    theirs = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    unpacked = our_run(llama, "unpacked", process_group)
    windows = len(pairs.make(config.config_from_mapping(settings(llama, "count", packing="true", batch_size="1")),
                             "train", 0, 1).windows)  # fmt: skip
    packed = our_run(
        llama, "packed", process_group, packing="true", batch_size=str(windows)
    )  # every pair a step
    print(f"losses: ours unpacked {unpacked}, packed {packed}, TRL {theirs}")
    assert len(theirs) == len(unpacked) == len(packed) == STEPS
    assert abs(unpacked[0] - math.log(2)) <= 1e-6 and abs(theirs[0] - math.log(2)) <= 1e-6
    differences = [abs(a - b) for run in (unpacked, packed) for a, b in zip(run, theirs, strict=True)]
    print(f"largest loss difference: {max(differences):.2e}")
    assert max(differences) <= TOLERANCE
    assert (
        theirs[-1] < theirs[0] - 0.3
    )  # the five steps moved the model (the comparison is not of a flat start)
    ours_reference = np.load(llama / "unpacked" / "checkpoints" / reference.FOLDER / "train.npy")
    theirs_reference = np.stack([trainer.train_dataset["ref_chosen_logps"], trainer.train_dataset["ref_rejected_logps"]],
                                axis=1).reshape(-1)  # fmt: skip
    ours_policy = our_answers(llama, llama / "unpacked" / "model" / "hf", process_group)
    theirs_policy = trl_answers(trainer)
    reference_gap = float(np.abs(ours_reference - theirs_reference).max())
    policy_gap = float(np.abs(ours_policy - theirs_policy).max())
    print(f"answers' log-probabilities: reference {reference_gap:.2e}, policy after {STEPS} steps {policy_gap:.2e} "
          f"(of {np.abs(theirs_policy).min():.1f} to {np.abs(theirs_policy).max():.1f})")  # fmt: skip
    assert reference_gap <= TOLERANCE and policy_gap <= TOLERANCE
    assert np.abs(ours_policy - ours_reference).min() > 0.1  # every answer moved


def test_qwen_answers_agree_on_trls_tokens_and_differ_by_the_newline_we_do_not_train(tmp_path, process_group):
    """With Qwen 2.5's template the rendered sequences are TRL's token for token; TRL's answer tokens are ours plus
    the ``\\n`` after ``<|im_end|>``. On TRL's tokens our model's answer log-probabilities equal TRL's reference
    ones within 1e-4; on ours they differ by that newline's log-probability."""
    root = folder_with(tmp_path, "qwen2.5")
    trainer = trl_trainer(root, 0)
    cfg = config.config_from_mapping(settings(root, "score"))
    split = pairs.make(cfg, "train", 0, 1, shuffle=False)
    newline = trainer.processing_class.convert_tokens_to_ids("Ċ")  # ByteLevel's "\n"
    rows = []
    for index, example in enumerate(trainer.train_dataset):
        for side, name in enumerate(("chosen", "rejected")):
            begin, end = split.offsets[2 * index + side], split.offsets[2 * index + side + 1]
            ids, mask = np.asarray(split.tokens[begin:end], dtype=np.int64), np.asarray(split.mask[begin:end])
            answer = example[f"{name}_ids"]
            assert ids.tolist() == example["prompt_ids"] + answer  # the same rendering
            assert (
                answer[-1] == newline and ids[mask == 1].tolist() == answer[:-1]
            )  # ours: all but the newline
            rows.append((ids, len(example["prompt_ids"])))
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, process_group, plan, packed=False)
    ours_on_trl, ours_own = [], []
    with torch.no_grad():
        for ids, prompt in rows:
            tokens = torch.tensor(ids).unsqueeze(0)
            targets = torch.full_like(tokens, IGNORE_INDEX)
            targets[0, prompt - 1 : -1] = tokens[0, prompt:]  # TRL's: every token after the prompt
            per_token = net(tokens, targets, None, log_probs=True)
            ours_on_trl.append(float(per_token.sum()))
            ours_own.append(float(per_token[:-2].sum()))  # the last target (the newline) left out
    theirs = np.stack([trainer.train_dataset["ref_chosen_logps"], trainer.train_dataset["ref_rejected_logps"]],
                      axis=1).reshape(-1)  # fmt: skip
    gap = float(np.abs(np.array(ours_on_trl) - theirs).max())
    newline_share = np.array(ours_on_trl) - np.array(ours_own)
    print(f"Qwen 2.5 on TRL's tokens: largest difference {gap:.2e}; the newline's log-probability "
          f"{newline_share.min():.3f} to {newline_share.max():.3f}")  # fmt: skip
    assert gap <= TOLERANCE
    assert np.all(newline_share < -1e-3)


@pytest.mark.parametrize("loss", ["ipo", "sigmoid_norm"])
def test_the_ipo_and_length_normalised_losses_agree_with_trl_for_five_steps(llama, process_group, loss):
    """``dpo_loss`` ipo and sigmoid_norm (TRL's ``loss_type`` of the same names: the log-ratios averaged over each
    answer's tokens): five steps' losses within 1e-4 of TRL's, unpacked, same settings; at step 1 IPO's loss is
    (1 / (2 beta))^2 and the length-normalised one ln 2."""
    trainer = trl_trainer(llama, STEPS, loss)
    theirs = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    ours = our_run(llama, f"loss_{loss}", process_group, dpo_loss=loss)
    first = (1 / (2 * BETA)) ** 2 if loss == "ipo" else math.log(2)
    differences = [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
    print(f"{loss}: ours {ours}, TRL {theirs}; largest difference {max(differences):.2e}")
    assert len(ours) == len(theirs) == STEPS
    assert abs(ours[0] - first) <= 1e-5 * first
    assert max(differences) <= TOLERANCE * max(1.0, first)  # IPO's losses are ~25: the same relative bound
    assert theirs[-1] < theirs[0] - 0.01 * first  # the five steps moved the model


def initial_adapter(root: Path, env, **lora: str) -> Path:
    """Our LoRA model at step 0 (``loop.build``: the adapters as the trainer initializes them), saved and exported
    as a peft folder (``export_peft``), for TRL to start from the same values."""
    from training.trainer.checkpoint import export_peft, model_file

    cfg = config.config_from_mapping(settings(root, "lora_start", **lora))
    plan = precision.plan(cfg.precision, cfg.fp8_recipe, cfg.quantized_model_init)
    net = loop.build(cfg, env, plan, packed=False)
    saved = model_file.save_model(net, cfg.model_dir, 0, cfg.as_dict(), env.rank)
    assert saved is not None
    export_peft.export(saved, root / "lora_start" / "adapter")
    return root / "lora_start" / "adapter"


def test_lora_with_the_adapter_switched_off_as_reference_agrees_with_trl_and_peft(llama, process_group):
    """LoRA DPO (``dpo_reference`` auto: the same model with its adapters switched off, every step; no stored
    reference, no copy): from the same initial adapter, five steps' losses within 1e-4 of TRL's DPOTrainer with a
    ``peft_config`` (whose reference is the model with peft's adapter disabled); step 1 is ln 2; the adapter trained
    and exported agrees with TRL's (each answer's log-probability through peft within 1e-4); no reference folder."""
    lora = {"lora_rank": "4", "learning_rate": "0.02"}
    adapter = initial_adapter(llama, process_group, **lora)
    trainer = trl_trainer(llama, STEPS, adapter=adapter, learning_rate=0.02)
    theirs = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    lines: list[str] = []
    loop.run(config.config_from_mapping(settings(llama, "lora", **lora)), process_group, emit=lines.append)
    ours = [metric_lines.parse_step_line(line)[1]["loss"] for line in lines if line.startswith("step=")]
    differences = [abs(a - b) for a, b in zip(ours, theirs, strict=True)]
    print(f"LoRA adapter_off: ours {ours}, TRL {theirs}; largest difference {max(differences):.2e}")
    assert any("reference=adapter_off" in line for line in lines)
    assert len(ours) == len(theirs) == STEPS and abs(ours[0] - math.log(2)) <= 1e-6
    assert max(differences) <= TOLERANCE and theirs[-1] < theirs[0] - 0.05
    assert not (llama / "lora" / "checkpoints" / reference.FOLDER).exists()  # nothing precomputed, no copy
    exported = llama / "lora" / "model" / "adapter"
    assert (exported / "adapter_model.safetensors").is_file() and (llama / "lora" / "model" / "hf").is_dir()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(llama / "model", dtype=torch.float32)
    ours_through_peft = PeftModel.from_pretrained(base, exported).eval()
    from peft import get_peft_model_state_dict

    theirs_adapter = get_peft_model_state_dict(trainer.model)
    mine_adapter = get_peft_model_state_dict(ours_through_peft)
    assert mine_adapter.keys() == theirs_adapter.keys()
    adapter_gap = max(float((mine_adapter[k] - theirs_adapter[k].cpu()).abs().max()) for k in mine_adapter)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    trainer.model.eval()
    with torch.no_grad():
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        logit_gap = float((ours_through_peft(**inputs).logits - trainer.model(**inputs).logits).abs().max())
    print(f"LoRA after {STEPS} steps: largest adapter difference {adapter_gap:.2e}, through peft largest logit "
          f"difference {logit_gap:.2e}")  # fmt: skip
    assert adapter_gap <= TOLERANCE and logit_gap <= TOLERANCE
