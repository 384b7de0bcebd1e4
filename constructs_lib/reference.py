"""Write ``docs/reference.md`` from the code's tables, so that the reference cannot drift from what the code
checks: the execution-input fields (``training.request.fields.FIELDS``), the ``evaluate`` block's
fields (their defaults ``fields.EVALUATE_DEFAULTS``, their rows ``evaluate_block.EVALUATE_FIELDS``), the
trainer settings
(``training.contract.settings_table.HYPERPARAMETERS`` and ``training.trainer.config.TRAINER_ONLY_SETTINGS``) and the
``cdk.json`` keys (``constructs_lib.context_keys.CONTEXT``).

    make docs                                   # the same as the next line
    python -m constructs_lib.reference          # writes docs/reference.md
    python -m constructs_lib.reference --check  # exit 1 when docs/reference.md differs from what it would write

``tests/docs/test_reference.py`` fails when the page is stale. A development tool: nothing at synth or run time
imports it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from constructs_lib.context_keys import CONTEXT, ContextKey
from training.contract.settings_table import HYPERPARAMETERS, TOP_LEVEL_SETTINGS, Hyperparameter
from training.request import bounds
from training.request.evaluate_block import EVALUATE_FIELDS_BY_NAME
from training.request.fields import EVALUATE_DEFAULTS, FIELDS
from training.request.rules import PLATFORM_HYPERPARAMETERS, RequestRules
from training.trainer.config import TRAINER_ONLY_SETTINGS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
COMMAND = "make docs"

INTRO = f"""# Reference

```json input
{{"precision": "mxfp8", "batch_size": 4, "activation_checkpointing": true, "hyperparameters": {{"model_preset": "8b", "max_steps": "2000"}}}}
```

An execution input sets [input fields](#execution-input-fields), and [trainer settings](#trainer-settings) inside its
`hyperparameters`; a deployment's [`cdk.json` keys](#cdkjson-keys) set what the workflow allows. Below, each with its
default, what it allows and what it does. This page is generated from the tables in the code (`{COMMAND}`, i.e. `python -m constructs_lib.reference`);
do not edit it by hand: a test fails when it is stale. The task pages link here rather than repeat it.

- [Execution input fields](#execution-input-fields)
- [The `evaluate` block's fields](#the-evaluate-blocks-fields)
- [Trainer settings](#trainer-settings)
- [Trainer-only switches](#trainer-only-switches)
- [`cdk.json` keys](#cdkjson-keys)
"""


def cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell: pipes escaped, and outside code spans ``<name>`` placeholders
    written as entities (else GitHub takes them for HTML tags and shows nothing)."""
    pieces = re.split(r"(`[^`]*`)", text.replace("|", "\\|").replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in pieces)


def code(value: Any) -> str:
    return f"`{value}`"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def reference_rules() -> RequestRules:
    """The rules the allowed values are shown under: the default deployment (an empty ``cdk.json`` context), its
    bucket as ``<bucket>``, with ``remoteDebug`` on (so that ``remote_debug`` shows both values)."""
    return replace(RequestRules.from_cdk_context({}), bucket_name="<bucket>", remote_debug=True)


def input_fields_section() -> list[str]:
    rules = reference_rules()
    lines = [
        "## Execution input fields",
        "",
        "The JSON object an execution starts with (console, `blackwell-training submit`, the Python API, "
        "EventBridge's `detail`). Every field is optional; any other field, and an input that is not a JSON "
        "object, is refused with every problem listed. Allowed values are shown as the default deployment checks "
        "them (`cdk.json` keys set some bounds: the default column names them, and so does the text). Each field "
        "is checked against its own limits, then the decision as a whole against the room the workflow's state "
        "keeps for it: fields each within their own limits can still be refused together (long `hyperparameters` "
        "values, many `environment` variables and `tags`) when the decided request would take more than "
        f"{bounds.STATE_LIMIT_BYTES // bounds.KIB} KiB of the workflow's state (Step Functions passes at most "
        "256 KiB between states, and the job's description joins the decision after the job); the refusal names "
        "the largest fields. Check an input with `blackwell-training validate` ([running jobs](running-jobs.md)).",
        "",
    ]
    rows = []
    for spec in FIELDS:
        default = code(json.dumps(spec.default))
        if spec.context_key:
            default += f" (cdk.json {code(spec.context_key)})"
        rows.append([code(spec.name), default, spec.allowed_text(rules), spec.description])
    return lines + table(["field", "default", "allowed", "what it does"], rows)


def evaluate_section() -> list[str]:
    """The ``evaluate`` block's own fields: every name of ``EVALUATE_DEFAULTS`` (its default from there), with its
    row of ``evaluate_block.EVALUATE_FIELDS``."""
    rules = reference_rules()
    missing = [name for name in EVALUATE_DEFAULTS if name not in EVALUATE_FIELDS_BY_NAME]
    extra = [name for name in EVALUATE_FIELDS_BY_NAME if name not in EVALUATE_DEFAULTS]
    if missing or extra:
        raise ValueError(
            f"EVALUATE_DEFAULTS and evaluate_block.EVALUATE_FIELDS differ: no row for {missing}, no default "
            f"for {extra}"
        )
    lines = [
        "## The `evaluate` block's fields",
        "",
        "The input field `evaluate` is an object of these fields ([evaluating a trained model](evaluation.md)); "
        "any other field is refused.",
        "",
    ]
    rows = []
    for name, default in EVALUATE_DEFAULTS.items():
        spec = EVALUATE_FIELDS_BY_NAME[name]
        shown = "required" if spec.required else code(json.dumps(default))
        rows.append([code(f"evaluate.{name}"), shown, spec.allowed(rules), spec.description])
    return lines + table(["evaluate field", "default", "allowed", "what it does"], rows)


def _where(name: str) -> str:
    if name in TOP_LEVEL_SETTINGS:
        return f"the top-level input field {code(name)}"
    if name in PLATFORM_HYPERPARAMETERS:
        return "set by the platform in a job (not from an execution)"
    return "`hyperparameters`"


def _setting_row(spec: Hyperparameter, where: str | None) -> list[str]:
    default = "not set" if spec.default is None else code(json.dumps(spec.default))
    row = [code(spec.name), default, spec.allowed(), spec.help]
    return row if where is None else [*row, where]


def trainer_sections() -> list[str]:
    lines = [
        "## Trainer settings",
        "",
        "The trainer's settings (`training/contract/`), the same for a SageMaker job, `train.sh` and a "
        "local run (`python -m training.trainer --name value`). Either spelling works: `--num_layers` or "
        "`--num-layers`, and in an execution's `hyperparameters` `num_layers` or `num-layers`; values are text "
        'there (`"2000"`), numbers and booleans are accepted too. `train.sh --help` lists them all.',
        "",
    ]
    lines += table(
        ["setting", "default", "allowed", "what it does", "set from an execution by"],
        (_setting_row(spec, _where(spec.name)) for spec in HYPERPARAMETERS),
    )
    lines += [
        "",
        "## Trainer-only switches",
        "",
        "Switches of local runs and tests (`python -m training.trainer --data_dir data/`), not accepted in an "
        "execution's `hyperparameters`.",
        "",
    ]
    lines += table(
        ["switch", "default", "allowed", "what it does"],
        (_setting_row(spec, None) for spec in TRAINER_ONLY_SETTINGS),
    )
    return lines


def context_section() -> list[str]:
    lines = [
        "## `cdk.json` keys",
        "",
        "The app's settings: `cdk.json` → `context`, or `-c key=value` on the CDK command line "
        '([deploying](deploy.md)). Every key is optional; a key set to `null` or `""` takes its default. An '
        "unknown key is refused with the closest known key (`context usekms: unknown key; did you mean useKms?`), "
        "and so are contradictory keys and every bad value: each error is one line naming the key, and synthesis "
        "exits with status 1. CDK's own keys (feature flags `@aws-cdk/...`, `aws:cdk:...`, context lookups) pass "
        "through.",
        "",
    ]
    return lines + table(
        ["key", "default", "allowed", "what it does"],
        ([code(k.name), _context_default(k), k.allowed_text(), k.description] for k in CONTEXT),
    )


def _context_default(key: ContextKey) -> str:
    if key.shown_default is not None:
        return key.shown_default
    return "not set" if key.default is None else code(json.dumps(key.default))


def render() -> str:
    parts = [
        INTRO,
        *input_fields_section(),
        "",
        *evaluate_section(),
        "",
        *trainer_sections(),
        "",
        *context_section(),
    ]
    return "\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m constructs_lib.reference", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not PAGE.is_file() or PAGE.read_text() != text
        if stale:
            print(f"{PAGE} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
