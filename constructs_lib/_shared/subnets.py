"""One helper shared by the constructs that place resources in a VPC: a ``SubnetSelection`` as keyword arguments.

``IVpc.select_subnets`` takes the selection's fields as keywords, and jsii structs cannot be splatted directly.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_ec2 as ec2

_FIELDS = (
    "availability_zones",
    "one_per_az",
    "subnet_filters",
    "subnet_group_name",
    "subnet_type",
    "subnets",
)


def subnet_selection_kwargs(selection: ec2.SubnetSelection | None) -> dict[str, Any]:
    """The fields of ``selection`` that are set, for ``vpc.select_subnets(**...)``; {} for None."""
    return {key: getattr(selection, key) for key in _FIELDS if getattr(selection, key, None) is not None}
