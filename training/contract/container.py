"""The fixed names inside the training container: its paths, input channels, file and folder names,
entry points and environment variables, shared by the workflow that launches a job and the code that runs in it.

Part of the contract between the infrastructure (``constructs_lib``) and the trainer: standard library only.
"""

from __future__ import annotations

import re

CONTAINER_CODE_DIR = "/opt/ml/code"
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
MODEL_DIR = "/opt/ml/model"
TRAIN_CHANNEL = "train"
RESUME_CHANNEL = "resume"
"""Read-only input channel with one complete checkpoint of an earlier run (the workflow's ``resume_from``)."""
WEIGHTS_CHANNEL = "weights"
"""Read-only input channel with the Hugging Face model folder the run starts from (the workflow's ``init_from``,
an S3 prefix; the trainer's ``init_from`` is then ``SM_CHANNEL_WEIGHTS``, ``/opt/ml/input/data/weights``)."""
WEIGHTS_CHANNEL_DIR = f"/opt/ml/input/data/{WEIGHTS_CHANNEL}"
DATA_METADATA_FILE = "metadata.json"
"""Written by ``training.prepare`` next to the token files (token dtype, vocabulary size, tokenizer, token
counts, the files of each split); the request check reads exactly this name to learn a run's tokenizer."""
INIT_FROM_TRAVELLING_FILES: tuple[str, ...] = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
)
"""Files of an ``init_from`` model folder that travel to the run's Hugging Face export (``training.trainer.checkpoint.export_hf``:
its tokenizer and generation settings). When any but ``generation_config.json`` is there, the export's tokenizer is
the folder's (not the data's)."""
INIT_FROM_TOKENIZERS: tuple[str, ...] = ("tokenizer.json", "tokenizer.model")
"""Of those, the files that make a tokenizer ``AutoTokenizer`` can load (a fast tokenizer, or SentencePiece)."""
ENTRY_POINT = "train.sh"
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
"""Where the trainer writes TensorBoard event files in a job: the workflow's ``TensorBoardOutputConfig.LocalPath``
(SageMaker syncs that folder to its ``S3OutputPath`` during training). Also the API's default LocalPath."""
TENSORBOARD_CONFIG_FILE = "/opt/ml/input/config/tensorboardoutputconfig.json"
"""Written by SageMaker into the container when the job has a ``TensorBoardOutputConfig``."""

# MLflow (SageMaker managed MLflow through the sagemaker-mlflow plugin): the workflow sets these variables in the
# job's environment when a tracking server is configured; the trainer logs only when the first one is set.
MLFLOW_TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"
"""The tracking server's ARN (``arn:aws:sagemaker:...:mlflow-tracking-server/NAME``), or any MLflow URI."""
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
"""The experiment: the workflow (state machine) name."""
MLFLOW_RUN_NAME_ENV = "BLACKWELL_MLFLOW_RUN_NAME"
"""The run: the Step Functions execution name, the same for every launch of that execution."""

OUTPUT_DIR = "/opt/ml/output"
"""SageMaker's output folder; a ``failure`` file written there becomes the job's ``FailureReason`` (first 1024
characters). The toolkit passes it to the entry point as ``SM_OUTPUT_DIR``."""
FAILURE_FILE = "failure"

CHECKPOINT_DIR_NAME = re.compile(r"^step_(\d{8})(?:-([2-9]|[1-9][0-9]+))?$")
"""A checkpoint folder: ``step_00000100``, or ``step_00000100-2`` (-3, ...) when a run reached a step whose folder
name was already taken (an incomplete folder it must leave as it is). Of two folders of one step the higher number
is the newer. Suffixed names (``.tmp``, ``.unusable``) are never checkpoints to load."""

SET_ASIDE_SUFFIX = ".unusable"
"""A checkpoint folder the trainer found damaged is set aside by a small file beside it, ``step_00000100.unusable``
(JSON: why, which job), never by moving it: under SageMaker ``/opt/ml/checkpoints`` is mirrored to S3 and a local
rename is a deletion of the S3 prefix plus a full re-upload. A folder with that file is never loaded, counted by
``keep_checkpoints``, written into or deleted, and ``resume_from`` never picks it."""

CHECKPOINT_BACKENDS: tuple[str, ...] = ("auto", "s3", "folder")
"""``checkpoint_backend``: where a run keeps its checkpoints. ``s3``: every rank writes its own shards straight to
the run's S3 prefix and reads back only the byte ranges it needs (s3torchconnector); ``folder``: ``checkpoint_dir``
on each node's disk (in a job ``/opt/ml/checkpoints``, which SageMaker's ``CheckpointConfig`` copies to the run's S3
prefix, and back to every instance when a job starts); ``auto``: :func:`job_checkpoint_backend` for a workflow's job,
and for the trainer itself the scheme of ``checkpoint_dir`` (an ``s3://`` URI is S3 direct)."""
S3_SCHEME = "s3://"
S3_CHECKPOINT_ACTIONS: dict[str, tuple[str, ...]] = {
    "s3:ListBucket": ("ListObjectsV2: a run's prefix listed (the bucket, conditioned on the prefix)",),
    "s3:GetObject": (
        "GetObject, ranged too (markers, receipts, trainer states, shards verified and read)",
        "HeadObject (the connector's existence check)",
        "CopyObject's source (DCP's rename of .metadata.tmp)",
    ),
    "s3:PutObject": (
        "PutObject with If-None-Match (every control object and trainer state, created only when absent)",
        "CreateMultipartUpload, UploadPart, CompleteMultipartUpload (each rank's shards)",
        "CopyObject's target (DCP's rename of .metadata.tmp)",
    ),
    "s3:AbortMultipartUpload": ("AbortMultipartUpload (the connector's clean-up of a failed upload)",),
    "s3:DeleteObject": ("DeleteObject, DeleteObjects (pruning by keep_checkpoints; the rename's source)",),
}
"""The IAM actions an S3-direct run's execution role needs on its prefix, and the S3 calls each covers (read in
the trainer's ``checkpoint/s3_store.py`` and s3torchconnector 1.5.0's ``S3FileSystem``); the execution role grants
exactly these under the bucket's checkpoint prefix (``tests/constructs/identity/test_execution_role.py``)."""


def job_checkpoint_backend(setting: str, instance_count: int, tuning: bool = False) -> str:
    """The backend a workflow's job uses for ``checkpoint_backend`` = ``setting``: ``auto`` is S3 direct on several
    instances (no instance downloads the whole prefix before it starts, and every node's shards reach S3 from
    their own rank) and the folder on one instance (where both resume alike and SageMaker's copy needs no request
    from the trainer); a tuning run keeps its report in the folder, so the folder."""
    if setting != "auto":
        return setting
    return "s3" if instance_count > 1 and not tuning else "folder"


UNUSABLE_CHECKPOINT_ACTIONS: tuple[str, ...] = ("restart", "fail")
"""``on_unusable_checkpoints``: what the trainer does when ``checkpoint_dir`` holds checkpoints and none is usable."""
HF_EXPORT_DIR = "hf"
"""The Hugging Face folder (of the model family's class) a finished run writes into ``MODEL_DIR`` (so into the job's
``model.tar.gz``), next to ``model.pt`` (``training.trainer.checkpoint.export_hf``); the workflow's summary names it."""
PEFT_EXPORT_DIR = "adapter"
"""The PEFT LoRA adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) a finished LoRA run
(``lora_rank`` > 0) writes next to ``model.pt`` and the merged ``hf/`` folder (``training.trainer.checkpoint.export_peft``)."""


PROGRAM_ENV = "SAGEMAKER_PROGRAM"
"""The variable that names the job's program to the SageMaker toolkit; a job's ``Environment`` overrides the
image's own (``ENTRY_POINT``), which is how one image runs both kinds of job."""
EVALUATE_ENTRY_POINT = "evaluate.sh"
"""The evaluation job's program (``training/evaluate.sh``): ``python -m training.evaluate`` with its settings."""
MODEL_CHANNEL = "model"
"""Read-only channel of an evaluation job: the evaluated training job's ``model.tar.gz`` (its ``hf/`` folder)."""


TASKS_CHANNEL = "tasks"
"""Read-only channel of an evaluation job: the task folder (lm-eval task YAML files and their local data)."""
