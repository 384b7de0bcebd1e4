"""Synthesis helpers shared by the construct and workflow tests.

``synth_with_nag`` runs the real cdk-nag packs (AwsSolutions, NIST 800-53 R5, Serverless) the way ``app.py`` does
and returns what they found (violations that were not acknowledged), read from CDK's ``validation-report.json``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import assertions
from cdk_nag import NagPack

from constructs_lib._shared.nag import nag_packs

DEFAULT_ENV = cdk.Environment(account="123456789012", region="us-west-2")


@dataclass(frozen=True)
class NagResult:
    """Unacknowledged findings of every pack: (rule with evidence, construct path)."""

    violations: tuple[tuple[str, str], ...]
    templates: dict[str, dict[str, Any]]

    def rules(self) -> set[str]:
        return {rule for rule, _ in self.violations}


def synth_with_nag(build: Callable[[cdk.App], None], packs: list[NagPack] | None = None) -> NagResult:
    """Build an app with ``build(app)``, register ``packs`` (default: the app's, ``nag_packs()``), synthesize,
    and collect findings."""
    outdir = tempfile.mkdtemp(prefix="nag-")
    app = cdk.App(outdir=outdir)
    build(app)
    cdk.Validations.of(app).add_plugins(*(packs if packs is not None else nag_packs()))
    try:
        app.synth()
    except Exception as error:  # jsii raises a generic error whose text says "Validation failed"
        if "ValidationFailed" not in str(error) and "Validation failed" not in str(error):
            raise
    report_path = Path(outdir) / "validation-report.json"
    violations: list[tuple[str, str]] = []
    if report_path.exists():
        report = json.loads(report_path.read_text())
        for plugin in report["pluginReports"]:
            for violation in plugin["violations"]:
                for construct in violation["violatingConstructs"]:
                    violations.append((violation["ruleName"], construct["constructPath"]))
    templates = {p.name: json.loads(p.read_text()) for p in Path(outdir).glob("*.template.json")}
    return NagResult(tuple(violations), templates)


def template_of(
    build: Callable[[cdk.Stack], None], env: cdk.Environment = DEFAULT_ENV
) -> assertions.Template:
    """A Template of one fresh stack built by ``build(stack)`` (no cdk-nag)."""
    app = cdk.App()
    stack = cdk.Stack(app, "Test", env=env)
    build(stack)
    return assertions.Template.from_stack(stack)


def statements(template: assertions.Template) -> list[dict[str, Any]]:
    """Every statement of every IAM policy (inline AWS::IAM::Policy and role inline policies) in the template."""
    found: list[dict[str, Any]] = []
    for resource in template.find_resources("AWS::IAM::Policy").values():
        found.extend(resource["Properties"]["PolicyDocument"]["Statement"])
    for resource in template.find_resources("AWS::IAM::Role").values():
        for policy in resource["Properties"].get("Policies", []):
            found.extend(policy["PolicyDocument"]["Statement"])
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
