#!/usr/bin/env python3
"""The deployable app: one ``BlackwellTrainingStack``, checked by cdk-nag's AwsSolutions rules.

Settings come from ``cdk.json`` context (override with ``cdk deploy -c key=value``); see README.md.
"""

from __future__ import annotations

import os

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from constructs_lib.config import StackSettings
from constructs_lib.stack import BlackwellTrainingStack


def add_stacks(app: cdk.App) -> list[cdk.Stack]:
    """Add the app's stack(s) to ``app``, configured from its context."""
    settings = StackSettings.from_context(app.node)
    account = os.environ.get("CDK_DEFAULT_ACCOUNT")
    region = settings.region or os.environ.get("CDK_DEFAULT_REGION")
    env = cdk.Environment(account=account, region=region) if (account or region) else None
    return [BlackwellTrainingStack(app, settings.stack_name, env=env, **settings.stack_kwargs())]


def build_app() -> cdk.App:
    """The app as ``cdk synth`` runs it: stacks plus the AwsSolutions checks (a finding fails synthesis)."""
    app = cdk.App()
    add_stacks(app)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks())
    return app


if __name__ == "__main__":
    build_app().synth()
