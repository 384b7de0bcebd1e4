#!/bin/sh
# SageMaker program of an evaluation job (POSIX sh: the DLC's /bin/sh is dash): the workflow sets
# SAGEMAKER_PROGRAM=evaluate.sh in the job's Environment, so the same image runs training (train.sh, the image's
# default) or evaluation. The toolkit runs `./evaluate.sh --tasks hellaswag,piqa --limit 100 ...` (the job's
# hyperparameters as arguments); they are forwarded to `python -m training.evaluate` (see training/evaluate/run.py).
#
#   evaluate.sh --help     every option
set -eu

script_dir=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
if [ -d "$script_dir/training/evaluate" ]; then
    package_root=$script_dir
else
    package_root=$(dirname -- "$script_dir")
fi
export PYTHONPATH="$package_root${PYTHONPATH:+:$PYTHONPATH}"
# Nothing from the Hugging Face Hub: the model and the tasks come from the job's channels.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "${PYTHON:-python3}" -m training.evaluate "$@"
