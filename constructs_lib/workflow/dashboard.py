"""The training workflow's CloudWatch dashboard: the jobs' training metrics, the hosts' GPUs and the executions.

Job metrics are the trainer's ``MetricDefinitions`` (``/aws/sagemaker/TrainingJobs``, dimension ``TrainingJobName``)
and SageMaker's per-host GPU metrics (same namespace, dimension ``Host`` = ``<job>/algo-<n>``), drawn with metric
math ``SEARCH`` so that every job appears without knowing its name. CloudWatch search matches a dimension value
by its tokens (AWS's "CloudWatch search expression syntax": split at non-alphanumeric characters, at case changes
and at digits), never by prefix; a search term with a hyphen, ``TrainingJobName=blackwell-training``, matches only
those tokens next to each other and in that order. So each search is scoped to the workflow's default
``job_name_prefix`` as closely as CloudWatch allows, and no closer: an execution that sets another
``job_name_prefix`` is not drawn, and a job of any other workflow (or any job) whose name holds the same tokens in
a row is (two deployments with the same default prefix in one account and region share their curves). Further
prefixes (``more_prefixes``, the ``dashboardJobNamePrefixes`` setting) are searched too, any of them matching.
Every metric name comes from ``training.contract`` (``metric_name``, ``HOST_GPU_METRICS``): a renamed metric fails
at synth. The executions come from Step Functions (``AWS/States``).
"""

from __future__ import annotations

import re

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from constructs_lib._shared.console_links import DASHBOARD, console_host_of_region
from training.contract.evaluation import DEFAULT_EVALUATION_TASKS, evaluation_metric_name
from training.contract.metric_lines import (
    HOST_DIMENSION,
    HOST_GPU_METRICS,
    TRAINING_JOB_DIMENSION,
    TRAINING_METRICS_NAMESPACE,
    metric_name,
)

PERIOD = Duration.minutes(1)


MAX_PREFIXES = 10
"""The most job-name prefixes one dashboard searches by (each search stays far below CloudWatch's 1,024 characters)."""


def search_terms(dimension: str, *prefixes: str) -> str:
    """``TrainingJobName=blackwell-training`` for prefix ``blackwell-training``: a partial match of the prefix's
    tokens next to each other and in order (``blackwell`` then ``training``), which ``TrainingJobName=blackwell AND
    TrainingJobName=training`` is not (it also matches ``training-blackwell-...``). With several prefixes, any of
    them: ``(TrainingJobName=a OR TrainingJobName=b)``."""
    if not 1 <= len(prefixes) <= MAX_PREFIXES:
        raise ValueError(
            f"the dashboard searches by 1 to {MAX_PREFIXES} job name prefixes; got {len(prefixes)}"
        )
    terms = []
    for prefix in prefixes:
        term = prefix.rstrip("-") if isinstance(prefix, str) else ""  # hyphens are delimiters, never tokens
        if not re.fullmatch(r"[A-Za-z0-9]+(-+[A-Za-z0-9]+)*", term):
            raise ValueError(
                f"job_name_prefix {prefix!r}: the dashboard searches by it, so it must be letters, digits "
                "and hyphens, starting with a letter or digit"
            )
        if f"{dimension}={term}" not in terms:
            terms.append(f"{dimension}={term}")
    return terms[0] if len(terms) == 1 else f"({' OR '.join(terms)})"


def search(metric: str, dimension: str, prefixes: tuple[str, ...], statistic: str = "Average") -> str:
    """A ``SEARCH`` expression for ``metric`` of this workflow's jobs (or hosts), one series per job (host)."""
    schema = f'{{"{TRAINING_METRICS_NAMESPACE}",{dimension}}}'
    terms = search_terms(dimension, *prefixes)
    return f"SEARCH('{schema} MetricName=\"{metric}\" {terms}', '{statistic}', {int(PERIOD.to_seconds())})"


def _graph(
    title: str,
    expressions: list[tuple[str, str]],
    unit_label: str,
    width: int = 6,
    right: tuple[list[tuple[str, str]], str] | None = None,
) -> cloudwatch.GraphWidget:
    """A graph of search expressions on the left axis; ``right``: more on a right axis, with its label."""

    def lines(pairs: list[tuple[str, str]]) -> list[cloudwatch.IMetric]:
        return [
            cloudwatch.MathExpression(expression=expression, label=label, period=PERIOD, using_metrics={})
            for expression, label in pairs
        ]

    return cloudwatch.GraphWidget(
        title=title,
        left=lines(expressions),
        left_y_axis=cloudwatch.YAxisProps(label=unit_label, show_units=False),
        right=lines(right[0]) if right else None,
        right_y_axis=cloudwatch.YAxisProps(label=right[1], show_units=False) if right else None,
        width=width,
        height=6,
    )


def preference_row(prefixes: tuple[str, ...]) -> list[cloudwatch.IWidget]:
    """Preference tuning's graphs (``objective`` dpo; empty for other runs): the rewards of the chosen and the
    rejected answers and their margin, with the reward accuracy (training and held-out pairs) on the right axis; the
    policy's log-probabilities of the answers."""
    job = TRAINING_JOB_DIMENSION
    return [
        _graph(
            "DPO rewards (preference tuning)",
            [
                (search(metric_name(name), job, prefixes), name)
                for name in ("rewards_chosen", "rewards_rejected", "reward_margin")
            ],
            "beta x log-probability ratio",
            12,
            right=(
                [
                    (search(metric_name("reward_accuracy"), job, prefixes), "reward_accuracy"),
                    (
                        search(metric_name("val_reward_accuracy", "validation"), job, prefixes),
                        "val_reward_accuracy",
                    ),
                ],
                "share of pairs",
            ),
        ),  # fmt: skip
        _graph(
            "DPO log-probabilities of the answers",
            [(search(metric_name(name), job, prefixes), name) for name in ("logps_chosen", "logps_rejected")],
            "log-probability (sum over the answer)",
            12,
        ),
    ]


def training_dashboard(
    scope: Construct,
    state_machine: sfn.StateMachine,
    *,
    job_name_prefix: str,
    more_prefixes: tuple[str, ...] = (),
) -> cloudwatch.Dashboard:
    """The dashboard of the workflow ``state_machine`` whose jobs are named ``<job_name_prefix>-<uuid>`` (and
    ``<p>-<uuid>`` for each ``p`` of ``more_prefixes``: the executions that set their own ``job_name_prefix``)."""
    prefixes = (job_name_prefix, *more_prefixes)
    search_terms(TRAINING_JOB_DIMENSION, *prefixes)  # refuses a prefix it cannot search by, at synth
    job, host = TRAINING_JOB_DIMENSION, HOST_DIMENSION
    gpu, gpu_memory = HOST_GPU_METRICS
    rows: list[list[cloudwatch.IWidget]] = [
        [
            cloudwatch.TextWidget(
                markdown=f"**Training jobs whose names hold `{'`, `'.join(prefixes)}`** (job name prefixes; "
                "CloudWatch searches names by their words, not by prefix, so an execution with another "
                "`job_name_prefix` is not here: add it to `dashboardJobNamePrefixes`): the trainer's metric "
                "lines, one line per job (one run across its launches: `blackwell-training curves RUN`). GPU and "
                "GPU memory utilization are per host, summed over its GPUs (0-800% on 8 GPUs).",
                width=24,
                height=2,
            )
        ],
        [
            _graph(
                "Loss and val_loss",
                [
                    (search(metric_name("loss"), job, prefixes), "loss"),
                    (search(metric_name("val_loss", "validation"), job, prefixes), "val_loss"),
                ],
                "loss",
                right=(
                    [(search(metric_name("val_accuracy", "validation"), job, prefixes), "val_accuracy")],
                    "validation token accuracy",
                ),
            ),
            _graph(
                "Tokens/s (per GPU)",
                [(search(metric_name("tokens_per_sec"), job, prefixes), "")],
                "tokens/s",
            ),
            _graph("MFU", [(search(metric_name("mfu"), job, prefixes), "")], "fraction of peak"),
            _graph(
                "Peak GPU memory (GB)",
                [(search(metric_name("peak_mem_gb"), job, prefixes, "Maximum"), "")],
                "GB",
            ),
        ],
        preference_row(prefixes),
        [
            _graph(
                "GPU utilization per host",
                [(search(gpu, host, prefixes), "")],
                "% (sum over GPUs)",
                12,
            ),
            _graph(
                "GPU memory utilization per host",
                [(search(gpu_memory, host, prefixes), "")],
                "% (sum over GPUs)",
                12,
            ),
        ],
        evaluation_row(prefixes),
        [
            cloudwatch.GraphWidget(
                title="Executions",
                left=[
                    state_machine.metric_started(
                        label="started", period=Duration.minutes(5), statistic="Sum"
                    ),
                    state_machine.metric_succeeded(
                        label="succeeded", period=Duration.minutes(5), statistic="Sum"
                    ),
                    state_machine.metric_failed(label="failed", period=Duration.minutes(5), statistic="Sum"),
                    state_machine.metric_timed_out(
                        label="timed out", period=Duration.minutes(5), statistic="Sum"
                    ),
                ],
                width=24,
                height=6,
            )
        ],
    ]
    return cloudwatch.Dashboard(scope, "Dashboard", widgets=rows, default_interval=Duration.days(1))


def evaluation_row(prefixes: tuple[str, ...]) -> list[cloudwatch.IWidget]:
    """The evaluation jobs' scores on the standard tasks (``eval:<task>:acc`` and ``acc_norm``, the metric definitions
    of their ``evaluation task=...`` lines), one bar per job and task: the latest value over the dashboard's time
    range. Tasks of a user's own folder are in each run's summary and ``blackwell-training result``, not here (a
    dashboard's metrics are fixed at synth)."""
    row: list[cloudwatch.IWidget] = []
    for field in ("acc", "acc_norm"):
        expressions = [
            cloudwatch.MathExpression(
                expression=search(
                    evaluation_metric_name(task, field), TRAINING_JOB_DIMENSION, prefixes, "Maximum"
                ),
                label=f"{task} ${{PROP('Dim.{TRAINING_JOB_DIMENSION}')}}",  # CloudWatch's dynamic label: the job
                period=PERIOD,
                using_metrics={},
            )
            for task in DEFAULT_EVALUATION_TASKS
        ]
        row.append(
            cloudwatch.GraphWidget(
                title=f"Evaluation {field} (standard tasks, per job)",
                left=expressions,
                view=cloudwatch.GraphWidgetView.BAR,
                set_period_to_time_range=True,
                left_y_axis=cloudwatch.YAxisProps(label=field, min=0, max=1, show_units=False),
                width=12,
                height=6,
            )
        )
    return row


def dashboard_url(scope: Construct, dashboard: cloudwatch.Dashboard) -> str:
    """The console address of ``dashboard`` (tokens resolved at deploy time)."""
    region = Stack.of(scope).region
    return DASHBOARD.format(host=console_host_of_region(region), region=region, name=dashboard.dashboard_name)
