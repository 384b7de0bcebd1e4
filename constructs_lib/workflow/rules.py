"""What an execution of a workflow may ask for: the ``RequestRules`` made from the workflow's props (its defaults,
data sources, limits and settings), with SageMaker's limits read from botocore at synth; the defaults must pass
them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_s3 as s3

from constructs_lib.workflow.defaults import WorkflowDefaults
from constructs_lib.workflow.props import int_in
from training.request.decision import validate_request
from training.request.rules import DEFAULT_MAX_KEEP_ALIVE_SECONDS, RequestRules, parse_data_sources


def request_rules(
    stack: Stack,
    bucket: s3.IBucket,
    run_segment: str,
    workflow_defaults: WorkflowDefaults,
    data_sources: Sequence[str] | None,
    train_data_prefix: str | None,
    checkpoint_prefix: str,
    limits: tuple[tuple[str, ...], int, int, int],
    *,
    max_keep_alive_seconds: int | None,
    **settings: Any,
) -> tuple[RequestRules, tuple[str, ...]]:
    """What an execution may ask for (the Lambda function's rules; the operator CLI validates with them),
    with SageMaker's limits read from botocore now, and the data sources (``train_data_prefix`` among them) of the
    workflow of ``bucket`` and ``run_segment``; its ``workflow_defaults`` must pass them. ``limits``: allowed
    instance types, max instance count, max runtime, capacity retries; ``settings``: further
    ``RequestRules`` fields."""
    allowed, max_count, max_runtime, retries = limits
    try:
        sources = parse_data_sources(list(data_sources) if data_sources is not None else None)
    except ValueError as error:
        raise ValueError(
            f"TrainingWorkflow: data_sources{str(error).removeprefix('context dataSources')}"
        ) from None
    defaults = workflow_defaults.as_input()
    if train_data_prefix is not None:
        if defaults["train_data_uri"] is not None:
            raise ValueError("TrainingWorkflow: give train_data_prefix or defaults.train_data_uri, not both")
        defaults["train_data_uri"] = f"s3://{bucket.bucket_name}/{train_data_prefix}"
        sources = tuple(dict.fromkeys((*sources, train_data_prefix)))
    rules = RequestRules(
        defaults=defaults,
        allowed_instance_types=allowed,
        max_instance_count=max_count,
        max_runtime_seconds=max_runtime,
        region=stack.region,
        bucket_name=bucket.bucket_name,
        checkpoint_prefix=checkpoint_prefix,
        workflow_segment=run_segment,
        data_sources=sources,
        max_capacity_retries=retries,
        **settings,
    ).with_limits()
    keep_alive_limit = int(rules.sagemaker()["KeepAlivePeriodInSeconds"]["max"])
    rules = replace(
        rules,
        max_keep_alive_seconds=int_in(
            "max_keep_alive_seconds",
            max_keep_alive_seconds,
            DEFAULT_MAX_KEEP_ALIVE_SECONDS,
            0,
            keep_alive_limit,
        ),
    )
    concrete_region = None if re.search(r"\$\{Token", stack.region) else stack.region
    problems = validate_request({}, replace(rules, region=concrete_region))
    if problems:
        raise ValueError(f"TrainingWorkflow: defaults.{problems[0]}")
    return rules, sources
