"""What the request's decision reads beyond the input, and only there: the ``init_from`` model folder's config.json,
conversation data's metadata.json with that model's chat template and tokenizer files, the stored tuning
measurements, and before a launch the data prefix (it must hold an object), the training plan
``training_plan_arn`` names (it must hold the job's instances) and the checkpoints of the run ``resume_from`` names
(an evaluation's task folder, tokenizer and training job: ``evaluate_block``).

:class:`Reads` says what one caller lets the decision read: nothing or local copies of the folders (the CLI
offline), the model folder and the measurements (the CLI's plan with the deployed rules), or everything before a
launch (the workflow's Lambda, the CLI's submit and the SDK path). The clients are passed in (boto3 is the caller's: the Lambda makes its own).

Pure Python (standard library and ``training.request`` only); part of the request check's Lambda asset.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.contract import checkpoint_identity, token_data
from training.contract.container import CHECKPOINT_DIR_NAME, DATA_METADATA_FILE, SET_ASIDE_SUFFIX
from training.contract.settings_table import ContractError
from training.contract.tuning import TUNE_RECORDS_FILE
from training.plan import measured
from training.request import data_manifest as manifest
from training.request import hf_config, read_limits, sft_data
from training.request.fields import show
from training.request.rules import CHECKPOINT_MARKER, RequestRules
from training.request.sft_data import ChatData

MAX_RECORD_FILES = 100
"""At most this many tuning runs' record files (the newest) are read per request (the Lambda has 30 seconds)."""


@dataclass(frozen=True)
class TrainData:
    """What the decision read of ``train_data_uri``'s folder (:meth:`Reads.train_data`): its conversations
    (``chat``: ``kind: chat``, with what does not match ``init_from``), and ``token_dtype``, the dtype its ``.bin``
    token files were written in as its metadata.json records it (None: no metadata.json, none recorded, or no
    ``.bin`` file: the trainer's setting decides alone)."""

    chat: ChatData | None = None
    token_dtype: str | None = None


def dtype_problems(meta: Mapping[str, Any]) -> list[str]:
    """A token-data ``metadata.json`` (not conversations) whose recorded ``token_dtype`` the trainer cannot read its
    tokens in (each as ``sft_data.meta_problems`` says it)."""
    if "token_dtype" not in meta or meta["token_dtype"] in token_data.TOKEN_DTYPES:
        return []
    return [
        f"token_dtype: must be one of {', '.join(token_data.TOKEN_DTYPES)} (the integer types the trainer reads); "
        f"got {json.dumps(meta['token_dtype'])[:80]}"
    ]


def unlabelled_conversations(data_uri: str, listing: Mapping[str, int]) -> list[str]:
    """A folder holding conversation data's masks or example boundaries (``prepare``'s ``<split>.mask`` and
    ``<split>.docs``) but no metadata.json: the trainer would read its token files as plain text."""
    suffixes = tuple(suffix for key, suffix in sft_data.SPLIT_FILES.items() if key != "files")
    found = sorted(name for name in listing if name.endswith(suffixes))
    if not found:
        return []
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    return [
        f"train_data_uri: {data_uri} holds {shown} (conversation data as prepare writes it) but no "
        f"{DATA_METADATA_FILE}: without it the trainer would read its token files as plain text, training every "
        "token (the user turns too) and ignoring the masks and the examples' boundaries; upload the "
        f"{DATA_METADATA_FILE} prepare wrote with them"
    ]


class Reads:
    """What the decision may read. ``s3``: a boto3 S3 client (None: no S3 read; the ``init_from`` folder's shape is
    not known then, and the checks and the plan that need it wait for a read); ``sagemaker``: a SageMaker client (the
    training plan, an evaluation-only request's training job); ``architecture``: the ``init_from`` model's settings when the caller
    has them; ``measurements``: the stored tuning records when the caller has them (None: read with ``s3``);
    ``before_launch``: also the checks only a launch needs (the data prefix, ``resume_from``, the evaluation);
    ``local_init_from``, ``local_train_data``: local copies of the ``init_from`` and ``train_data_uri`` folders,
    read in their place (the CLI's offline ``validate`` and ``plan``: ``--init-from DIR``, ``--data-folder DIR``)."""

    def __init__(
        self,
        s3: Any = None,
        sagemaker: Any = None,
        *,
        architecture: Mapping[str, Any] | None = None,
        measurements: Sequence[Mapping[str, Any]] | None = None,
        before_launch: bool = False,
        local_init_from: str | Path | None = None,
        local_train_data: str | Path | None = None,
    ) -> None:
        self.s3, self.sagemaker, self.before_launch = s3, sagemaker, before_launch
        self._architecture = architecture
        self.local_init_from = None if local_init_from is None else Path(local_init_from)
        self.local_train_data = None if local_train_data is None else Path(local_train_data)
        self._measurements: list[Mapping[str, Any]] | None = (
            None if measurements is None else list(measurements)
        )

    def init_from(self, uri: str | None) -> tuple[Mapping[str, Any] | None, list[str]]:
        """The settings of the ``init_from`` folder ``uri``'s config.json (:func:`read_init_from`), or the problem of
        that folder; ``(None, [])`` without a folder or without S3 (the caller's, when it gave them)."""
        if self._architecture is not None:
            return self._architecture, []
        if self.local_init_from is not None and uri is not None:
            return read_local_init_from(self.local_init_from)
        if self.s3 is None or uri is None:
            return None, []
        return read_init_from(self.s3, uri)

    @property
    def knows_measurements(self) -> bool:
        """Whether the stored tuning measurements are known (given, or read with S3)."""
        return self._measurements is not None or self.s3 is not None

    @property
    def reads_train_data(self) -> bool:
        """Whether the ``train_data_uri`` folder can be read here (S3, or its local copy)."""
        return self.local_train_data is not None or self.s3 is not None

    def folder_listing(self, uri: str, copy: Path | None) -> dict[str, int]:
        """The objects directly in the folder ``uri`` (name -> size), from its local ``copy`` or S3 (one listing of
        the folder's own level, ``Delimiter`` ``/``)."""
        if copy is not None:
            return {path.name: path.stat().st_size for path in copy.iterdir() if path.is_file()}
        bucket, _, prefix = uri[5:].partition("/")
        sizes: dict[str, int] = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, Delimiter="/"
        ):
            sizes.update(
                {item["Key"][len(prefix) :]: item.get("Size", 0) for item in page.get("Contents", [])}
            )
        return sizes

    def folder_files(
        self, uri: str, names: Sequence[str], copy: Path | None, listing: Mapping[str, int] | None = None
    ) -> dict[str, read_limits.FileContent]:
        """The objects named ``names`` directly in the folder ``uri`` that exist (name -> content), from its local
        ``copy`` or S3 (its ``listing``, :meth:`folder_listing` when not given, then one ``GetObject`` per name
        found: only what exists is read, so a missing object is never mistaken for a refused one). One larger than
        the check reads of it (``read_limits.limit_of``) is not read: ``read_limits.TooLarge`` naming it (the
        Lambda's memory is small); a file only hashed (``tokenizer.json``) comes as its ``FileDigest``."""
        sizes = self.folder_listing(uri, copy) if listing is None else listing
        for name in names:
            if sizes.get(name, 0) > read_limits.limit_of(name):
                raise read_limits.too_large(f"{uri}{name}", sizes[name], read_limits.limit_of(name))
        found = [name for name in names if name in sizes]
        if copy is not None:
            return {
                name: read_limits.local_sha256(copy / name)
                if name in read_limits.HASHED_FILES
                else read_limits.read_local(copy / name)
                for name in found
            }
        bucket, _, prefix = uri[5:].partition("/")
        return {
            name: read_limits.object_sha256(self.s3, bucket, prefix + name)
            if name in read_limits.HASHED_FILES
            else read_limits.read_object(self.s3, bucket, prefix + name)
            for name in found
        }

    def train_data(self, data_uri: str | None, init_from: str | None) -> tuple[TrainData, list[str]]:
        """What ``data_uri``'s folder says (:class:`TrainData`): the dtype its metadata.json records for its
        ``.bin`` token files, and conversation data (``kind: chat``, or ``preference``: pairs of conversations, read the same way) with what ``sft_data.check_against_model``
        finds against the ``init_from`` folder (its template files, tokenizer.json and config.json); nothing
        without such a folder or when it cannot be read here; or the problem of a folder the trainer would
        misread: a metadata.json that cannot be read, records no integer token dtype, or (conversations) is not
        what ``prepare`` writes, and prepared conversations without their metadata.json."""
        if data_uri is None or not self.reads_train_data:
            return TrainData(), []
        copy = self.local_train_data
        if copy is not None and not copy.is_dir():
            return TrainData(), [
                f"train_data_uri: {copy}: is not a folder (a local copy of {data_uri}: the prepared data's folder, "
                f"holding its {DATA_METADATA_FILE})"
            ]
        try:
            listing = self.folder_listing(data_uri, copy)
            raw = self.folder_files(data_uri, [DATA_METADATA_FILE], copy, listing).get(DATA_METADATA_FILE)
            meta = None if raw is None else read_limits.parse_json(raw, f"{data_uri}{DATA_METADATA_FILE}")
        except ValueError as err:  # too large, or not JSON
            said = (
                str(err)
                if str(err).startswith(data_uri)
                else f"{data_uri}{DATA_METADATA_FILE} is not valid JSON ({err})"
            )
            return TrainData(), [f"train_data_uri: {said}"]
        except (
            Exception
        ) as err:  # botocore's ClientError (AccessDenied, ...): no botocore import in the Lambda
            return TrainData(), [
                f"train_data_uri: cannot read {data_uri}{DATA_METADATA_FILE}: {type(err).__name__}: {err}"
            ]
        if meta is None:
            return TrainData(), unlabelled_conversations(data_uri, listing)
        if not isinstance(meta, dict):
            return TrainData(), []
        where = f"train_data_uri: {data_uri}{DATA_METADATA_FILE}: "
        damaged = (
            sft_data.meta_problems(meta)
            if meta.get("kind") in sft_data.TEMPLATE_KINDS
            else dtype_problems(meta)
        )
        if damaged:
            return TrainData(), [
                where + "; ".join(damaged) + " (as prepare writes it: prepare the data again)"
            ]
        recorded = (
            str(meta["token_dtype"]) if "token_dtype" in meta and token_data.raw_token_files(meta) else None
        )
        if meta.get("kind") not in sft_data.TEMPLATE_KINDS:
            return TrainData(token_dtype=recorded), []
        chat, problems = self._chat(data_uri, meta, init_from)
        return TrainData(chat, recorded), problems

    def _chat(
        self, data_uri: str, meta: Mapping[str, Any], init_from: str | None
    ) -> tuple[ChatData | None, list[str]]:
        """Conversation data checked against the ``init_from`` folder's files, when it can be read here."""
        if init_from is None or (self.local_init_from is None and self.s3 is None):
            return ChatData(data_uri, meta, None, ()), []
        local = self.local_init_from
        try:
            listing = self.folder_listing(init_from, local)
            files = self.folder_files(init_from, sft_data.MODEL_FILES, local, listing)
            if "tokenizer_config.json" in files:
                where = sft_data.joined(init_from, "tokenizer_config.json")
                read_limits.check_json(files["tokenizer_config.json"], where)
        except read_limits.TooLarge as err:
            return None, [f"init_from: {err}"]
        except Exception as err:  # as above
            return None, [
                f"init_from: cannot read its chat template and tokenizer files: {type(err).__name__}: {err}"
            ]
        try:
            raw = self.folder_files(init_from, [hf_config.CONFIG_FILE], local, listing).get(
                hf_config.CONFIG_FILE
            )
            config = None if raw is None else read_limits.parse_json(raw, hf_config.CONFIG_FILE)
        except ValueError:
            config = None  # too large, or not JSON: init_from's own read names it
        mismatches = sft_data.check_against_model(
            meta, files, config if isinstance(config, dict) else None, init_from
        )
        return ChatData(data_uri, meta, init_from, tuple(mismatches)), []

    def measurements(self, rules: RequestRules) -> list[Mapping[str, Any]]:
        """The stored tuning records of the workflow's image (read once, with S3 when the caller gave none)."""
        if self._measurements is None:
            self._measurements = list(read_measurements(self.s3, rules)) if self.s3 is not None else []
        return self._measurements


def read_init_from(s3: Any, uri: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The settings of the ``init_from`` folder's config.json (``hf_config.architecture``), or the problem of a
    folder the trainer cannot start from: nothing under the prefix, no config.json or no safetensors file
    directly in it, a config.json that cannot be read or describes an architecture the trainer cannot load. One
    listing of the prefix (the data sources' ``s3:ListBucket``) and one ``GetObject`` of its config.json."""
    bucket, _, prefix = uri[5:].partition("/")
    names = {key[len(prefix) :] for key in list_objects(s3, bucket, prefix)}
    if not names:
        return None, [
            f"init_from: must be a Hugging Face model folder, but no object is under it; got {show(uri)}"
        ]
    if hf_config.CONFIG_FILE not in names:
        return None, [
            f"init_from: holds no {hf_config.CONFIG_FILE} (a Hugging Face model folder has one); got {show(uri)}"
        ]
    if not any("/" not in name and name.endswith(".safetensors") for name in names):
        return None, [
            "init_from: holds no safetensors weights (model.safetensors, or shards with "
            f"model.safetensors.index.json); got {show(uri)}"
        ]
    try:
        body = read_limits.read_object(s3, bucket, prefix + hf_config.CONFIG_FILE)
        read_limits.check_json(body, f"{uri}{hf_config.CONFIG_FILE}")
        return hf_config.architecture(hf_config.parse(body, uri), uri), []
    except read_limits.TooLarge as err:
        return None, [f"init_from: {err}"]
    except ContractError as err:
        return None, [str(err)]
    except (
        Exception
    ) as err:  # botocore's ClientError (AccessDenied, ...): no botocore import in the Lambda asset
        return None, [f"init_from: cannot read {uri}{hf_config.CONFIG_FILE}: {type(err).__name__}: {err}"]


def read_local_init_from(folder: str | Path) -> tuple[dict[str, Any] | None, list[str]]:
    """:func:`read_init_from` of a local folder (a copy of the ``init_from`` folder): the same refusals (no
    config.json, no safetensors weights directly in it, a config.json the trainer cannot load), read from disk."""
    path = Path(folder)
    try:
        config_file = path / hf_config.CONFIG_FILE
        if config_file.is_file():
            read_limits.check_json(read_limits.read_local(config_file), str(config_file))
        config = hf_config.read_local(path)
        if not any(path.glob("*.safetensors")):
            return None, [
                f"init_from: {folder}: holds no safetensors weights (model.safetensors, or shards with "
                "model.safetensors.index.json)"
            ]
        return hf_config.architecture(config, str(folder)), []
    except read_limits.TooLarge as err:
        return None, [f"init_from: {err}"]
    except ContractError as err:
        return None, [str(err)]


def read_local_measurements(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """The well-formed measurement records of local files (``{"records": [...]}``, what a tuning run stores) or
    tuning report folders (their ``measurements.json``), and the files read; a path that is neither, or a file
    that is not a record file, is an ``OSError`` / ``ValueError`` naming it (the caller shows it)."""
    records: list[dict[str, Any]] = []
    files: list[str] = []
    for given in paths:
        path = Path(given)
        file = path / TUNE_RECORDS_FILE if path.is_dir() else path
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as err:
            raise OSError(f"{file}: cannot read ({err.strerror or err}); give a tuning report folder (its "
                          f"{TUNE_RECORDS_FILE}) or a records file") from None  # fmt: skip
        try:
            listed = json.loads(text).get("records")
        except (ValueError, AttributeError):
            listed = None
        if not isinstance(listed, list):
            raise ValueError(f'{file}: not a records file (a JSON object with a "records" list)')
        records += [
            dict(r) for r in listed if measured.well_formed(r)
        ]  # malformed records skipped, as from S3
        files.append(str(file))
    return records, files


def read_measurements(s3: Any, rules: RequestRules) -> list[dict[str, Any]]:
    """The stored measurement records of the workflow's image (``rules.measurements_prefix``), newest files first,
    at most ``MAX_RECORD_FILES`` of them; none when the image or the bucket is not known or S3 refuses (the plan
    then uses its estimate, and says so)."""
    prefix = rules.measurements_prefix()
    if prefix is None or rules.bucket_name is None:
        return []
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415 - in the Lambda runtime and the CLI

    try:
        listed = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=rules.bucket_name, Prefix=prefix):
            listed += [item for item in page.get("Contents", []) if item["Key"].endswith(".json")]
        listed.sort(key=lambda item: item["LastModified"], reverse=True)
        records, held = [], 0
        for item in listed[:MAX_RECORD_FILES]:
            try:
                body = read_limits.read_object(s3, rules.bucket_name, item["Key"])
                held += read_limits.estimated_json_bytes(body)
                if held > read_limits.JSON_BUDGET_BYTES:
                    break  # the older files: more records than the Lambda holds
                listed_records = read_limits.parse_json(body, item["Key"]).get("records", [])
            except (ValueError, AttributeError):
                continue  # not a record file, or too large: skipped, never fatal to a request
            if isinstance(listed_records, list):
                records += [r for r in listed_records if measured.well_formed(r)]  # malformed records skipped
        return records
    except (ClientError, BotoCoreError):
        return []


def data_problems(s3: Any, uri: str) -> list[str]:
    """The problem of a ``train_data_uri`` prefix that holds no object (one ``ListObjectsV2``, ``MaxKeys`` 1)."""
    bucket, _, prefix = uri[5:].partition("/")
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount", 0):
        return []
    return [f"train_data_uri: must hold the training data, but no object is under it; got {show(uri)}"]


def prepared_problems(s3: Any, uri: str) -> list[str]:
    """The problems of a folder a sharded preparation wrote (``training.prepare.job``, docs/data.md): shards
    without a manifest (the preparation has not finished), a manifest that is damaged, or one that lists a file
    that is not there or of another size than the listing shows. A folder without ``shards/`` is another kind of
    data (none). One ``ListObjectsV2`` (``MaxKeys`` 1) of its ``shards/``, then, for a prepared folder, its whole
    listing and its ``metadata.json``."""
    bucket, _, prefix = uri[5:].partition("/")
    if not s3.list_objects_v2(Bucket=bucket, Prefix=prefix + manifest.SHARDS, MaxKeys=1).get("KeyCount", 0):
        return []
    sizes = {key[len(prefix) :]: size for key, size in list_objects(s3, bucket, prefix).items()}
    unfinished = manifest.unfinished_problem(sizes, uri)
    if unfinished:
        return [f"train_data_uri: {unfinished[0]}"]
    where = f"{uri}{manifest.MANIFEST_FILE}"
    try:
        raw = read_limits.read_object(s3, bucket, prefix + manifest.MANIFEST_FILE)
        meta = read_limits.parse_json(raw, where)
    except read_limits.TooLarge as err:
        return [f"train_data_uri: {err}"]
    except ValueError as err:
        return [f"train_data_uri: {where} is not valid JSON ({err})"]
    if not manifest.is_sharded(meta):
        return [f"train_data_uri: {uri}{manifest.MANIFEST_FILE} is not the manifest of the shards beside it (format "
                f"{str(meta.get('format') if isinstance(meta, dict) else None)[:40]}, not {manifest.FORMAT})"]  # fmt: skip
    damaged = manifest.meta_problems(meta)
    if damaged:
        return [f"train_data_uri: {uri}{manifest.MANIFEST_FILE}: " + "; ".join(damaged[:5])]
    return [f"train_data_uri: {problem}" for problem in manifest.listing_problems(meta, sizes, uri)]


# --------------------------------------------------------------------------------------------------------------
# resume_from: the newest complete checkpoint of an earlier run
# --------------------------------------------------------------------------------------------------------------


def resume(
    s3: Any,
    rules: RequestRules,
    name: str,
    execution: str | None,
    max_steps: int,
    identity: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Where run ``name`` of this workflow has its newest complete checkpoint (``{"step", "uri", "execution",
    "in_place"}``), and the problems of continuing from it to ``max_steps`` (none found, not further than its
    step, or, given this run's ``identity`` (``checkpoint_identity.model_identity``), a model the trainer would
    refuse to continue: :func:`identity_problems`). ``name`` this very execution (``execution``): the run continues
    in its own folder, which SageMaker's checkpoint sync brings back (``in_place``: no resume channel); else it
    starts in its own folder from ``name``'s checkpoint, mounted as the resume channel."""
    runs_uri = rules.runs_uri()
    if runs_uri is None:
        raise ValueError("RequestRules.bucket_name: needed to decide resume_from")
    run_uri = f"{runs_uri}{name}/"
    bucket, _, run_key = run_uri[5:].partition("/")
    objects = list_objects(s3, bucket, run_key)
    read = lambda key: read_limits.read_object(s3, bucket, key, read_limits.MAX_JSON_BYTES)  # noqa: E731
    found = newest_complete_checkpoint(objects, read, run_key)
    problems = resume_problems(name, max_steps, found, run_uri)
    if found is None:
        return None, problems
    if identity is not None:
        problems += identity_problems(
            f"s3://{bucket}/{found[1]}", read(found[1] + CHECKPOINT_MARKER), identity
        )
    in_place = name == execution
    return {
        "step": found[0],
        "uri": f"s3://{bucket}/{found[1]}",
        "execution": name,
        "in_place": in_place,
    }, problems


def run_folder_problems(s3: Any, rules: RequestRules, execution: str, *, tuning: bool) -> list[str]:
    """A new run named ``execution`` whose checkpoint folder already holds objects would resume from an earlier run
    of that name and write over its checkpoints (after Step Functions forgot that execution: 90 days, or a replaced
    state machine); a tuning run would also write over that run's stored measurements. Refused, unless the input
    continues that run (``resume_from`` its own name, decided by :func:`resume`). One listing (``MaxKeys`` 1) of
    the folder, and for a tuning run one of its records file."""
    runs_uri = rules.runs_uri()
    if runs_uri is None:
        return []
    bucket, _, run_key = f"{runs_uri}{execution}/"[5:].partition("/")
    held = s3.list_objects_v2(Bucket=bucket, Prefix=run_key, MaxKeys=1).get("KeyCount", 0)
    if held:
        resumes = (
            "" if tuning else f", or set resume_from to {show(execution)} to continue that run in its folder"
        )
        return [
            f"execution name: s3://{bucket}/{run_key} already holds the checkpoints of an earlier run named "
            f"{execution}, which a new run would resume from and write over; start this one under another "
            f"name{resumes}"
        ]
    records = rules.tuning_paths(execution)["records_key"] if tuning else None
    if records and s3.list_objects_v2(Bucket=bucket, Prefix=records, MaxKeys=1).get("KeyCount", 0):
        return [
            f"execution name: s3://{bucket}/{records} already holds the measurements of an earlier tuning run named "
            f"{execution}; start this one under another name"
        ]
    return []


def newest_complete_checkpoint(
    objects: Mapping[str, int], read: Callable[[str], bytes], run_key: str
) -> tuple[int, str] | None:
    """(step, key prefix) of the newest complete checkpoint under ``run_key`` (``.../<execution>/``), the trainer's
    rule: a ``step_XXXXXXXX`` (or ``step_XXXXXXXX-N``, a later save of that step) folder whose ``COMPLETE`` lists
    files that all exist with the listed sizes; unsealed folders and folders the trainer set aside (a
    ``step_XXXXXXXX.unusable`` object beside the folder) never count.

    ``objects`` maps every key under ``run_key`` to its size; ``read`` returns an object's bytes."""
    candidates = []
    for key in objects:
        parts = key[len(run_key) :].split("/")
        if len(parts) == 2 and parts[1] == CHECKPOINT_MARKER and (m := CHECKPOINT_DIR_NAME.match(parts[0])):
            if f"{run_key}{parts[0]}{SET_ASIDE_SUFFIX}" in objects:
                continue  # the trainer found it damaged
            candidates.append((int(m.group(1)), int(m.group(2) or 1), f"{run_key}{parts[0]}/"))
    for step, _, prefix in sorted(candidates, reverse=True):
        try:
            files = read_limits.parse_json(read(prefix + CHECKPOINT_MARKER), prefix + CHECKPOINT_MARKER)[
                "files"
            ]
            if all(objects.get(prefix + name) == size for name, size in files.items()):
                return step, prefix
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # unreadable, or larger than the check holds: not the trainer's
    return None


def identity_problems(uri: str, marker: bytes, identity: Mapping[str, Any]) -> list[str]:
    """The checkpoint at ``uri`` (its ``COMPLETE`` marker's bytes) holds a model this run's trainer refuses to
    continue (``identity``: the run's ``checkpoint_identity.model_identity``): full fine-tuning against LoRA, LoRA
    adapters of another rank, alpha or targets, another shape or position encoding; in the words the trainer says
    it at its start (``checkpoint_identity.mismatch``). The frozen base LoRA adapters were trained on is the
    trainer's to compare (it samples the weights)."""
    try:
        stored = read_limits.parse_json(marker, uri + CHECKPOINT_MARKER).get("model_shape")
    except (ValueError, AttributeError):
        return []  # newest_complete_checkpoint read it already
    message = checkpoint_identity.mismatch(uri, stored, identity, checkpoint_identity.REMEDY["resume_from"])
    return [] if message is None else [f"resume_from: {message}"]


def resume_problems(name: str, max_steps: int, found: tuple[int, str] | None, run_uri: str) -> list[str]:
    """Problems of continuing run ``name`` from ``found`` (what :func:`newest_complete_checkpoint` gave for
    ``run_uri``) to ``max_steps``."""
    if found is None:
        return [f"resume_from: execution {name} has no complete checkpoint under {run_uri}; got {show(name)}"]
    step = found[0]
    if max_steps <= step:
        return [
            f"hyperparameters.max_steps: must be greater than the step of the checkpoint resumed from ({step}, "
            f"execution {name}) to train further; got {max_steps}"
        ]
    return []


# --------------------------------------------------------------------------------------------------------------
# training_plan_arn: the plan holds the job's instances
# --------------------------------------------------------------------------------------------------------------

ENDED_PLAN_STATES = ("Expired", "Failed")
"""A training plan (or one of its reserved capacities) in these states runs nothing again (``DescribeTrainingPlan``'s
``Status``: Pending, Active, Scheduled, Expired, Failed)."""


def training_plan_problems(
    sagemaker: Any, arn: str, instance_type: str, instance_count: int, type_field: str = "instance_type"
) -> list[str]:
    """The problems of running a job of ``instance_count`` x ``instance_type`` (the field ``type_field`` chose) in
    training plan ``arn`` (one ``DescribeTrainingPlan``, :func:`plan_capacity_problems`): no such plan in this
    account and region, or one this workflow may not describe (its role may describe only its own account's
    plans)."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 - in the Lambda runtime and the CLI

    name = arn.rsplit("/", 1)[-1]
    try:
        described = sagemaker.describe_training_plan(TrainingPlanName=arn)
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code")
        if code in ("AccessDenied", "AccessDeniedException"):
            return [f"training_plan_arn: the training plan {name} cannot be described ({code}): this workflow runs "
                    f"only in its own account's plans; got {show(arn)}"]  # fmt: skip
        if code in ("ResourceNotFound", "ValidationException"):
            return [f"training_plan_arn: no training plan {name} in this account and region; got {show(arn)}"]
        raise
    return plan_capacity_problems(described, instance_type, instance_count, type_field)


def plan_capacity_problems(
    described: Mapping[str, Any], instance_type: str, instance_count: int, type_field: str = "instance_type"
) -> list[str]:
    """The problems of a job of ``instance_count`` x ``instance_type`` in the training plan ``described``
    (``DescribeTrainingPlan``'s answer): ended (Expired, Failed: a job in it would never start), for another target
    than training jobs, or none of its reserved capacities that has not ended of that instance type (SageMaker runs
    a job in a plan only on the plan's instance type) with that many instances. A plan of several reserved
    capacities (each its own instance type, count, Availability Zone, start and end: CreateTrainingPlan) holds them
    one after another or in separate zones, and a job's instances run in one zone at one time, so the largest one
    bounds the job. An Active plan whose instances other jobs use is no problem here: the job waits (up to
    ``MaxPendingTimeInSeconds``)."""
    name = described.get("TrainingPlanName") or "?"
    status = described.get("Status")
    if status in ENDED_PLAN_STATES:
        why = f" ({described['StatusMessage']})" if described.get("StatusMessage") else ""
        return [f"training_plan_arn: the training plan {name} is {status}{why}; a job in it would never start; "
                "name a Scheduled or Active plan"]  # fmt: skip
    targets = described.get("TargetResources") or []
    if targets and "training-job" not in targets:
        return [f"training_plan_arn: the training plan {name} is for {', '.join(targets)}, not SageMaker training "
                "jobs (a plan serves only its target resources)"]  # fmt: skip
    capacities = [
        c
        for c in described.get("ReservedCapacitySummaries") or []
        if c.get("Status") not in ENDED_PLAN_STATES
    ]
    if not capacities:
        return []  # nothing said about its capacities: SageMaker decides at launch
    counts = [
        int(c.get("TotalInstanceCount") or 0) for c in capacities if c.get("InstanceType") == instance_type
    ]
    if not counts:
        held = ", ".join(
            sorted({f"{c.get('TotalInstanceCount')} x {c.get('InstanceType')}" for c in capacities})
        )
        return [f"{type_field}: the training plan {name} reserves {held}, no {instance_type} (SageMaker runs a job "
                f"in a plan only on the plan's instance type); got {show(instance_type)}"]  # fmt: skip
    if instance_count > max(counts):
        return [f"instance_count: the training plan {name} reserves at most {max(counts)} x {instance_type} at once "
                f"(its largest reserved capacity of that type); must be at most {max(counts)}; got {instance_count}"]  # fmt: skip
    return []


def list_objects(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` and its size."""
    objects: dict[str, int] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            objects[item["Key"]] = item["Size"]
    return objects
