"""The training-image build at deploy time: a CDK ``Provider`` whose onEvent function starts the CodeBuild build
when the image tag is new and whose isComplete function waits for it (``handlers/image_build.py``), and the custom
resource ``Image`` whose ``ImageUri`` attribute makes a consumer wait for the build.

CloudFormation waits at most one hour for a custom resource (``ServiceTimeout`` 1..3600 s), so the wait is capped
at 60 minutes even though the build itself may run longer; when the wait runs out, the build goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import ArnFormat, CustomResource, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from constructs import Construct

from constructs_lib._shared.nag import (
    NIST_800_53_R5,
    SERVERLESS,
    acknowledge,
    acknowledge_role_policy,
    arn_evidence,
    policy_scope,
)
from constructs_lib.image.network import BuildNetwork
from constructs_lib.image.project import BuildProject
from constructs_lib.image.repository import TrainingImageRepository

HANDLERS_DIR = Path(__file__).resolve().parent / "handlers"
QUERY_INTERVAL = Duration.seconds(30)


@dataclass(frozen=True)
class DeployTimeBuild:
    """What :func:`deploy_time_build` built."""

    on_event_function: lambda_.Function
    is_complete_function: lambda_.Function
    provider: cr.Provider
    resource: CustomResource
    """The ``Custom::TrainingImage`` resource (it depends on the build policy: the build starts once its role
    has its permissions)."""
    image_uri: str
    """``<repository URI>:<content tag>``; resolving it makes a consumer wait for the build."""


def deploy_time_build(
    scope: Construct,
    *,
    image_repository: TrainingImageRepository,
    project: BuildProject,
    handler_logs: logs.LogGroup,
    wait_minutes: int,
    network: BuildNetwork,
) -> DeployTimeBuild:
    """The Provider with onEvent / isComplete (logging to ``handler_logs``, in ``network``) and the custom resource
    that starts ``project``'s build of ``project.image_tag`` and waits up to ``wait_minutes`` for it, in ``scope``."""
    repository = image_repository.repository
    handler_role = _lambda_role(scope, "HandlerRole", handler_logs, network)
    repository.grant(handler_role, "ecr:DescribeImages")
    handler_role.add_to_principal_policy(
        iam.PolicyStatement(
            sid="StartAndWatchTheImageBuild",
            actions=[
                "codebuild:StartBuild",
                "codebuild:BatchGetBuilds",
                "codebuild:ListBuildsForProject",
            ],
            resources=[project.project.project_arn],
        )
    )
    code = lambda_.Code.from_asset(str(HANDLERS_DIR), exclude=["__pycache__", "*.pyc"])

    def handler_function(construct_id: str, handler: str, description: str, **env: str) -> lambda_.Function:
        return lambda_.Function(
            scope,
            construct_id,
            runtime=lambda_.Runtime.PYTHON_3_14,
            code=code,
            handler=handler,
            description=description,
            environment=env or None,
            timeout=Duration.minutes(1),
            memory_size=256,
            role=handler_role,
            log_group=handler_logs,
            vpc=network.vpc,
            vpc_subnets=network.subnets,
            security_groups=network.security_groups or None,
        )

    on_event_function = handler_function(
        "OnEvent", "image_build.on_event", "Starts the training-image build when training/ changed"
    )
    is_complete_function = handler_function(
        "IsComplete",
        "image_build.is_complete",
        "Waits for the training-image build",
        WAIT_TIMEOUT_SECONDS=str(wait_minutes * 60),
    )
    on_event_role = _lambda_role(scope, "ProviderOnEventRole", handler_logs, network)
    waiter_role = _lambda_role(scope, "ProviderWaiterRole", handler_logs, network)
    for role in (handler_role, on_event_role, waiter_role):
        acknowledge_role_policy(policy_scope(role))
    provider = cr.Provider(
        scope,
        "Provider",
        on_event_handler=on_event_function,
        is_complete_handler=is_complete_function,
        query_interval=QUERY_INTERVAL,
        total_timeout=Duration.minutes(wait_minutes),
        framework_on_event_role=on_event_role,
        framework_complete_and_timeout_role=waiter_role,
        log_group=handler_logs,
        vpc=network.vpc,
        vpc_subnets=network.subnets,
        security_groups=network.security_groups or None,
    )
    functions = (on_event_function, is_complete_function)
    _acknowledge_provider(provider, on_event_role, waiter_role, functions, network)

    resource = CustomResource(
        scope,
        "Image",
        service_token=provider.service_token,
        resource_type="Custom::TrainingImage",
        properties={
            "ProjectName": project.project.project_name,
            "RepositoryName": repository.repository_name,
            "ImageTag": project.image_tag,
            "ImageUri": image_repository.image_uri(project.image_tag),
        },
    )
    # The build starts only once its role has its permissions.
    resource.node.add_dependency(project.build_policy)
    return DeployTimeBuild(
        on_event_function=on_event_function,
        is_complete_function=is_complete_function,
        provider=provider,
        resource=resource,
        image_uri=resource.get_att_string("ImageUri"),
    )


def _lambda_role(
    scope: Construct, construct_id: str, log_group: logs.ILogGroup, network: BuildNetwork
) -> iam.Role:
    """A deploy-time function's role: write ``log_group``, and in a VPC manage its network interfaces."""
    role = iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        description="Deploy-time training-image build (logs to its own log group only)",
    )
    log_group.grant_write(role)
    if network.vpc is not None:
        # What AWSLambdaVPCAccessExecutionRole would give, without an AWS managed policy.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="NetworkInterfacesInTheVpc",
                actions=[
                    "ec2:CreateNetworkInterface",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeSubnets",
                    "ec2:DeleteNetworkInterface",
                    "ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignPrivateIpAddresses",
                ],
                resources=["*"],
            )
        )
        acknowledge(
            policy_scope(role),
            "IAM5[Resource::*]",
            "Lambda creates and deletes the functions' network interfaces in the given VPC at run time; "
            "these EC2 actions take only Resource '*' (the same as AWSLambdaVPCAccessExecutionRole).",
        )
    return role


def _acknowledge_provider(
    provider: cr.Provider,
    on_event_role: iam.Role,
    waiter_role: iam.Role,
    functions: tuple[lambda_.Function, lambda_.Function],
    network: BuildNetwork,
) -> None:
    """What the Provider's roles and waiter state machine may do, and why (``functions``: onEvent, isComplete)."""
    for role in (on_event_role, waiter_role):
        for function in functions:
            acknowledge(
                policy_scope(role),
                f"IAM5[Resource::{arn_evidence(function, ':*')}]",
                "The CDK Provider framework invokes the handler function by ARN including its versions "
                "and aliases (<function ARN>:*); no other function.",
            )
    framework = provider.node
    waiter = framework.try_find_child("waiter-state-machine")
    if waiter is not None:
        for name in ("framework-isComplete", "framework-onTimeout"):
            acknowledge(
                policy_scope(waiter.node.find_child("Role")),
                f"IAM5[Resource::{arn_evidence(framework.find_child(name), ':*')}]",
                "The Provider's waiter state machine invokes its own isComplete/onTimeout framework "
                "functions, including versions and aliases; no other function.",
            )
        acknowledge(
            waiter,
            "SF1",
            "The Provider's waiter only polls isComplete every 30 s; each poll and its outcome is logged by "
            "the handler functions into their own log group with retention.",
        )
        acknowledge(
            waiter,
            "SF2",
            "The CDK Provider's waiter state machine offers no X-Ray tracing option; it runs one "
            "Lambda poll loop during deployment, traced in the handlers' logs.",
        )
        acknowledge(
            waiter,
            "StepFunctionStateMachineXray",
            "The CDK Provider's waiter state machine offers no X-Ray tracing option; it runs one "
            "Lambda poll loop during deployment, traced in the handlers' logs.",
            pack=SERVERLESS,
        )
        waiter_role_scope = waiter.node.find_child("Role")
        acknowledge_role_policy(policy_scope(waiter_role_scope))
        # Only Step Functions state machines of this account and region may assume the waiter's role.
        stack = Stack.of(provider)
        waiter_cfn_role = waiter_role_scope.node.default_child
        assert isinstance(waiter_cfn_role, iam.CfnRole)
        waiter_cfn_role.add_property_override(
            "AssumeRolePolicyDocument.Statement.0.Condition",
            {
                "StringEquals": {"aws:SourceAccount": stack.account},
                "ArnLike": {
                    "aws:SourceArn": stack.format_arn(
                        service="states",
                        resource="stateMachine",
                        resource_name="*",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                },
            },
        )
    _acknowledge_functions(framework, functions, network)


def _acknowledge_functions(
    framework: Any, functions: tuple[lambda_.Function, lambda_.Function], network: BuildNetwork
) -> None:
    """The deploy-time functions (ours and the Provider framework's): what does not apply to them."""
    ours = list(functions)
    theirs = [
        framework.find_child(name)
        for name in ("framework-onEvent", "framework-isComplete", "framework-onTimeout")
        if framework.try_find_child(name) is not None
    ]
    for function in ours + theirs:
        for pack in (NIST_800_53_R5, SERVERLESS):
            acknowledge(
                function,
                "LambdaDLQ",
                "CloudFormation and the Provider framework invoke these deploy-time functions and report "
                "every failure back to CloudFormation, which fails the deployment; a dead-letter queue "
                "would hold events that no one acts on.",
                pack=pack,
            )
        acknowledge(
            function,
            "LambdaConcurrency",
            "Deploy-time functions run once per deployment (and every 30 s while waiting); reserving "
            "concurrency would take it from the account's pool (10 in new accounts) and can fail the deploy.",
            pack=NIST_800_53_R5,
        )
        acknowledge(
            function,
            "LambdaTracing",
            "Deploy-time functions of the image build: each call and its outcome is logged to their own "
            "log group; X-Ray would add cost and a '*' permission for no extra signal.",
            pack=SERVERLESS,
        )
        if network.vpc is None:
            acknowledge(
                function,
                "LambdaInsideVPC",
                "No vpc was given: the functions call only AWS APIs (CodeBuild, ECR, Step Functions, Lambda) "
                "and hold no data; pass vpc to run them (and the build) inside one.",
                pack=NIST_800_53_R5,
            )
    for function in theirs:
        acknowledge(
            function,
            "LambdaDefaultMemorySize",
            "The memory of the CDK Provider framework's own functions is not configurable; they only relay "
            "calls to our handlers (256 MB).",
            pack=SERVERLESS,
        )
