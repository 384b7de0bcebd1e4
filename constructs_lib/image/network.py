"""Where the training-image build and its deploy-time functions run: no VPC, or a VPC with its subnets and
security groups (one created, outbound only, when none are given)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from aws_cdk import aws_ec2 as ec2
from constructs import Construct


@dataclass(frozen=True)
class BuildNetwork:
    """The build's network: ``vpc`` None means no VPC (then ``subnets`` is None and ``security_groups`` empty)."""

    vpc: ec2.IVpc | None = None
    subnets: ec2.SubnetSelection | None = None
    security_groups: list[ec2.ISecurityGroup] = field(default_factory=list)


def build_network(
    scope: Construct,
    *,
    vpc: ec2.IVpc | None,
    subnets: ec2.SubnetSelection | None,
    security_groups: Sequence[ec2.ISecurityGroup] | None,
) -> BuildNetwork:
    """The checked network: ``subnets`` default to the private subnets with egress, and without
    ``security_groups`` one is created in ``scope`` (``SecurityGroup``, outbound only)."""
    if vpc is None and (subnets is not None or security_groups is not None):
        raise ValueError("TrainingImageBuild: subnets and security_groups need vpc")
    if vpc is None:
        return BuildNetwork()
    groups: list[ec2.ISecurityGroup] = list(security_groups or [])
    if not groups:
        groups = [
            ec2.SecurityGroup(
                scope,
                "SecurityGroup",
                vpc=vpc,
                description="Training-image build and its deploy-time functions: outbound to AWS APIs only",
                allow_all_outbound=True,
            )
        ]
    return BuildNetwork(
        vpc=vpc,
        subnets=subnets or ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        security_groups=groups,
    )
