"""The standard small-model set as local lm-eval tasks: hellaswag, arc_easy, piqa, winogrande.

Each is lm-eval 0.4.13's own task (``lm_eval/tasks/<name>/``: the same Hub dataset and split, prompt, choices, target
and metrics), with two changes that let it run offline: the data is a local JSON Lines file (``dataset_path: json``,
``data_files`` relative to the task folder) and the Python helpers of the original YAML (hellaswag's
``process_docs``, winogrande's ``doc_to_*`` functions) are applied once, when the data is prepared, to fields of
each row, which the YAML then names. The rows keep every original field. ``tests/evaluate`` checks that lm-eval
builds the very same requests (contexts and continuations) from these as from its own task definitions.

Zero-shot log-likelihood (rank) classification of the evaluation split only, as lm-eval runs these by default and
OLMo-core scores small models: no few-shot split is shipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ACC_METRICS = [
    {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
    {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
]


def _hellaswag_text(text: str) -> str:
    """lm-eval's hellaswag ``preprocess``: WikiHow's bracketed artifacts out."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """lm-eval's hellaswag ``process_docs`` on one row: ``query``, ``choices`` and ``gold`` added."""
    context = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return {
        **row,
        "query": _hellaswag_text(row["activity_label"] + ": " + context),
        "choices": [_hellaswag_text(ending) for ending in row["endings"]],
        "gold": int(row["label"]),
    }


def winogrande_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """lm-eval's winogrande ``doc_to_text`` / ``doc_to_target`` / ``doc_to_choice`` on one row, as fields: the
    option filled in before the blank makes each choice's context, the rest of the sentence is the one
    continuation scored, and ``answer_index`` names the right context (lm-eval's "multiple inputs")."""
    blank = row["sentence"].index("_")
    return {
        **row,
        "answer_index": {"1": 0, "2": 1}[str(row["answer"])],
        "continuation": row["sentence"][blank + 1 :].strip(),
        "contexts": [row["sentence"][:blank] + option for option in (row["option1"], row["option2"])],
    }


@dataclass(frozen=True)
class StandardTask:
    """One task: where lm-eval takes its data (Hub dataset, configuration, split), how a row is prepared, and the
    YAML keys that say how it is scored."""

    name: str
    hub_path: str
    hub_name: str | None
    split: str
    prompt: Mapping[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=lambda: list(ACC_METRICS))
    prepare_row: Callable[[Mapping[str, Any]], dict[str, Any]] = dict

    @property
    def data_file(self) -> str:
        return f"{self.name}.{self.split}.jsonl"

    def config(self) -> dict[str, Any]:
        """The task's YAML as a dict (lm-eval's keys)."""
        split_key = "test_split" if self.split == "test" else "validation_split"
        return {
            "task": self.name,
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {self.split: self.data_file}},
            "output_type": "multiple_choice",
            split_key: self.split,
            **self.prompt,
            "metric_list": self.metrics,
            "metadata": {
                "version": 1.0,
                "source": f"{self.hub_path}{f' ({self.hub_name})' if self.hub_name else ''}, split {self.split}",
            },
        }


STANDARD_TASKS: Mapping[str, StandardTask] = {
    "hellaswag": StandardTask(
        "hellaswag",
        "Rowan/hellaswag",
        None,
        "validation",
        {"doc_to_text": "{{query}}", "doc_to_target": "{{label}}", "doc_to_choice": "choices"},
        prepare_row=hellaswag_row,
    ),
    "arc_easy": StandardTask(
        "arc_easy",
        "allenai/ai2_arc",
        "ARC-Easy",
        "test",
        {
            "doc_to_text": "Question: {{question}}\nAnswer:",
            "doc_to_target": "{{choices.label.index(answerKey)}}",
            "doc_to_choice": "{{choices.text}}",
            "should_decontaminate": True,
            "doc_to_decontamination_query": "Question: {{question}}\nAnswer:",
        },
    ),
    "piqa": StandardTask(
        "piqa",
        "baber/piqa",
        None,
        "validation",
        {
            "doc_to_text": "Question: {{goal}}\nAnswer:",
            "doc_to_target": "label",
            "doc_to_choice": "{{[sol1, sol2]}}",
            "should_decontaminate": True,
            "doc_to_decontamination_query": "goal",
        },
    ),
    "winogrande": StandardTask(
        "winogrande",
        "allenai/winogrande",
        "winogrande_xl",
        "validation",
        {
            "doc_to_text": "answer_index",
            "doc_to_target": "continuation",
            "doc_to_choice": "contexts",
            "should_decontaminate": True,
            "doc_to_decontamination_query": "sentence",
        },
        # lm-eval scores winogrande by acc only: every choice shares the one continuation, so acc_norm = acc
        metrics=[ACC_METRICS[0]],
        prepare_row=winogrande_row,
    ),
}
