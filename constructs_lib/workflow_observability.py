"""The training workflow's observability: the executions-not-succeeded alarm, the notification topic and rule,
and the EventBridge trigger. Each function adds to the ``TrainingWorkflow`` it is given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns

if TYPE_CHECKING:
    from constructs_lib.training_workflow import TrainingWorkflow
FAILED_STATUSES = ("FAILED", "TIMED_OUT", "ABORTED")


def alarm_and_notifications(
    workflow: TrainingWorkflow, stack: Stack, notification_topic: sns.ITopic | None, notifications: bool
) -> None:
    """The executions-not-succeeded alarm, the notification topic and the execution-ended rule."""
    sm = workflow.state_machine
    workflow.alarm = cloudwatch.Alarm(
        workflow,
        "ExecutionsNotSucceeded",
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
    workflow.notification_topic: sns.ITopic | None = notification_topic
    workflow.notification_key: kms.IKey | None = None
    if notification_topic is None and notifications:
        key = kms.Key(
            workflow,
            "NotificationKey",
            description="Encrypts the training workflow notifications",
            enable_key_rotation=True,
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowEventBridgeAndCloudWatchToPublish",
                principals=[
                    iam.ServicePrincipal("events.amazonaws.com"),
                    iam.ServicePrincipal("cloudwatch.amazonaws.com"),
                ],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        workflow.notification_key = key
        workflow.notification_topic = sns.Topic(
            workflow,
            "Notifications",
            display_name="Training workflow",
            master_key=key,
            enforce_ssl=True,
        )
    if workflow.notification_topic is not None:
        workflow.alarm.add_alarm_action(cloudwatch_actions.SnsAction(workflow.notification_topic))
        # An EventBridge rule (not sns:Publish states) so that timeouts and aborts, which never reach a
        # state of the machine, are reported too.
        workflow.status_rule = events.Rule(
            workflow,
            "ExecutionEnded",
            description="Tell the notification topic when a training workflow execution ends",
            event_pattern=events.EventPattern(
                source=["aws.states"],
                detail_type=["Step Functions Execution Status Change"],
                detail={
                    "stateMachineArn": [sm.state_machine_arn],
                    "status": ["SUCCEEDED", *FAILED_STATUSES],
                },
            ),
            targets=[
                targets.SnsTopic(
                    workflow.notification_topic,
                    message=events.RuleTargetInput.from_object(
                        {
                            "execution": events.EventField.from_path("$.detail.name"),
                            "status": events.EventField.from_path("$.detail.status"),
                            "error": events.EventField.from_path("$.detail.error"),
                            "cause": events.EventField.from_path("$.detail.cause"),
                            "output": events.EventField.from_path("$.detail.output"),
                            "executionArn": events.EventField.from_path("$.detail.executionArn"),
                        }
                    ),
                )
            ],
        )


def trigger(
    workflow: TrainingWorkflow, event_pattern: events.EventPattern | None, event_bus: events.IEventBus | None
) -> None:
    """The EventBridge rule that starts an execution per matching event (``workflow.trigger_rule``)."""
    sm = workflow.state_machine
    workflow.trigger_rule: events.Rule | None = None
    if event_pattern is not None:
        workflow.trigger_rule = events.Rule(
            workflow,
            "Trigger",
            description="Start a training workflow execution with the event's detail as input",
            event_bus=event_bus,
            event_pattern=event_pattern,
            targets=[targets.SfnStateMachine(sm, input=events.RuleTargetInput.from_event_path("$.detail"))],
        )
