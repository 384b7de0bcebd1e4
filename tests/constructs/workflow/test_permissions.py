"""The workflow's IAM that names its state machine (``permissions``, ``props.state_machine_name_of``): the key
condition CDK writes for a customer managed key, the role's trust, and every other statement of the template that
names a state machine, which must name this workflow's. The grants of the sync integration, data sources and
training plans are in test_construct.py."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import Names
from aws_cdk import aws_events as events
from aws_cdk import aws_kms as kms
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk.assertions import Match, Template

from constructs_lib._shared.nag import logical_id
from constructs_lib.workflow.construct import TrainingWorkflow
from tests.cdk_helpers import DEFAULT_ENV, names_only_this_state_machine, state_machine_references
from tests.workflow.stacks import build_workflow

KEY_CONTEXT = "kms:EncryptionContext:aws:states:stateMachineArn"
PARTITION = {"Ref": "AWS::Partition"}


def _machine_arn(name: str) -> dict:
    return {"Fn::Join": ["", ["arn:", PARTITION, f":states:us-west-2:123456789012:stateMachine:{name}"]]}


def _with_key(**props) -> tuple[TrainingWorkflow, Template, kms.Key]:
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    workflow = build_workflow(app, encryption_key=key, **props)
    return workflow, Template.from_stack(stack), key


@pytest.mark.parametrize("given", [None, "team-a_training"])
def test_the_key_condition_names_the_state_machine_by_its_physical_name(given):
    """Step Functions calls GenerateDataKey/Decrypt as the execution role with the encryption context
    aws:states:stateMachineArn = the state machine's ARN (docs/security.md). CDK conditions its grant on
    ``arn:...:stateMachine:<physical name>``, which names no state machine unless a name is given: the workflow
    always gives one, made from its construct path when the prop is left out."""
    workflow, template, key = _with_key(**({"state_machine_name": given} if given else {}))
    name = given or Names.unique_resource_name(workflow, max_length=80)
    assert name == (given or "TestWorkflowC89657D8") and len(name) <= 80
    template.has_resource_properties("AWS::StepFunctions::StateMachine", {"StateMachineName": name})
    template.has_resource_properties(
        "AWS::IAM::Policy",
        {
            "Roles": [{"Ref": logical_id(workflow.state_machine.role)}],
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        {
                            "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                            "Condition": {"StringEquals": {KEY_CONTEXT: _machine_arn(name)}},
                            "Effect": "Allow",
                            "Resource": {"Fn::GetAtt": [logical_id(key), "Arn"]},
                        }
                    ]
                )
            },
        },
    )


def test_the_role_trusts_only_this_state_machine_and_account():
    """CDK's role trusts states.amazonaws.com for any state machine of the account (aws:SourceArn
    ``stateMachine:*``); the workflow's trusts only its own ARN and its versions and aliases (``<ARN>:*``)."""
    workflow, template, _ = _with_key()
    name = Names.unique_resource_name(workflow, max_length=80)
    role = template.find_resources("AWS::IAM::Role")[logical_id(workflow.state_machine.role)]
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"] == [
        {
            "Action": "sts:AssumeRole",
            "Condition": {
                "ArnLike": {"aws:SourceArn": [_machine_arn(name), _machine_arn(f"{name}:*")]},
                "StringEquals": {"aws:SourceAccount": "123456789012"},
            },
            "Effect": "Allow",
            "Principal": {"Service": "states.amazonaws.com"},
        }
    ]


def _variants() -> dict[str, dict]:
    return {
        "plain": {},
        "key, notifications and trigger": {
            "key": True,
            "notifications": True,
            "event_pattern": events.EventPattern(source=["x"]),
        },
        "named, imported key": {
            "state_machine_name": "orders",
            "imported_key": "arn:aws:kms:us-west-2:123456789012:key/11111111-2222-3333-4444-555555555555",
        },
    }


@pytest.mark.parametrize("variant", list(_variants()))
def test_every_iam_reference_to_a_state_machine_names_this_workflows(variant):
    """Every Resource and Condition value of every policy statement in the template (roles' trust and policies,
    key and topic policies) that names a state machine names this workflow's: by reference, or by the ARN of its
    physical name; never an empty name, another name or a pattern over names."""
    props = dict(_variants()[variant])
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    if props.pop("key", False):
        props["encryption_key"] = kms.Key(stack, "Key", enable_key_rotation=True)
    if "imported_key" in props:
        props["encryption_key"] = kms.Key.from_key_arn(stack, "Key", props.pop("imported_key"))
    workflow = build_workflow(app, **props)
    template = Template.from_stack(stack).to_json()
    references = state_machine_references(template)
    ours = names_only_this_state_machine(template, logical_id(workflow.state_machine))
    assert [r for r in references if not ours(r[2])] == []
    where = {w.split("/Statement[")[0] + " " + w.rsplit("/", 1)[1] for _, w, _ in references}
    assert "/AssumeRolePolicyDocument aws:SourceArn" in where  # the check looked at the trust
    if "encryption_key" in props:
        assert f"/PolicyDocument {KEY_CONTEXT}" in where  # and at the key condition


def test_the_reference_check_flags_cdks_condition_without_a_name():
    """The check can fail: a CDK state machine with a customer managed key and no name gets the condition
    ``arn:...:stateMachine:`` (no name), and its role trusts ``stateMachine:*``; both are flagged."""
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=DEFAULT_ENV)
    machine = sfn.StateMachine(
        stack,
        "Machine",
        definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "Pass")),
        encryption_configuration=sfn.CustomerManagedEncryptionConfiguration(kms.Key(stack, "Key")),
    )
    template = Template.from_stack(stack).to_json()
    ours = names_only_this_state_machine(template, logical_id(machine))
    flagged = sorted(text for _, _, text in state_machine_references(template) if not ours(text))
    assert flagged == [
        "arn:<AWS::Partition>:states:us-west-2:123456789012:stateMachine:",
        "arn:<AWS::Partition>:states:us-west-2:123456789012:stateMachine:*",
    ]
