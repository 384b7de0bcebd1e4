"""A training job's log lines from CloudWatch Logs (``/aws/sagemaker/TrainingJobs``, one stream per host), read
from where the last read left off."""

from __future__ import annotations

from typing import Any

from constructs_lib.cli.records import LogEvent

LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class LogCursor:
    """Reads a training job's log streams (one per host) from where it left off."""

    def __init__(self, logs: Any, job_name: str) -> None:
        self.logs = logs
        self.job_name = job_name
        self.tokens: dict[str, str | None] = {}

    def streams(self) -> list[str]:
        names: list[str] = []
        kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{self.job_name}/"}
        while True:
            try:
                page = self.logs.describe_log_streams(**kwargs)
            except self.logs.exceptions.ResourceNotFoundException:
                return names  # no job has logged in this account and region yet
            names += [s["logStreamName"] for s in page.get("logStreams", [])]
            if not page.get("nextToken"):
                return names
            kwargs["nextToken"] = page["nextToken"]

    def read(self) -> list[LogEvent]:
        """New events of every stream, ordered by time (stable within a stream)."""
        found: list[LogEvent] = []
        for stream in self.streams():
            token = self.tokens.get(stream)
            while True:
                kwargs: dict[str, Any] = {"logGroupName": LOG_GROUP, "logStreamName": stream}
                kwargs.update({"nextToken": token} if token else {"startFromHead": True})
                page = self.logs.get_log_events(**kwargs)
                found += [LogEvent(stream, e["timestamp"], e["message"]) for e in page.get("events", [])]
                if page.get("nextForwardToken") in (None, token):
                    break
                token = page["nextForwardToken"]
                if not page.get("events"):
                    break
            self.tokens[stream] = token
        return sorted(found, key=lambda e: e.timestamp)
