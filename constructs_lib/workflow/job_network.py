"""Where the jobs run on the network: the ``VpcConfig`` of the workflow's jobs in a VPC, and the security group that
lets one job's nodes talk to each other (NCCL, EFA) when none is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Names
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from constructs_lib._shared.nag import NIST_800_53_R5, acknowledge
from constructs_lib._shared.subnets import subnet_selection_kwargs


def vpc_config(
    scope: Construct,
    vpc: ec2.IVpc | None,
    subnets: ec2.SubnetSelection | None,
    security_groups: Sequence[ec2.ISecurityGroup] | None,
) -> tuple[list[ec2.ISecurityGroup], dict[str, Any] | None]:
    """The jobs' security groups and ``VpcConfig`` (None without ``vpc``); creates the nodes' security group in
    ``scope`` (the workflow) if none given."""
    groups: list[ec2.ISecurityGroup] = list(security_groups or [])
    config: dict[str, Any] | None = None
    if vpc is not None:
        if not groups:
            group = ec2.SecurityGroup(
                scope,
                "JobSecurityGroup",
                vpc=vpc,
                description="Training job nodes: talk to each other (NCCL/EFA) and out to AWS APIs",
                allow_all_outbound=True,
            )
            group.add_ingress_rule(group, ec2.Port.all_traffic(), "Training nodes talk to each other")
            acknowledge(
                group.node.find_child(f"from {Names.unique_id(group)}:ALL TRAFFIC"),
                "EC2RestrictedCommonPorts",
                "NCCL and EFA between the nodes of one job use ports chosen at run time; all traffic is "
                "allowed only from this same security group (the job's own nodes), never from an address.",
                pack=NIST_800_53_R5,
            )
            groups = [group]
        config = {
            "SecurityGroupIds": [g.security_group_id for g in groups],
            "Subnets": vpc.select_subnets(
                **(
                    {"subnet_type": ec2.SubnetType.PRIVATE_WITH_EGRESS}
                    if subnets is None
                    else subnet_selection_kwargs(subnets)
                )
            ).subnet_ids,
        }
    return groups, config
