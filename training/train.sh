#!/bin/sh
# SageMaker entry point (POSIX sh: the DLC's /bin/sh is dash). Starts the FSDP2 trainer under torchrun.
#
# The SageMaker training toolkit runs `./train.sh --batch_size 8 --num_layers 10 ...` (hyperparameters as
# arguments, sorted by key, values str()-ed: "true" arrives as True). They are forwarded unchanged to the trainer,
# which accepts --snake_case and --kebab-case. SM_HP_* variables are NOT used: dash drops hyphenated ones.
#
#   train.sh --help                 usage and every trainer option (torchrun is not started)
#   NPROC_PER_NODE=2 train.sh ...   processes per node when there is no GPU (default 1, gloo on CPU)
#   MASTER_PORT=29500               multi-node rendezvous port on the master (the first host in SM_HOSTS);
#                                   one node runs torchrun --standalone (a free local port)
#   train.sh --tune_trials ... ...  a tuning job: runs the tuning driver (python -m training.tune), which runs
#                                   each trial as a fresh `train.sh` with TRAINER_MODULE=training.tune.trial
#   TRAINER_MODULE                  what torchrun starts: training.trainer (default) or training.tune.trial
set -eu

# Package root: next to this script in the container (/opt/ml/code/train.sh, /opt/ml/code/training/),
# or the parent of this script's folder in the repository (training/train.sh).
script_dir=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd)
if [ -d "$script_dir/training/trainer" ]; then
    package_root=$script_dir
else
    package_root=$(dirname -- "$script_dir")
fi
export PYTHONPATH="$package_root${PYTHONPATH:+:$PYTHONPATH}"
python=${PYTHON:-python3}

for arg in "$@"; do
    case $arg in
        -h | --help)
            cat <<'USAGE'
Usage: train.sh [--setting value ...]
Runs `python -m training.trainer` under torchrun on every GPU of this node (or NPROC_PER_NODE CPU
processes when there is none), across the hosts in SM_HOSTS. The trainer's options follow.

USAGE
            exec "$python" -m training.trainer --help
            ;;
        --tune_trials | --tune-trials)
            exec "$python" -m training.tune "$@"
            ;;
    esac
done
module=${TRAINER_MODULE:-training.trainer}
case $module in
    training.trainer | training.tune.trial) ;;
    *)
        echo "train.sh: TRAINER_MODULE must be training.trainer or training.tune.trial; got $module" >&2
        exit 2
        ;;
esac

gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [ "${gpus:-0}" -gt 0 ]; then
    nproc=$gpus
else
    nproc=${NPROC_PER_NODE:-1}
fi

# Multi-node layout from SageMaker's SM_HOSTS (JSON list) and SM_CURRENT_HOST.
hosts=${SM_HOSTS:-'["localhost"]'}
current=${SM_CURRENT_HOST:-localhost}
layout=$("$python" -c 'import json, sys
hosts = json.loads(sys.argv[1]) or ["localhost"]
rank = hosts.index(sys.argv[2]) if sys.argv[2] in hosts else 0
print(len(hosts), rank, hosts[0])' "$hosts" "$current")
nnodes=${layout%% *}

# Fail fast, before torchrun, for the world size torchrun will start: a bad setting, a precision this machine
# cannot run, an unwritable output folder, missing, damaged or inconsistent data, too little data for one global
# batch, or a checkpoint of another model shape exits here with one `error:` line (status 2). In a SageMaker job the
# trainer also writes it to $SM_OUTPUT_DIR/failure, the job's FailureReason.
WORLD_SIZE=$((nnodes * nproc)) "$python" -m training.trainer --check-only "$@"

if [ "$nnodes" -eq 1 ]; then
    set -- --standalone --nproc-per-node="$nproc" -m "$module" "$@"
else
    set -- --nnodes="$nnodes" --node-rank="$(echo "$layout" | cut -d' ' -f2)" --master-addr="${layout##* }" \
        --master-port="${MASTER_PORT:-29500}" --nproc-per-node="$nproc" -m "$module" "$@"
fi

# torchrun, through training.trainer.launch: a refusal the workers can only make once they run together (a
# checkpoint that does not load, on_unusable_checkpoints=fail) exits 2 with their one `error:` line, where torchrun
# alone would exit 1 after its failure report; a failure during training exits 1 (docs/exit-status.md).
echo "train.sh: torchrun $*"
exec "$python" -m training.trainer.launch "$@"
