"""``DataPreparation``: a state machine of its own that tokenizes a corpus where it lives, as a SageMaker Processing
job over several instances, and checks the manifest it wrote.

Its own state machine, not a ``prepare`` block of the training workflow's input: a corpus is prepared once and
trained on many times, on CPU instances with their own role (read the corpus, create the shards; the training jobs'
role only reads them), its own limits and failure modes (no GPU capacity to wait for), and a rerun of the same
``name`` completes an interrupted preparation; the training workflow's input stays as it is (``train_data_uri``
names the prepared folder, whose manifest its request check reads).

Execution input (JSONPath): ``name`` (the output folder ``<output_prefix><name>/``), ``input_uri`` (an
``s3://bucket/prefix/`` under ``read_prefixes``), ``model_uri`` (a folder holding ``tokenizer.json``, or for
``kind`` ``chat`` or ``pairs`` the model's tokenizer and chat template files), and optionally ``kind`` (``text``),
``text_field`` (``text``), ``validation_fraction`` (0.01), ``max_tokens``, ``too_long`` (``drop``),
``template_seconds`` (10: the longest one rendering of a chat template may take), ``instance_type`` and
``instance_count`` (the construct's defaults). The states: merge the defaults, refuse what
is not allowed (each refusal a Fail naming the field), run the job (``createProcessingJob.sync``), then read the
manifest: an execution succeeds only with ``metadata.json`` in place, and its output names the folder to train on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aws_cdk import Duration, Names, RemovalPolicy, Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk import aws_stepfunctions_tasks as tasks
from constructs import Construct

from constructs_lib._shared.log_keys import keyed_log_group
from constructs_lib.identity.execution_role import SAGEMAKER_SERVICE
from constructs_lib.image.repository import TrainingImageRepository
from constructs_lib.preparation.job_request import processing_job_request
from constructs_lib.preparation.permissions import grant_job_role, grant_state_machine
from constructs_lib.storage.checkpoint_bucket import CheckpointBucket
from constructs_lib.workflow.permissions import trust_only_this_state_machine
from training.prepare.plan import DEFAULT_INSTANCE_TYPE, PROCESSING_INSTANCE_TYPES

CREATE_PROCESSING_JOB_SYNC = "arn:aws:states:::sagemaker:createProcessingJob.sync"
MANIFEST = "metadata.json"
KINDS = ("text", "chat", "pairs")
"""The kinds an execution may ask for (``training.prepare.kinds.KINDS``; a test keeps the two equal)."""
TOO_LONG = ("drop", "truncate")
TEMPLATE_SECONDS = 10.0
"""The default bound on one rendering of a chat template: ``training.prepare.chat_data.TEMPLATE_SECONDS`` (not
imported: that module loads numpy, which a synth does not need; a test keeps the two equal)."""


def _prefix(name: str, value: str) -> str:
    if not isinstance(value, str) or not value.endswith("/") or value.startswith("/") or "*" in value:
        raise ValueError(
            f"DataPreparation: {name} must be a key prefix ending in / (e.g. 'data/'); got {value!r}"
        )
    return value


class DataPreparation(Construct):
    """Prepare data as a SageMaker Processing job over several instances, from a state machine.

    All props are keyword-only.

    :param image_uri: the training image (it holds ``training.prepare``).
    :param checkpoint_bucket: the ``CheckpointBucket`` (its ``data/`` prefix is read, ``data/prepared/`` written).
        Give either this or ``bucket``.
    :param bucket: an existing bucket instead.
    :param image_repository: the image's repository, for the created role's pull. Needed unless ``role`` is given.
    :param role: an existing role for the Processing jobs (the statements are added to it). Default: one is created.
    :param read_prefixes: key prefixes the jobs may read (corpora, tokenizers, model folders). Default ``("data/",)``.
    :param output_prefix: where each preparation's folder goes. Default ``data/prepared/``: under the training
        workflow's default data source, so ``train_data_uri`` may name it.
    :param instance_types: the instance types an execution may ask for. Default: every type of
        ``training.prepare.plan.PROCESSING_INSTANCE_TYPES``.
    :param default_instance_type: Default ``ml.c5.18xlarge`` (72 vCPUs).
    :param max_instance_count: the most instances an execution may ask for (1 to 100). Default 16.
    :param volume_size_gb: EBS volume per instance (its share of the corpus is downloaded there). Default 500.
    :param max_runtime: one job's bound (1 hour to 5 days). Default 24 hours.
    :param log_retention: of the execution log group. Default six months.
    :param encryption_key: customer managed key of the execution log group (its policy gets what CloudWatch Logs
        needs). Default: CloudWatch Logs' own encryption.
    :param removal_policy: of the log group. Default ``RETAIN``.
    :param tags: on the jobs. Default none.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        image_uri: str,
        checkpoint_bucket: CheckpointBucket | None = None,
        bucket: s3.IBucket | None = None,
        image_repository: TrainingImageRepository | ecr.IRepository | None = None,
        role: iam.IRole | None = None,
        read_prefixes: Sequence[str] = ("data/",),
        output_prefix: str = "data/prepared/",
        instance_types: Sequence[str] | None = None,
        default_instance_type: str = DEFAULT_INSTANCE_TYPE,
        max_instance_count: int = 16,
        volume_size_gb: int = 500,
        max_runtime: Duration | None = None,
        log_retention: logs.RetentionDays | None = None,
        encryption_key: kms.IKey | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if (checkpoint_bucket is None) == (bucket is None):
            raise ValueError("DataPreparation: give exactly one of checkpoint_bucket or bucket")
        self.bucket: s3.IBucket = checkpoint_bucket.bucket if checkpoint_bucket is not None else bucket  # type: ignore[assignment]
        self.read_prefixes = tuple(_prefix("read_prefixes", p) for p in read_prefixes)
        self.output_prefix = _prefix("output_prefix", output_prefix)
        if not self.read_prefixes:
            raise ValueError("DataPreparation: read_prefixes must name at least one prefix")
        inside = [p for p in self.read_prefixes if p.startswith(self.output_prefix)]
        if inside:
            raise ValueError(f"DataPreparation: read_prefixes {inside} lie inside output_prefix {self.output_prefix!r}: "
                             "a corpus there would be mixed with the shards written next to it")  # fmt: skip
        self.instance_types = tuple(instance_types or PROCESSING_INSTANCE_TYPES)
        unknown = [t for t in self.instance_types if t not in PROCESSING_INSTANCE_TYPES]
        if unknown or default_instance_type not in self.instance_types:
            raise ValueError(f"DataPreparation: instance_types must be among {', '.join(PROCESSING_INSTANCE_TYPES)} "
                             f"and hold default_instance_type {default_instance_type!r}; got {list(self.instance_types)}")  # fmt: skip
        if not 1 <= max_instance_count <= 100:
            raise ValueError(
                f"DataPreparation: max_instance_count must be in [1, 100]; got {max_instance_count}"
            )
        if not 1 <= volume_size_gb <= 16384:
            raise ValueError(f"DataPreparation: volume_size_gb must be in [1, 16384]; got {volume_size_gb}")
        runtime = int((max_runtime or Duration.hours(24)).to_seconds())
        if not 3600 <= runtime <= 5 * 86400:
            raise ValueError(f"DataPreparation: max_runtime must be 1 hour to 5 days; got {runtime} s")
        repository = (
            image_repository.repository
            if isinstance(image_repository, TrainingImageRepository)
            else image_repository
        )
        if role is None and repository is None:
            raise ValueError("DataPreparation: give image_repository (the created role must pull image_uri) or a role "
                             "that can pull it")  # fmt: skip
        self.max_instance_count, self.default_instance_type = max_instance_count, default_instance_type
        self.role: iam.IRole = role or iam.Role(
            self, "JobRole", description="Processing jobs of the data preparation (read the corpus, write shards)",
            assumed_by=iam.ServicePrincipal(SAGEMAKER_SERVICE,
                                            conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}}),
        )  # fmt: skip
        grant_job_role(self, self.role, bucket=self.bucket, read_prefixes=self.read_prefixes,
                       output_prefix=self.output_prefix, repository=repository)  # fmt: skip
        request = processing_job_request(role_arn=self.role.role_arn, image_uri=image_uri, volume_size_gb=volume_size_gb,
                                         max_runtime_seconds=runtime, tags=dict(tags or {}))  # fmt: skip
        self.log_group = keyed_log_group(self, encryption_key, log_retention or logs.RetentionDays.SIX_MONTHS, removal_policy,
                                         "/aws/vendedlogs/states/")  # fmt: skip
        name = Names.unique_resource_name(self, max_length=80)  # known at synth: the trust names this machine
        self.state_machine = sfn.StateMachine(
            self, "StateMachine", state_machine_name=name, definition_body=sfn.DefinitionBody.from_chainable(self._definition(request)),
            timeout=Duration.seconds(runtime + 3600), tracing_enabled=True,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=True),
            comment="Prepare one corpus as a SageMaker Processing job over several instances (docs/data.md)",
        )  # fmt: skip
        trust_only_this_state_machine(self.state_machine, name)
        grant_state_machine(self, self.state_machine.role, job_role=self.role, bucket=self.bucket,
                            output_prefix=self.output_prefix)  # fmt: skip

    @property
    def state_machine_arn(self) -> str:
        return self.state_machine.state_machine_arn

    def grant_start_execution(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` start preparations (and read their executions: the CLI's progress)."""
        return self.state_machine.grant_start_execution(grantee).combine(
            self.state_machine.grant_read(grantee)
        )

    def grant_read_prepared(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` (a training jobs' role) list and read the prepared folders."""
        read = self.bucket.grant_read(grantee, f"{self.output_prefix}*")
        return read

    def _defaults(self) -> dict[str, Any]:
        return {"kind": "text", "text_field": "text", "validation_fraction": 0.01, "max_tokens": "none",
                "too_long": "drop", "template_seconds": TEMPLATE_SECONDS, "instance_type": self.default_instance_type,
                "instance_count": 1}  # fmt: skip

    def _definition(self, request: dict[str, Any]) -> sfn.IChainable:
        merge = sfn.Pass(self, "Defaults", parameters={"defaults": self._defaults(), "given.$": "$"})
        decided = sfn.Pass(
            self,
            "Merge the defaults",
            parameters={"request.$": "States.JsonMerge($.defaults, $.given, false)"},
        )
        job = sfn.Pass(self, "Name the job", result_path="$.job", parameters={
            "name.$": "States.Format('prepare-{}', States.UUID())",
            "output_uri.$": f"States.Format('s3://{self.bucket.bucket_name}/{self.output_prefix}{{}}/', $.request.name)",
            "manifest_key.$": f"States.Format('{self.output_prefix}{{}}/{MANIFEST}', $.request.name)",
            "validation_fraction.$": "States.Format('{}', $.request.validation_fraction)",
            "max_tokens.$": "States.Format('{}', $.request.max_tokens)",
            "template_seconds.$": "States.Format('{}', $.request.template_seconds)",
        })  # fmt: skip
        run = sfn.CustomState(self, "Prepare", state_json={
            "Type": "Task", "Resource": CREATE_PROCESSING_JOB_SYNC, "Parameters": request, "ResultPath": "$.processing",
            "ResultSelector": {"ProcessingJobName.$": "$.ProcessingJobName", "ProcessingJobStatus.$": "$.ProcessingJobStatus"},
            "Retry": [{"ErrorEquals": ["SageMaker.AmazonSageMakerException"], "IntervalSeconds": 30, "MaxAttempts": 3,
                       "BackoffRate": 2}],
        })  # fmt: skip
        failed = sfn.Fail(self, "Preparation failed", error="PreparationFailed",
                          cause="The processing job failed: its ExitMessage (DescribeProcessingJob, the CLI's "
                          "prepare-status) and its CloudWatch logs give the error line (for a bad record: the object "
                          "and line); fix the input and start the same name again (complete shards are kept)")  # fmt: skip
        run.add_catch(failed, errors=["States.ALL"], result_path="$.error")
        check = tasks.CallAwsService(self, "Read the manifest", service="s3", action="headObject",
                                     iam_action="s3:GetObject", iam_resources=[self.bucket.arn_for_objects(f"{self.output_prefix}*")],
                                     parameters={"Bucket": self.bucket.bucket_name, "Key": sfn.JsonPath.string_at("$.job.manifest_key")},
                                     result_path=sfn.JsonPath.DISCARD)  # fmt: skip
        check.add_catch(sfn.Fail(self, "No manifest", error="NoManifest",
                                 cause="The job ended without writing metadata.json: some shard is not complete; start "
                                 "the same name again"), errors=["States.ALL"])  # fmt: skip
        done = sfn.Succeed(self, "Prepared", output_path="$.job")
        refused = self._refusals(job.next(run).next(check).next(done))
        return merge.next(decided).next(refused)

    def _refusals(self, accepted: sfn.IChainable) -> sfn.IChainable:
        """Choices refusing, each with a Fail naming the field, what the construct does not allow."""
        bucket = self.bucket.bucket_name

        def under(path: str) -> sfn.Condition:
            """A folder (ending in /) under one of the read prefixes."""
            return sfn.Condition.and_(
                sfn.Condition.is_present(path), sfn.Condition.is_string(path), sfn.Condition.string_matches(path, "*/"),
                sfn.Condition.or_(*[sfn.Condition.string_matches(path, f"s3://{bucket}/{p}*") for p in self.read_prefixes]),
            )  # fmt: skip

        def one_of(path: str, allowed: Sequence[str]) -> sfn.Condition:
            return sfn.Condition.and_(sfn.Condition.is_string(path),
                                      sfn.Condition.or_(*[sfn.Condition.string_equals(path, a) for a in allowed]))  # fmt: skip

        name = "$.request.name"
        count = "$.request.instance_count"
        checks = [
            ("name", sfn.Condition.and_(sfn.Condition.is_present(name), sfn.Condition.is_string(name),
                                        *[sfn.Condition.not_(c) for c in (
                                            sfn.Condition.string_equals(name, ""), sfn.Condition.string_equals(name, "."),
                                            sfn.Condition.string_equals(name, ".."), sfn.Condition.string_matches(name, "*/*"),
                                            sfn.Condition.string_matches(name, "* *"))]),
             "name: must be given, a non-empty string without '/' or spaces, not '.' or '..': the folder "
             "<output_prefix><name>/ the data is prepared into"),
            ("input_uri", under("$.request.input_uri"),
             f"input_uri: must be a folder s3://{{bucket}}/<prefix>/ (ending in /) under one of {', '.join(self.read_prefixes)}"),
            ("model_uri", under("$.request.model_uri"),
             f"model_uri: must be a folder (ending in /) with tokenizer.json (or a chat model's files) under one of "
             f"{', '.join(self.read_prefixes)}"),
            ("kind", one_of("$.request.kind", KINDS), f"kind: must be one of {', '.join(KINDS)}"),
            ("too_long", one_of("$.request.too_long", TOO_LONG), f"too_long: must be one of {', '.join(TOO_LONG)}"),
            ("instance_type", one_of("$.request.instance_type", self.instance_types),
             f"instance_type: must be one of {', '.join(self.instance_types)}"),
            ("instance_count", sfn.Condition.and_(sfn.Condition.is_numeric(count),
                                                  sfn.Condition.number_greater_than_equals(count, 1),
                                                  sfn.Condition.number_less_than_equals(count, self.max_instance_count)),
             f"instance_count: must be a whole number from 1 to {self.max_instance_count}"),
        ]  # fmt: skip
        text = "$.checks.instance_count"  # a whole number's JSON text has no '.' nor exponent
        whole = sfn.Choice(self, "Check instance_count is whole")
        whole.when(sfn.Condition.and_(*[sfn.Condition.not_(sfn.Condition.string_matches(text, p))
                                        for p in ("*.*", "*e*", "*E*")]), accepted)  # fmt: skip
        whole.otherwise(
            sfn.Fail(self, "Refuse instance_count fraction", error="InvalidInput", cause=checks[-1][2])
        )
        as_text: sfn.IChainable = sfn.Pass(self, "instance_count as text", result_path="$.checks",
                            parameters={"instance_count.$": "States.Format('{}', $.request.instance_count)"}).next(whole)  # fmt: skip
        chain = as_text
        for field, ok, cause in reversed(checks):
            choice = sfn.Choice(self, f"Check {field}")
            choice.when(ok, chain)
            choice.otherwise(sfn.Fail(self, f"Refuse {field}", error="InvalidInput", cause=cause))
            chain = choice
        return chain
