#!/bin/sh
# SageMaker entry point (POSIX sh: the DLC's /bin/sh is dash). Starts the FSDP2 trainer under torchrun.
#
# The SageMaker training toolkit runs `./train.sh --batch_size 8 --num_layers 10 ...` (hyperparameters as
# arguments, sorted by key, values str()-ed: "true" arrives as True). They are forwarded unchanged to the trainer,
# which accepts --snake_case and --kebab-case. SM_HP_* variables are NOT used: dash drops hyphenated ones.
#
#   train.sh --help                 usage and every trainer option (torchrun is not started)
#   NPROC_PER_NODE=2 train.sh ...   processes per node when there is no GPU (default 1, gloo on CPU)
#   MASTER_PORT=29500               several hosts: torchrun's rendezvous port on the first host of SageMaker's
#                                   resourceconfig.json (the roll call before it: this port + 1); one host runs
#                                   torchrun --standalone (a free local port)
#   HOST_JOIN_TIMEOUT=600           seconds a host waits for every host name to resolve, for every host to
#                                   answer the roll call, and (each worker) for every host's workers to meet;
#                                   then one error line names the host, exit 1 (above 0, at most 86400)
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
processes when there is none), across the hosts of SageMaker's resourceconfig.json. The trainer's options
follow.

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

# The hosts: SageMaker's resourceconfig.json ($SAGEMAKER_BASE_DIR or /opt/ml, input/config/); one without it.
nnodes=$("$python" -m training.trainer.distributed.cluster --count)

# Fail fast, before torchrun, for the world size torchrun will start: a bad setting, a precision this machine
# cannot run, an unwritable output folder, missing, damaged or inconsistent data, too little data for one global
# batch, or a checkpoint of another model shape exits here with one `error:` line (status 2). In a SageMaker job the
# trainer also writes it to $SM_OUTPUT_DIR/failure, the job's FailureReason.
WORLD_SIZE=$((nnodes * nproc)) LOCAL_WORLD_SIZE=$nproc "$python" -m training.trainer --check-only "$@"

# torchrun, through training.trainer.distributed.launch: it adds the node options from resourceconfig.json (--standalone on
# one host; on several, once every host resolves and answers the roll call at the first host: a static rendezvous
# there, node ranks in the file's order), logs the network stack, and warns of every stale EFA variable set. A
# refusal the workers can only make once they run together (a checkpoint that does not load,
# on_unusable_checkpoints=fail) exits 2 with their one `error:` line, where torchrun alone would exit 1 after its
# failure report; a failure during training exits 1 (docs/exit-status.md), as does a host that never joins.
exec "$python" -m training.trainer.distributed.launch --nproc-per-node="$nproc" -m "$module" "$@"
