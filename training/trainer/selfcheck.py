"""Build-time check of the training image: ``python -m training.trainer.selfcheck [--expected-te-version X]``.

Runs without a GPU. Checks that Transformer Engine imports at the expected version, that the trainer modules, the
TensorBoard and MLflow packages, the tuning driver (with matplotlib) and the evaluation job (lm-eval and its loaders) import, and that every TE precision's recipe can be constructed; prints one
line per check and exits 1 with the reasons if any fails.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from types import ModuleType

from training.contract import hardware

EXPECTED_TE_VERSION = "2.11.0"
TRAINER_MODULES = (
    "training.trainer.config",
    "training.trainer.distributed.precision",
    "training.trainer.model.decoder",
    "training.trainer.distributed.parallel",
    "training.trainer.data.token_files",
    "training.trainer.checkpoint.manager",
    "training.trainer.checkpoint.s3",
    "training.trainer.observe.metrics",
    "training.trainer.loop",
    "training.trainer.observe.tracking",
    "training.trainer.model.rotary",
    "training.trainer.checkpoint.export_hf",
    "training.trainer.checkpoint.export_peft",
    "training.trainer.model.lora",
    "training.trainer.checkpoint.weights",
    "training.trainer.model.layout",
    "training.models.registry",
    "training.request.hf_config",
    "safetensors.torch",
)
TRACKING_MODULES = ("tensorboardX", "mlflow", "sagemaker_mlflow")
"""Imported only when a run asks for TensorBoard or MLflow (training/requirements.txt): checked here, at build."""
TUNE_MODULES = ("training.tune.driver", "training.tune.session", "training.tune.trial", "matplotlib.pyplot")
"""The tuning driver and what it imports (matplotlib for the report's charts): checked at build, not in a B200 job."""
EVALUATION_MODULES = (
    "training.evaluate.run",
    "training.evaluate.harness",
    "training.evaluate.model_folder",
    "lm_eval",
    "lm_eval.models.huggingface",
    "transformers",
    "datasets",
    "peft",
)
"""What an evaluation job imports (``training/evaluate/``, started by ``evaluate.sh``), and peft, which a LoRA run's
export imports (``training.trainer.checkpoint.export_peft``, after training): checked at build too."""


def run_checks(
    expected_te_version: str, import_module: Callable[[str], ModuleType] = importlib.import_module
) -> list[str]:
    """Every check's outcome as ``ok: ...`` or ``FAILED: ...`` lines."""
    results = []
    try:
        te = import_module("transformer_engine")
        version = getattr(te, "__version__", "unknown")
        if version == expected_te_version:
            results.append(f"ok: transformer_engine {version}")
        else:
            results.append(f"FAILED: transformer_engine is {version}; expected {expected_te_version}")
    except Exception as err:  # any failure to import is the finding
        results.append(f"FAILED: import transformer_engine: {type(err).__name__}: {err}")
    for name in (*TRAINER_MODULES, *TRACKING_MODULES, *TUNE_MODULES, *EVALUATION_MODULES):
        try:
            import_module(name)
            results.append(f"ok: import {name}")
        except Exception as err:
            results.append(f"FAILED: import {name}: {type(err).__name__}: {err}")
    try:
        precision = import_module("training.trainer.distributed.precision")
    except Exception:
        return results  # already reported above; the recipes cannot be checked without it
    for name in sorted(hardware.TE_PRECISIONS):
        for fp8_recipe in hardware.FP8_RECIPES if name == "fp8" else (None,):
            label = f"{name} ({fp8_recipe})" if fp8_recipe else name
            try:
                spec = precision.recipe_spec(name, fp8_recipe or "delayed")
                recipe_module = import_module(precision.TE_RECIPE_MODULE)
                recipe = precision.build_recipe(spec, recipe_module)
                results.append(f"ok: {label} recipe {type(recipe).__name__}")
            except Exception as err:
                results.append(f"FAILED: {label} recipe: {type(err).__name__}: {err}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expected-te-version", default=EXPECTED_TE_VERSION)
    args = parser.parse_args(argv)
    results = run_checks(args.expected_te_version)
    print("\n".join(results))
    failures = [line for line in results if line.startswith("FAILED")]
    if failures:
        print(f"selfcheck: {len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("selfcheck: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
