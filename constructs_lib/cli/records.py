"""What a run is made of, as plain records: the execution (:class:`Run`), its training jobs (:class:`Job`), their
log lines (:class:`LogEvent`), what ``watch`` shows (:class:`Snapshot`), and console links. No AWS calls."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from constructs_lib._shared.console_links import run_links
from constructs_lib.cli.progress import Progress
from training.contract.container import EVALUATE_ENTRY_POINT, PROGRAM_ENV
from training.contract.hardware import estimate_cost_usd
from training.request import job

JOB_ENDED = frozenset({"Completed", "Failed", "Stopped"})


def console_links(
    region: str, execution_arn: str | None = None, job_name: str | None = None
) -> dict[str, str]:
    """AWS console addresses of the execution, its training job and the job's log streams."""
    partition = execution_arn.split(":")[1] if execution_arn and execution_arn.count(":") > 2 else None
    return run_links(partition=partition, region=region, execution_arn=execution_arn, job=job_name)


@dataclass
class Job:
    """One training job of a run (one launch)."""

    name: str
    status: str = "NotCreated"
    secondary_status: str | None = None
    failure_reason: str | None = None
    instance_type: str | None = None
    instance_count: int = 1
    capacity: str = "on-demand"
    training_seconds: int | None = None
    billable_seconds: int | None = None
    hyperparameters: dict[str, str] = field(default_factory=dict)
    model_artifacts: str | None = None
    checkpoint_uri: str | None = None
    final_metrics: dict[str, float] = field(default_factory=dict)
    keep_alive_seconds: int = 0
    remote_debug: bool = False
    warm_pool_status: str | None = None
    warm_pool_billable_seconds: int | None = None
    warm_pool_reused_by: str | None = None
    kind: str = "training"
    """``evaluation`` for an evaluation job (its ``Environment`` runs ``evaluate.sh``), else ``training``."""

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> Job:
        """The job a ``CreateTrainingJob`` request describes (before SageMaker says more)."""
        job = cls(name=str(request.get("TrainingJobName")))
        job.update(request)
        return job

    def update(self, described: Mapping[str, Any]) -> None:
        """Take what ``DescribeTrainingJob`` says."""
        resources = described.get("ResourceConfig") or {}
        self.status = described.get("TrainingJobStatus", self.status)
        self.secondary_status = described.get("SecondaryStatus")
        self.failure_reason = described.get("FailureReason")
        self.instance_type = resources.get("InstanceType", self.instance_type)
        self.instance_count = int(resources.get("InstanceCount") or self.instance_count)
        self.capacity = _capacity(described)
        self.training_seconds = described.get("TrainingTimeInSeconds")
        self.billable_seconds = described.get("BillableTimeInSeconds")
        self.hyperparameters = dict(described.get("HyperParameters") or self.hyperparameters)
        if "Environment" in described:
            program = (described.get("Environment") or {}).get(PROGRAM_ENV)
            self.kind = "evaluation" if program == EVALUATE_ENTRY_POINT else "training"
        self.model_artifacts = (described.get("ModelArtifacts") or {}).get("S3ModelArtifacts")
        self.checkpoint_uri = job.job_checkpoint_uri(described) or self.checkpoint_uri
        self.keep_alive_seconds = int(resources.get("KeepAlivePeriodInSeconds") or self.keep_alive_seconds)
        if "RemoteDebugConfig" in described:  # moto's DescribeTrainingJob leaves it out
            self.remote_debug = bool(described["RemoteDebugConfig"].get("EnableRemoteDebug"))
        warm_pool = described.get("WarmPoolStatus") or {}
        self.warm_pool_status = warm_pool.get("Status")
        self.warm_pool_billable_seconds = warm_pool.get("ResourceRetainedBillableTimeInSeconds")
        self.warm_pool_reused_by = warm_pool.get("ReusedByJob")
        self.final_metrics = {
            m["MetricName"]: float(m["Value"])
            for m in described.get("FinalMetricDataList") or []
            if "Value" in m
        }

    @property
    def warm_pool(self) -> str:
        """The warm pool in words: SageMaker's ``WarmPoolStatus`` (with its billed seconds and the job that reused
        it), ``requested`` while SageMaker reports none for a job that asked for one, ``-`` for no warm pool."""
        if self.warm_pool_status is None:
            return (
                f"requested ({self.keep_alive_seconds} s), no status yet" if self.keep_alive_seconds else "-"
            )
        text = self.warm_pool_status
        if self.warm_pool_billable_seconds is not None:
            text += f", {self.warm_pool_billable_seconds} s billed"
        if self.warm_pool_reused_by:
            text += f", reused by {self.warm_pool_reused_by}"
        return text

    @property
    def ended(self) -> bool:
        return self.status in JOB_ENDED

    @property
    def cost_usd(self) -> float | None:
        """On-demand estimate from the billable seconds so far (0 before any). None: a training plan's job (paid
        with the plan) or an instance type without a price in the contract's table."""
        if self.capacity == "training plan":
            return None
        if not self.billable_seconds:
            return 0.0
        return estimate_cost_usd(self.instance_type or "", self.instance_count, self.billable_seconds)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "cost_usd": self.cost_usd}


def _capacity(request: Mapping[str, Any]) -> str:
    if (request.get("ResourceConfig") or {}).get("TrainingPlanArn"):
        return "training plan"
    return "spot" if request.get("EnableManagedSpotTraining") else "on-demand"


@dataclass
class Run:
    """One execution of the workflow and its jobs (in launch order); or, ``direct``, one training job launched
    without the workflow (``TrainingRuns.launch_direct``), named by the job's name, its ``arn`` the job's."""

    name: str
    arn: str
    status: str
    region: str
    started: datetime | None = None
    stopped: datetime | None = None
    error: str | None = None
    cause: str | None = None
    summary: dict[str, Any] | None = None
    jobs: list[Job] = field(default_factory=list)
    direct: bool = False

    @property
    def job(self) -> Job | None:
        """The last training job (None for an execution that only evaluated)."""
        training = [job for job in self.jobs if job.kind == "training"]
        return training[-1] if training else None

    @property
    def evaluation_job(self) -> Job | None:
        """The last evaluation job, if the run has one."""
        evaluations = [job for job in self.jobs if job.kind == "evaluation"]
        return evaluations[-1] if evaluations else None

    @property
    def running(self) -> bool:
        return self.status == "RUNNING"

    @property
    def duration_seconds(self) -> float | None:
        if self.started is None:
            return None
        end = self.stopped or datetime.now(UTC)
        return max(0.0, (end - self.started).total_seconds())

    @property
    def billable_seconds(self) -> int:
        return sum(job.billable_seconds or 0 for job in self.jobs)

    @property
    def cost_usd(self) -> float | None:
        """Sum of the jobs' estimates; None when any billed job has no estimate."""
        costs = [job.cost_usd for job in self.jobs]
        return None if not costs or any(c is None for c in costs) else sum(c for c in costs if c is not None)

    @property
    def links(self) -> dict[str, str]:
        execution = None if self.direct else self.arn
        job = self.job or self.evaluation_job
        return console_links(self.region, execution, job.name if job else None)

    def as_dict(self) -> dict[str, Any]:
        job = self.job
        return {
            "name": self.name,
            "arn": self.arn,
            "status": self.status,
            "direct": self.direct,
            "started": self.started.isoformat() if self.started else None,
            "stopped": self.stopped.isoformat() if self.stopped else None,
            "duration_seconds": self.duration_seconds,
            "error": self.error,
            "cause": self.cause,
            "job": job.name if job else None,
            "job_status": job.status if job else None,
            "secondary_status": job.secondary_status if job else None,
            "failure_reason": job.failure_reason if job else None,
            "instance_type": job.instance_type if job else None,
            "instance_count": job.instance_count if job else None,
            "launches": len(self.jobs),
            "warm_pool": job.warm_pool if job else None,
            "billable_seconds": self.billable_seconds,
            "cost_usd": self.cost_usd,
            "summary": self.summary,
            "links": self.links,
        }


@dataclass(frozen=True)
class LogEvent:
    stream: str
    timestamp: int
    message: str

    @property
    def host(self) -> str:
        """``algo-1`` from ``<job>/algo-1-1732345678``."""
        tail = self.stream.split("/", 1)[-1]
        return re.sub(r"-\d{9,}$", "", tail)

    def as_dict(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "host": self.host,
            "timestamp": self.timestamp,
            "message": self.message,
        }


@dataclass(frozen=True)
class Snapshot:
    """What ``watch`` shows at one moment."""

    run: Run
    progress: Progress

    def as_dict(self) -> dict[str, Any]:
        return {**self.run.as_dict(), "progress": self.progress.as_dict()}
