"""cdk.json context settings: defaults, parsing, and a clear error per bad key."""

from __future__ import annotations

import aws_cdk as cdk
import pytest

from constructs_lib.config import StackSettings


def _settings(**context) -> StackSettings:
    return StackSettings.from_context(cdk.App(context=context).node)


def test_defaults():
    settings = _settings()
    assert settings.stack_name == "BlackwellTraining"
    assert settings.removal_policy == cdk.RemovalPolicy.RETAIN
    assert settings.use_kms is False and settings.kms_key_arn is None and settings.vpc_id is None


def test_values_are_parsed():
    arn = "arn:aws:kms:us-west-2:123456789012:key/12345678-1234-1234-1234-123456789012"
    settings = _settings(
        removalPolicy="DESTROY", kmsKeyArn=arn, vpcId="vpc-0123456789abcdef0", region="eu-west-1"
    )
    assert settings.removal_policy == cdk.RemovalPolicy.DESTROY
    assert settings.use_kms is True and settings.kms_key_arn == arn
    assert settings.vpc_id == "vpc-0123456789abcdef0" and settings.region == "eu-west-1"
    assert _settings(useKms="true").use_kms is True  # -c useKms=true arrives as a string


@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"removalPolicy": "snapshot"}, "context removalPolicy: must be retain or destroy"),
        ({"useKms": "yes"}, "context useKms: must be true or false"),
        ({"kmsKeyArn": "alias/mine"}, "context kmsKeyArn: must be a KMS key ARN"),
        ({"vpcId": "my-vpc"}, "context vpcId: must look like vpc-"),
        ({"region": "mars-1"}, "context region: must be an AWS region name"),
        ({"stackName": "1bad name"}, "context stackName: must match"),
    ],
)
def test_bad_context_names_the_key(context, message):
    with pytest.raises(ValueError, match=message):
        _settings(**context)


def test_data_sources():
    assert _settings().workflow.data_sources == ("data/",)
    sources = ["data/", "s3://corpora/tokens/"]
    assert _settings(dataSources=sources).workflow.data_sources == tuple(sources)
    assert _settings(dataSources='["s3://corpora/tokens/"]').workflow.data_sources == (
        "s3://corpora/tokens/",
    )
    with pytest.raises(ValueError, match="context dataSources: must be a list of S3 prefixes ending in '/'"):
        _settings(dataSources=["s3://corpora/tokens"])
