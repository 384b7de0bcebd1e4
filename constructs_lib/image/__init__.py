"""The training image: the ECR repository that holds it (``repository``) and its build in CodeBuild during
``cdk deploy`` (``build``: the construct, composing ``build_logs`` (key and log groups), ``project`` (source
asset, CodeBuild project, its permissions; ``buildspec``) and ``deploy_time`` (the custom resource that starts the
build and waits for it, with its Lambda ``handlers/``)).

Names are re-exported lazily (nothing is imported until used).
"""

from __future__ import annotations

from typing import Any

from constructs_lib._shared.lazy import lazy_attribute

_EXPORTS = {
    "TrainingImageBuild": ".build",
    "TrainingImageRepository": ".repository",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _EXPORTS, name)
