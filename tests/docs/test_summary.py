"""Every field of an execution's output (the training summary, and the ``evaluation`` object an evaluation adds) is
named in docs/running-jobs.md, read from the state machine's own ``Summarize`` states, so that a field added to the
summary cannot go undocumented."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk

from constructs_lib.workflow.evaluation_states import evaluation_summary
from constructs_lib.workflow.request import run_checkpoint_uri
from constructs_lib.workflow.states import training_summary
from tests.cdk_helpers import DEFAULT_ENV
from tests.docs.pages import Page

PAGE = "docs/running-jobs.md"


def _keys(parameters: dict[str, Any]) -> list[str]:
    return [key.removesuffix(".$") for key in parameters]


def summary_fields() -> dict[str, list[str]]:
    """The output's fields as the ``Summarize`` and ``Summarize (evaluation)`` states write them."""
    stack = cdk.Stack(cdk.App(), "Summary", env=DEFAULT_ENV)
    checkpoint_uri = run_checkpoint_uri("bucket", "checkpoints/")
    training = stack.resolve(training_summary(stack, checkpoint_uri).to_state_json())["Parameters"]
    evaluation = stack.resolve(evaluation_summary(stack).start_state.to_state_json())["Parameters"]
    return {"summary": _keys(training), "evaluation": _keys(evaluation["part"]["evaluation"])}


def missing_fields(page: Page, fields: dict[str, list[str]]) -> list[str]:
    shown = {text for text, _ in page.inline_code}
    return [f"{part}.{name}" for part, names in fields.items() for name in names if name not in shown]


def test_every_summary_field_is_documented(pages):
    (page,) = [p for p in pages if p.name == PAGE]
    fields = summary_fields()
    assert "evaluation" in fields["summary"] and "scores" in fields["evaluation"]
    missing = missing_fields(page, fields)
    assert not missing, f"{PAGE} does not name these fields of an execution's output (as `code`): {missing}"


def test_a_field_not_named_is_found(tmp_path):
    page = Page.parse("The summary: `job_name`, `status`.\n", tmp_path / "p.md", PAGE)
    assert missing_fields(page, {"summary": ["job_name", "status", "evaluation"]}) == ["summary.evaluation"]
