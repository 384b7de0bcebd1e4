#!/bin/sh
# Container entry point (PID 1): run the DLC's own entry point, and turn SageMaker's stop signal into a
# checkpoint.
#
# SageMaker stops a job (StopTrainingJob, managed-spot reclaim) by sending SIGTERM to the container's PID 1 and
# SIGKILL about 120 s later. In the DLC, PID 1 is `bash -m start_with_right_hostname.sh`; PID 1 ignores signals it
# has no handler for, and neither it nor the SageMaker toolkit forwards anything, so the trainer would never
# learn it should checkpoint. This script stays PID 1, runs the command given to it as a child, and on SIGTERM
# signals the trainer's worker processes directly: each registers its PID as a file in $TRAINER_PID_DIR. torchrun
# is deliberately not signalled: its own shutdown kills the workers after 30 s, too soon for a large checkpoint.
# The workers save at the next step boundary and exit 0; this script then exits with the child's status.
#
# Exit status: the child's, except for a refusal before training. The sagemaker-training toolkit exits 1 whenever
# train.sh fails (its ExecuteUserScriptError), so the trainer's status 2 would be lost; a refusing trainer records
# its reason in $TRAINER_REFUSAL_FILE, and when the child fails with that file present this script exits 2
# (docs/exit-status.md).
set -u
TRAINER_PID_DIR=${TRAINER_PID_DIR:-/tmp/trainer-pids}
TRAINER_REFUSAL_FILE=${TRAINER_REFUSAL_FILE:-/tmp/trainer-refusal}
export TRAINER_PID_DIR TRAINER_REFUSAL_FILE
mkdir -p "$TRAINER_PID_DIR"
rm -f "$TRAINER_REFUSAL_FILE"

forward() {
    echo "entrypoint: $1 received, asking the trainer to checkpoint and stop" >&2
    for file in "$TRAINER_PID_DIR"/*; do
        [ -f "$file" ] && kill -TERM "${file##*/}" 2>/dev/null
    done
}
trap 'forward SIGTERM' TERM
trap 'forward SIGINT' INT

"$@" &
child=$!
while :; do
    wait "$child"
    status=$?
    # A trapped signal interrupts `wait` (status > 128) while the child still runs: wait again.
    kill -0 "$child" 2>/dev/null && continue
    if [ "$status" -ne 0 ] && [ -f "$TRAINER_REFUSAL_FILE" ]; then
        exit 2
    fi
    exit "$status"
done
