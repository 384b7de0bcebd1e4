"""Input validation of the training workflow, generated from one table.

The execution input is merged over the defaults into ``$.config``; this module turns :func:`input_fields` (a
table built from ``training/contract.py`` and the construct props) into Step Functions Choice/Pass/Fail states
that reject bad input with error ``InvalidInput`` before any AWS call, and into a Python mirror
(:func:`check_value`) that the construct uses to validate its own defaults at synth time.

Only JSONPath features that both AWS and moto's ASL engine evaluate are used:

* type: ``IsString``/``IsNumeric``/``IsBoolean``/``IsNull``; a JSON object is recognised by ``States.JsonToString``
  starting with ``{``;
* integers: ``States.JsonToString`` of the number split at ``.``, ``e`` and ``E`` gives exactly one part;
* character sets: ``States.StringSplit(value, <allowed characters>)`` drops every allowed character (and the
  empty strings between them), so the value is made only of allowed characters exactly when the result is empty;
* digit counts: a string of digits ``d`` has exactly 12 digits when ``States.StringToJson('1' + d)`` lies in
  ``[10^12, 2*10^12)``;
* ``Choice`` rules are tried in order and the first match wins: every rule that reads a value of some type comes
  after the rule that rejects (or skips) the other types, so no comparison ever sees a value of the wrong type.

Known gap: ASL has no string-length function, so ``job_name_prefix`` is checked exactly for its characters
and its first character, but its length (at most ``JOB_NAME_PREFIX_MAX_LENGTH``) only at synth time for the
default; an over-long prefix in the input makes SageMaker reject ``CreateTrainingJob`` (``ValidationException``,
no job is created), which the workflow reports as ``LaunchFailed``. ``hyperparameters`` values are checked to be
strings on the compact JSON text (no ``":`` followed by the start of a number, ``true``/``false``/``null``, an array
or an object), which also refuses a string that itself contains such a sequence (e.g. a JSON object as a string);
its size (SageMaker allows 100 hyperparameters in all) is left to SageMaker.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from training.contract import (
    HYPERPARAMETERS_BY_NAME,
    PRECISIONS,
    instance_types_supporting,
)

INVALID_INPUT_ERROR = "InvalidInput"
JOB_NAME_PREFIX_MAX_LENGTH = 26
"""``TrainingJobName`` is at most 63 characters; ``<prefix>-<UUID>`` leaves 26 for the prefix."""
JOB_NAME_CHARSET = string.ascii_letters + string.digits + "-"
MAX_RUNTIME_SECONDS_LIMIT = 28 * 24 * 3600
"""SageMaker's ceiling for ``MaxRuntimeInSeconds`` and ``MaxWaitTimeInSeconds`` (28 days)."""
PARTITION_CHARSET = string.ascii_lowercase + "-"
NON_STRING_JSON_STARTS = "-0123456789tfn[{"
"""First characters of a JSON value that is not a string."""
CONFIG = "$.config"
PROBE = "$.probe"


@dataclass(frozen=True)
class InputField:
    """One execution-input field: ``kind`` is string, integer, boolean, object, job_name_prefix or
    training_plan_arn; ``optional`` fields may be null (absent)."""

    name: str
    kind: str
    description: str
    optional: bool = False
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return f"{CONFIG}.{self.name}"

    def allowed(self) -> str:
        """What is allowed, in words (used in every InvalidInput cause)."""
        if self.kind == "string":
            text = "one of " + ", ".join(self.choices)
        elif self.kind == "integer":
            text = f"an integer in [{self.minimum}, {self.maximum}]"
        elif self.kind == "boolean":
            text = "true or false"
        elif self.kind == "object":
            text = "a JSON object of string values"
        elif self.kind == "job_name_prefix":
            text = (
                f"1 to {JOB_NAME_PREFIX_MAX_LENGTH} characters of a-z, A-Z, 0-9 and hyphen, "
                "starting with a letter or digit"
            )
        else:
            text = (
                "a training plan ARN arn:aws[a-z-]*:sagemaker:<this region>:<12 digits>:training-plan/<name>"
            )
        return f"{text}, or null" if self.optional else text


def input_fields(
    *, allowed_instance_types: Sequence[str], max_instance_count: int, max_runtime_seconds: int
) -> tuple[InputField, ...]:
    """The execution-input table: every field, its type and what it allows (from the contract and the props)."""

    def hp(name: str, description: str, optional: bool = False) -> InputField:
        spec = HYPERPARAMETERS_BY_NAME[name]
        assert spec.minimum is not None and spec.maximum is not None
        return InputField(
            name,
            "integer",
            description,
            minimum=int(spec.minimum),
            maximum=int(spec.maximum),
            optional=optional,
        )

    return (
        InputField("precision", "string", "Numeric format of the GEMMs.", choices=PRECISIONS),
        hp("num_layers", "Transformer blocks (null: the model preset's).", optional=True),
        hp("batch_size", "Micro-batch size per GPU (sequences)."),
        hp("seq_length", "Tokens per sequence."),
        InputField("activation_checkpointing", "boolean", "Recompute each block's activations."),
        InputField(
            "instance_type",
            "string",
            "SageMaker training instance type.",
            choices=tuple(allowed_instance_types),
        ),
        InputField("instance_count", "integer", "Instances (nodes).", minimum=1, maximum=max_instance_count),
        InputField(
            "training_plan_arn", "training_plan_arn", "Run on a Flexible Training Plan.", optional=True
        ),
        InputField("use_spot", "boolean", "Managed spot training."),
        InputField(
            "max_runtime_seconds",
            "integer",
            "Training time limit.",
            minimum=1,
            maximum=max_runtime_seconds,
        ),
        InputField(
            "max_wait_seconds",
            "integer",
            "Spot only: training plus waiting for spot capacity (>= max_runtime_seconds).",
            optional=True,
            minimum=1,
            maximum=MAX_RUNTIME_SECONDS_LIMIT,
        ),
        InputField("hyperparameters", "object", "Extra trainer settings (string to string)."),
        InputField("job_name_prefix", "job_name_prefix", "Training job name prefix."),
    )


# --------------------------------------------------------------------------------------------------------------
# Python mirror (synth-time validation of the construct's defaults; same rules as the states)
# --------------------------------------------------------------------------------------------------------------

_TRAINING_PLAN_ARN = r"^arn:aws[a-z-]*:sagemaker:{region}:[0-9]{{12}}:training-plan/[^:]*$"
_JOB_NAME_PREFIX = re.compile(rf"^[a-zA-Z0-9][a-zA-Z0-9-]{{0,{JOB_NAME_PREFIX_MAX_LENGTH - 1}}}$")


def check_value(field: InputField, value: Any, *, region: str | None = None) -> str | None:
    """``None`` when ``value`` is allowed for ``field``, else the InvalidInput cause the workflow would give."""
    problem = f"{field.name}: must be {field.allowed()}; got {json.dumps(value)}"
    if value is None:
        return None if field.optional else problem
    if field.kind == "string":
        return None if isinstance(value, str) and value in field.choices else problem
    if field.kind == "boolean":
        return None if isinstance(value, bool) else problem
    if field.kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        assert field.minimum is not None and field.maximum is not None
        return None if ok and field.minimum <= value <= field.maximum else problem
    if field.kind == "object":
        ok = isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())
        return None if ok else problem
    if field.kind == "job_name_prefix":
        return None if isinstance(value, str) and _JOB_NAME_PREFIX.match(value) else problem
    pattern = _TRAINING_PLAN_ARN.format(region=re.escape(region) if region else "[a-z0-9-]+")
    return None if isinstance(value, str) and re.match(pattern, value) else problem


def precision_problem(precision: str, instance_type: str) -> str | None:
    """The cause for a precision the instance's GPUs cannot run, or None."""
    if instance_type in instance_types_supporting(precision):
        return None
    return _precision_cause(precision, instance_types_supporting(precision))


def _precision_cause(precision: str, supporting: Sequence[str]) -> str:
    where = ", ".join(supporting) if supporting else "no allowed instance type"
    return f"precision: {precision} cannot run on the GPUs of instance_type; it needs one of {where}"


# --------------------------------------------------------------------------------------------------------------
# States
# --------------------------------------------------------------------------------------------------------------


def literal(text: str) -> str:
    """``text`` as an intrinsic-function string literal (quotes, braces and backslashes escaped)."""
    return "'" + re.sub(r"([\\'{}])", r"\\\1", text) + "'"


def format_intrinsic(template: str, *arguments: str) -> str:
    """``States.Format`` of ``template`` (whose ``{}`` are placeholders; everything else is escaped)."""
    escaped = "{}".join(literal(piece)[1:-1] for piece in template.split("{}"))
    return f"States.Format('{escaped}', {', '.join(arguments)})"


class ValidationStates:
    """Builds the validation states for ``fields`` in ``scope``; :meth:`chain` returns the first one.

    Every field gets a ``Check <field>`` Choice (type, then the values that need no computation); fields whose
    values need computation (integers, character sets, ARNs, objects) get ``Inspect <field>`` Pass states that
    write to ``$.probe.<field>`` and a further Choice. Each field has one ``Invalid <field>`` Fail state whose
    cause names the field, says what is allowed and shows the value received.
    """

    def __init__(
        self,
        scope: Construct,
        *,
        fields: Sequence[InputField],
        region: str,
        allowed_instance_types: Sequence[str],
    ) -> None:
        self.scope = scope
        self.fields = {f.name: f for f in fields}
        self.region = region
        self.allowed_instance_types = tuple(allowed_instance_types)

    # -- public --------------------------------------------------------------------------------------------
    def chain(self, next_state: sfn.IChainable) -> sfn.State:
        """All checks in table order, then the cross-field checks, then ``next_state``."""
        state: sfn.IChainable = self._cross_field_states(next_state)
        for f in reversed(list(self.fields.values())):
            state = self._field_states(f, state)
        assert isinstance(state, sfn.State)
        return state

    # -- per field -----------------------------------------------------------------------------------------
    def _fail(self, name: str, *, cause: str | None = None, cause_path: str | None = None) -> sfn.Fail:
        return sfn.Fail(self.scope, name, error=INVALID_INPUT_ERROR, cause=cause, cause_path=cause_path)

    def _field_fail(self, f: InputField) -> sfn.Fail:
        return self._fail(
            f"Invalid {f.name}",
            cause_path=format_intrinsic(
                f"{f.name}: must be {f.allowed()}; got {{}}", f"States.JsonToString({f.path})"
            ),
        )

    def _field_states(self, f: InputField, next_state: sfn.IChainable) -> sfn.State:
        fail = self._field_fail(f)
        p = f.path
        check = sfn.Choice(self.scope, f"Check {f.name}", comment=f"{f.name}: {f.description}")
        if f.optional:
            check.when(sfn.Condition.is_null(p), next_state)
        if f.kind == "string":
            check.when(sfn.Condition.not_(sfn.Condition.is_string(p)), fail)
            check.when(sfn.Condition.not_(_any(sfn.Condition.string_equals(p, c) for c in f.choices)), fail)
            return check.otherwise(next_state)
        if f.kind == "boolean":
            check.when(sfn.Condition.not_(sfn.Condition.is_boolean(p)), fail)
            return check.otherwise(next_state)
        if f.kind == "integer":
            check.when(sfn.Condition.not_(sfn.Condition.is_numeric(p)), fail)
            inspect = self._inspect(
                f, {"parts.$": f"States.ArrayLength(States.StringSplit(States.JsonToString({p}), '.eE'))"}
            )
            value = sfn.Choice(self.scope, f"Check {f.name} value")
            value.when(sfn.Condition.not_(sfn.Condition.number_equals(f"{PROBE}.{f.name}.parts", 1)), fail)
            value.when(sfn.Condition.number_less_than(p, f.minimum or 0), fail)
            value.when(sfn.Condition.number_greater_than(p, f.maximum or 0), fail)
            check.otherwise(inspect.next(value.otherwise(next_state)))
            return check
        if f.kind == "object":
            check.when(
                _any(
                    [
                        sfn.Condition.is_null(p),
                        sfn.Condition.is_string(p),
                        sfn.Condition.is_numeric(p),
                        sfn.Condition.is_boolean(p),
                    ]
                ),
                fail,
            )
            inspect = self._inspect(f, {"json.$": f"States.JsonToString({p})"})
            value = sfn.Choice(self.scope, f"Check {f.name} value")
            value.when(sfn.Condition.not_(sfn.Condition.string_matches(f"{PROBE}.{f.name}.json", "{*")), fail)
            # A value that is not a string shows in compact JSON as '":' followed by the first character of a
            # number, true, false, null, an array or an object (with or without a space after the colon).
            value.when(
                _any(
                    sfn.Condition.string_matches(f"{PROBE}.{f.name}.json", f'*":{space}{first}*')
                    for first in NON_STRING_JSON_STARTS
                    for space in ("", " ")
                ),
                fail,
            )
            check.otherwise(inspect.next(value.otherwise(next_state)))
            return check
        if f.kind == "job_name_prefix":
            check.when(sfn.Condition.not_(sfn.Condition.is_string(p)), fail)
            check.when(sfn.Condition.string_equals(p, ""), fail)
            check.when(sfn.Condition.string_matches(p, "-*"), fail)
            inspect = self._inspect(
                f, {"foreign.$": f"States.ArrayLength(States.StringSplit({p}, {literal(JOB_NAME_CHARSET)}))"}
            )
            value = sfn.Choice(self.scope, f"Check {f.name} value")
            value.when(sfn.Condition.number_greater_than(f"{PROBE}.{f.name}.foreign", 0), fail)
            check.otherwise(inspect.next(value.otherwise(next_state)))
            return check
        if f.kind == "training_plan_arn":
            return self._arn_states(f, check, fail, next_state)
        raise ValueError(f"unknown field kind {f.kind!r}")

    def _inspect(self, f: InputField, parameters: dict[str, Any], suffix: str = "") -> sfn.Pass:
        return sfn.Pass(
            self.scope,
            f"Inspect {f.name}{suffix}",
            parameters=parameters,
            result_path=f"{PROBE}.{f.name}{suffix.replace(' ', '_')}",
        )

    def _arn_states(
        self, f: InputField, check: sfn.Choice, fail: sfn.Fail, next_state: sfn.IChainable
    ) -> sfn.State:
        p = f.path
        probe = f"{PROBE}.{f.name}"
        check.when(sfn.Condition.not_(sfn.Condition.is_string(p)), fail)
        split = self._inspect(
            f,
            {
                "parts.$": f"States.StringSplit({p}, ':')",
                "count.$": f"States.ArrayLength(States.StringSplit({p}, ':'))",
            },
        )
        count = sfn.Choice(self.scope, f"Check {f.name} parts")
        count.when(sfn.Condition.not_(sfn.Condition.number_equals(f"{probe}.count", 6)), fail)

        def part(i: int) -> str:
            return f"States.ArrayGetItem({probe}.parts, {i})"

        fields = self._inspect(
            f,
            {
                "rejoined.$": f"States.Format('{{}}:{{}}:{{}}:{{}}:{{}}:{{}}', {', '.join(part(i) for i in range(6))})",
                "prefix.$": part(0),
                "partition.$": part(1),
                "partition_foreign.$": f"States.ArrayLength(States.StringSplit({part(1)}, {literal(PARTITION_CHARSET)}))",
                "service.$": part(2),
                "region.$": part(3),
                "account.$": part(4),
                "account_foreign.$": f"States.ArrayLength(States.StringSplit({part(4)}, '0123456789'))",
                "resource.$": part(5),
            },
            " fields",
        )
        fp = f"{probe}_fields"
        shape = sfn.Choice(self.scope, f"Check {f.name} fields")
        for condition in (
            # Equal only when no ':'-separated part was empty (StringSplit drops empty parts).
            sfn.Condition.not_(sfn.Condition.string_equals_json_path(f"{fp}.rejoined", p)),
            sfn.Condition.not_(sfn.Condition.string_equals(f"{fp}.prefix", "arn")),
            sfn.Condition.not_(sfn.Condition.string_matches(f"{fp}.partition", "aws*")),
            sfn.Condition.number_greater_than(f"{fp}.partition_foreign", 0),
            sfn.Condition.not_(sfn.Condition.string_equals(f"{fp}.service", "sagemaker")),
            sfn.Condition.not_(sfn.Condition.string_equals(f"{fp}.region", self.region)),
            sfn.Condition.number_greater_than(f"{fp}.account_foreign", 0),
            sfn.Condition.not_(sfn.Condition.string_matches(f"{fp}.resource", "training-plan/*")),
        ):
            shape.when(condition, fail)
        account = self._inspect(
            f, {"number.$": f"States.StringToJson(States.Format('1{{}}', {fp}.account))"}, " account"
        )
        digits = sfn.Choice(self.scope, f"Check {f.name} account")
        digits.when(sfn.Condition.number_less_than(f"{probe}_account.number", 10**12), fail)
        digits.when(sfn.Condition.number_greater_than_equals(f"{probe}_account.number", 2 * 10**12), fail)
        check.otherwise(
            split.next(
                count.otherwise(fields.next(shape.otherwise(account.next(digits.otherwise(next_state)))))
            )
        )
        return check

    # -- cross-field ---------------------------------------------------------------------------------------
    def _cross_field_states(self, next_state: sfn.IChainable) -> sfn.State:
        """Precision vs. the instance's GPUs, training plan vs. spot, and the spot wait."""
        c = CONFIG
        plan = sfn.Choice(self.scope, "Check training plan options")
        plan.when(sfn.Condition.is_null(f"{c}.training_plan_arn"), next_state)
        plan.when(
            sfn.Condition.boolean_equals(f"{c}.use_spot", True),
            self._fail(
                "Invalid use_spot with training_plan_arn",
                cause="use_spot: managed spot cannot be combined with training_plan_arn; "
                "set use_spot to false or training_plan_arn to null",
            ),
        )
        plan.otherwise(next_state)

        default_wait = sfn.Pass(
            self.scope,
            "Default max_wait_seconds",
            comment="Spot without max_wait_seconds: wait no longer than the runtime limit.",
            input_path=f"{c}.max_runtime_seconds",
            result_path=f"{c}.max_wait_seconds",
        ).next(plan)
        spot = sfn.Choice(self.scope, "Check spot options")
        spot.when(
            sfn.Condition.and_(
                sfn.Condition.is_null(f"{c}.max_wait_seconds"),
                sfn.Condition.boolean_equals(f"{c}.use_spot", True),
            ),
            default_wait,
        )
        spot.when(sfn.Condition.is_null(f"{c}.max_wait_seconds"), plan)
        spot.when(
            sfn.Condition.boolean_equals(f"{c}.use_spot", False),
            self._fail(
                "Invalid max_wait_seconds without spot",
                cause="max_wait_seconds: only allowed with use_spot true; set it to null for on-demand or a plan",
            ),
        )
        spot.when(
            sfn.Condition.number_less_than_json_path(f"{c}.max_wait_seconds", f"{c}.max_runtime_seconds"),
            self._fail(
                "Invalid max_wait_seconds below runtime",
                cause_path=format_intrinsic(
                    "max_wait_seconds: must be >= max_runtime_seconds ({}); got {}",
                    f"{c}.max_runtime_seconds",
                    f"{c}.max_wait_seconds",
                ),
            ),
        )
        spot.otherwise(plan)

        gpus = sfn.Choice(self.scope, "Check precision on instance_type")
        for precision in PRECISIONS:
            supporting = [i for i in instance_types_supporting(precision) if i in self.allowed_instance_types]
            if set(self.allowed_instance_types) <= set(supporting):
                continue
            rule = sfn.Condition.string_equals(f"{c}.precision", precision)
            if supporting:
                rule = sfn.Condition.and_(
                    rule,
                    sfn.Condition.not_(
                        _any(sfn.Condition.string_equals(f"{c}.instance_type", i) for i in supporting)
                    ),
                )
            cause = _precision_cause(precision, supporting) + "; got instance_type {}"
            gpus.when(
                rule,
                self._fail(
                    f"Invalid precision {precision} for instance_type",
                    cause_path=format_intrinsic(cause, f"{c}.instance_type"),
                ),
            )
        return gpus.otherwise(spot)


def _any(conditions: Any) -> sfn.Condition:
    items = list(conditions)
    return items[0] if len(items) == 1 else sfn.Condition.or_(*items)
