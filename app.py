#!/usr/bin/env python3
"""The deployable app: one ``BlackwellTrainingStack``, checked by cdk-nag's AwsSolutions, NIST 800-53 R5 and
Serverless rule packs (an unacknowledged finding fails synthesis).

Settings come from ``cdk.json`` context (override with ``cdk deploy -c key=value``); every key is in docs/reference.md. A wrong setting
stops synthesis with one line naming the key, and a non-zero exit.
"""

from __future__ import annotations

import os
import sys

import aws_cdk as cdk

from constructs_lib._shared.nag import nag_packs
from constructs_lib.config import StackSettings, check_vpc_lookup
from constructs_lib.stack import BlackwellTrainingStack


def add_stacks(app: cdk.App) -> list[cdk.Stack]:
    """Add the app's stack(s) to ``app``, configured from its context."""
    default_region = os.environ.get("CDK_DEFAULT_REGION")
    settings = StackSettings.from_context(app.node, default_region=default_region)
    account = os.environ.get("CDK_DEFAULT_ACCOUNT")
    region = settings.region or default_region
    check_vpc_lookup(settings.vpc_id, account, region)
    env = cdk.Environment(account=account, region=region) if (account or region) else None
    return [BlackwellTrainingStack(app, settings.stack_name, env=env, **settings.stack_kwargs())]


def build_app() -> cdk.App:
    """The app as ``cdk synth`` runs it: stacks plus the cdk-nag packs (a finding fails synthesis)."""
    app = cdk.App()
    add_stacks(app)
    cdk.Validations.of(app).add_plugins(*nag_packs())
    return app


def main() -> None:
    """Synthesize; a bad setting (``ValueError``: a context key or a construct prop it feeds) exits with one line."""
    try:
        app = build_app()
    except ValueError as error:
        sys.exit(f"error: {error}")
    app.synth()


if __name__ == "__main__":
    main()
