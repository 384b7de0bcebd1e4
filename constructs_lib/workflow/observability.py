"""The training workflow's observability: the executions-not-succeeded alarm, the notification topic and rule,
and the EventBridge trigger. Each function takes the scope to build in and what it uses (the state machine, the
key, ...) and returns what it built; the workflow construct keeps them as its attributes.

The rule and the alarm have physical names derived from their construct paths, so that the topic policy and the
key policy can name their exact ARNs in ``aws:SourceArn`` (a reference would make a dependency cycle: key, topic,
rule/alarm, key)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsii
from aws_cdk import ArnFormat, Duration, Names, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct, IConstruct

from constructs_lib._shared import console_links
from constructs_lib._shared.nag import (
    NIST_800_53_R5,
    SERVERLESS,
    acknowledge,
    acknowledge_role_policy,
    policy_scope,
)

FAILED_STATUSES = ("FAILED", "TIMED_OUT", "ABORTED")


@dataclass(frozen=True)
class Notifications:
    """What :func:`alarm_and_notifications` built."""

    alarm: cloudwatch.Alarm
    """Executions that failed, timed out or were aborted (at least one in 5 minutes)."""
    topic: sns.ITopic | None
    """The topic told when an execution ends (given or created); None when notifications are off."""
    key: kms.IKey | None
    """The key of a created topic (``encryption_key`` or one created); None when no topic was created."""
    status_rule: events.Rule | None
    """The execution-ended rule that tells ``topic``; None without a topic."""


def alarm_and_notifications(
    workflow: Construct,
    state_machine: sfn.StateMachine,
    *,
    notification_topic: sns.ITopic | None,
    notifications: bool,
    encryption_key: kms.IKey | None = None,
    removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
) -> Notifications:
    """The executions-not-succeeded alarm of ``state_machine``, the notification topic and the execution-ended
    rule, built in ``workflow`` (whose path names the alarm and the rule).

    A created topic is encrypted with ``encryption_key`` or, without one, a key created here (rotation on,
    ``removal_policy``). The topic policy and the key policy let only this rule and this alarm publish.
    """
    stack = Stack.of(workflow)
    sm = state_machine
    alarm_name = _physical_name(workflow, "ExecutionsNotSucceeded", 255)
    rule_name = _physical_name(workflow, "ExecutionEnded", 64)
    sources = {
        "events.amazonaws.com": stack.format_arn(service="events", resource="rule", resource_name=rule_name),
        "cloudwatch.amazonaws.com": stack.format_arn(
            service="cloudwatch",
            resource="alarm",
            resource_name=alarm_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        ),
    }
    alarm = cloudwatch.Alarm(
        workflow,
        "ExecutionsNotSucceeded",
        alarm_name=alarm_name,
        alarm_description="A training workflow execution failed, timed out or was aborted",
        metric=cloudwatch.MathExpression(
            expression="failed + timedOut + aborted",
            using_metrics={
                "failed": sm.metric_failed(statistic="Sum"),
                "timedOut": sm.metric_timed_out(statistic="Sum"),
                "aborted": sm.metric_aborted(statistic="Sum"),
            },
            period=Duration.minutes(5),
            label="Executions not succeeded",
        ),
        threshold=1,
        evaluation_periods=1,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
    )
    topic = notification_topic
    notification_key: kms.IKey | None = None
    if notification_topic is None and notifications:
        key = encryption_key or kms.Key(
            workflow,
            "NotificationKey",
            description="Encrypts the training workflow notifications",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )
        for service, source_arn in sources.items():
            key.add_to_resource_policy(
                iam.PolicyStatement(
                    sid=f"Publish{service.split('.')[0].capitalize()}{Names.unique_id(workflow)[-8:]}",
                    principals=[iam.ServicePrincipal(service)],
                    actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                    resources=["*"],
                    conditions=_source(stack, source_arn),
                )
            )
        notification_key = key
        topic = sns.Topic(
            workflow,
            "Notifications",
            display_name="Training workflow",
            master_key=key,
            enforce_ssl=True,
        )
    if topic is None:
        acknowledge(
            alarm,
            "CloudWatchAlarmAction",
            "Notifications are off (no notification_topic, notifications=False): the alarm shows state in the "
            "console and on dashboards; add an action with workflow.alarm.add_alarm_action(...) to be told.",
            pack=NIST_800_53_R5,
        )
        return Notifications(alarm=alarm, topic=None, key=None, status_rule=None)
    # The topic policy replaces SNS's default one: say who may publish, each from its exact source. (A no-op on
    # an imported topic, whose own policy must allow the same.)
    for service, source_arn in sources.items():
        topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid=f"{service.split('.')[0].capitalize()}Publish",
                principals=[iam.ServicePrincipal(service)],
                actions=["sns:Publish"],
                resources=[topic.topic_arn],
                conditions=_source(stack, source_arn),
            )
        )
    alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
    # An EventBridge rule (not sns:Publish states) so that timeouts and aborts, which never reach a
    # state of the machine, are reported too.
    status_rule = events.Rule(
        workflow,
        "ExecutionEnded",
        rule_name=rule_name,
        description="Tell the notification topic when a training workflow execution ends",
        event_pattern=events.EventPattern(
            source=["aws.states"],
            detail_type=["Step Functions Execution Status Change"],
            detail={
                "stateMachineArn": [sm.state_machine_arn],
                "status": ["SUCCEEDED", *FAILED_STATUSES],
            },
        ),
        targets=[_TopicTarget(topic, notification_message(stack.region))],
    )
    acknowledge(
        status_rule,
        "EventBusDLQ",
        "A notification that EventBridge cannot deliver after its 24 hours of retries loses nothing: the "
        "outcome stays in the execution history, the alarm counts it, and a queue of copies would have no reader.",
        pack=SERVERLESS,
    )
    return Notifications(alarm=alarm, topic=topic, key=notification_key, status_rule=status_rule)


@jsii.implements(events.IRuleTarget)
class _TopicTarget:
    """An SNS topic as a rule target, adding no permission: ``targets.SnsTopic`` would add a topic-policy
    statement for ``events.amazonaws.com`` with no source condition (any account's rule could publish)."""

    def __init__(self, topic: sns.ITopic, message: events.RuleTargetInput) -> None:
        self._topic = topic
        self._message = message

    def bind(self, rule: Any, id: str | None = None) -> events.RuleTargetConfig:  # noqa: A002 (jsii's name)
        return events.RuleTargetConfig(arn=self._topic.topic_arn, input=self._message)


def _physical_name(workflow: IConstruct, child: str, max_length: int) -> str:
    """A deterministic name, unique per stack and construct path, for ``workflow``'s ``child``."""
    return Names.unique_resource_name(workflow, max_length=max_length - len(child) - 1) + "-" + child


def _source(stack: Stack, source_arn: str) -> dict[str, dict[str, str]]:
    return {
        "ArnEquals": {"aws:SourceArn": source_arn},
        "StringEquals": {"aws:SourceAccount": stack.account},
    }


def notification_message(region: str | None) -> events.RuleTargetInput:
    """What the topic is told when an execution ends: a headline (run and status), the error, the cause (the job and
    SageMaker's failure reason), the summary (final metrics, artifact and checkpoint URIs, console links), the
    execution's console link and the command that sums the run up.

    EventBridge does not escape a value it splices into a string, and causes and summaries hold quotes, so those
    go in as JSON values of their own; only names, statuses, the region and the ARN (no quotes possible) are
    spliced into text."""

    def field(path: str) -> str:
        return events.EventField.from_path(path)

    name, status = field("$.detail.name"), field("$.detail.status")
    execution = console_links.EXECUTION.format(
        host=console_links.console_host_of_region(region),
        region=field("$.region"),
        execution_arn=field("$.detail.executionArn"),
    )
    return events.RuleTargetInput.from_object(
        {
            "message": f"Training run {name} ended: {status}",
            "run": name,
            "status": status,
            "error": field("$.detail.error"),
            "cause": field("$.detail.cause"),
            "summary": field("$.detail.output"),
            "console": execution,
            "details": f"blackwell-training result {name}",
        }
    )


def trigger(
    scope: Construct,
    state_machine: sfn.StateMachine,
    *,
    event_pattern: events.EventPattern | None,
    event_bus: events.IEventBus | None,
    encryption_key: kms.IKey | None,
) -> events.Rule | None:
    """The EventBridge rule ``Trigger`` in ``scope`` that starts an execution of ``state_machine`` per event
    matching ``event_pattern`` (returned; None without a pattern). With ``encryption_key`` (the state machine's),
    the rule's role may use the key for this state machine's execution input."""
    if event_pattern is None:
        return None
    sm = state_machine
    trigger_rule = events.Rule(
        scope,
        "Trigger",
        description="Start a training workflow execution with the event's detail as input",
        event_bus=event_bus,
        event_pattern=event_pattern,
        targets=[targets.SfnStateMachine(sm, input=events.RuleTargetInput.from_event_path("$.detail"))],
    )
    acknowledge(
        trigger_rule,
        "EventBusDLQ",
        "A start request that EventBridge cannot deliver in 24 hours of retries starts no job and spends "
        "nothing; the sender sees no execution for its event and sends it again (executions are idempotent "
        "per input only by name, so a replayed queue could start duplicate multi-GPU jobs).",
        pack=SERVERLESS,
    )
    events_role = sm.node.try_find_child("EventsRole")
    if events_role is not None and encryption_key is not None:
        # Starting an execution of a state machine encrypted with a customer key encrypts its input with
        # that key: the caller needs a data key, in the context of this state machine only.
        iam.Grant.add_to_principal(
            grantee=events_role,  # type: ignore[arg-type]
            actions=["kms:GenerateDataKey", "kms:Decrypt"],
            resource_arns=[encryption_key.key_arn],
            conditions={
                "StringEquals": {"kms:EncryptionContext:aws:states:stateMachineArn": sm.state_machine_arn}
            },
        )
    if events_role is not None:
        acknowledge_role_policy(policy_scope(events_role))
    return trigger_rule
