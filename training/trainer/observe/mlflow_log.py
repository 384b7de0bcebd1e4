"""MLflow logging of the run's settings and metrics (rank 0), which never fails or stalls the run for long.

On when ``MLFLOW_TRACKING_URI`` is set (the workflow sets it to the SageMaker managed MLflow tracking server's ARN;
the ``sagemaker-mlflow`` plugin in the image signs the requests with the job's role). Experiment: the workflow
(``MLFLOW_EXPERIMENT_NAME``); run: the execution (``BLACKWELL_MLFLOW_RUN_NAME``). A later launch of the same
execution (a capacity relaunch, a resume) continues the same MLflow run, so its curves go on from the step where
the checkpoint was. The first error (server unreachable, no permission, a rejected value) prints one warning line
and turns MLflow off for the rest of the process; training goes on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from training.contract import container

DEFAULT_EXPERIMENT = "blackwell-training"

# MLflow's HTTP defaults (7 retries, backoff factor 2, 120 s timeout) can hold a step for many minutes when the
# server is unreachable; the job's environment may still set its own values.
_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
_MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter value


class MlflowLog:
    """One MLflow run of this execution: ``start`` finds or creates it, ``metrics`` and ``close`` log to it."""

    def __init__(self, tracking_uri: str, experiment: str, run_name: str | None, say: Callable[[str], None]):
        self.tracking_uri, self.experiment, self.run_name, self.say = tracking_uri, experiment, run_name, say
        self.run_id: str | None = None
        self._client: Any = None

    @classmethod
    def from_environment(
        cls, say: Callable[[str], None], environ: Mapping[str, str] = os.environ
    ) -> MlflowLog | None:
        uri = environ.get(container.MLFLOW_TRACKING_URI_ENV)
        if not uri:
            return None
        experiment = environ.get(container.MLFLOW_EXPERIMENT_ENV) or DEFAULT_EXPERIMENT
        return cls(uri, experiment, environ.get(container.MLFLOW_RUN_NAME_ENV) or None, say)

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def _guard(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as err:  # noqa: BLE001 - MLflow must never end the run
            reason = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
            self.say(
                f"warning: MLflow logging turned off for this run ({what} failed on {self.tracking_uri}: "
                f"{type(err).__name__}: {reason}); training continues"
            )
            self.run_id = None

    def start(self, settings: Mapping[str, Any]) -> None:
        """Find this execution's run in the experiment (or create both), then log the settings not logged yet."""
        self._guard("start", lambda: self._start(settings))

    def _start(self, settings: Mapping[str, Any]) -> None:
        for name, value in _HTTP_DEFAULTS.items():
            os.environ.setdefault(name, value)
        import mlflow  # only when MLflow is configured (about a second to import)
        from mlflow.entities import Param

        # the sagemaker-mlflow plugin signs requests for the process-wide tracking URI, not the client's
        mlflow.set_tracking_uri(self.tracking_uri)
        client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(self.experiment)
        run = None
        if self.run_name:
            quoted = self.run_name.replace("'", "\\'")
            runs = client.search_runs(
                [experiment_id],
                filter_string=f"attributes.run_name = '{quoted}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            run = runs[0] if runs else None
        if run is None:
            run = client.create_run(experiment_id, run_name=self.run_name)
            known: Mapping[str, str] = {}
        else:
            client.update_run(run.info.run_id, status="RUNNING")
            known = run.data.params
            self.say(
                f"MLflow: continuing run {self.run_name} ({run.info.run_id}) in experiment {self.experiment}"
            )
        # A parameter cannot change within an MLflow run: a relaunch with a changed setting keeps the first value.
        params = [
            Param(key, str(value)[:_MAX_PARAM_CHARS])
            for key, value in sorted(settings.items())
            if key not in known
        ]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 parameters
            client.log_batch(run.info.run_id, params=params[start : start + 100])
        self._client, self.run_id = client, run.info.run_id

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        if not self.active:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        batch = [Metric(key, float(value), stamp, step) for key, value in values.items()]
        self._guard("log_batch", lambda: self._client.log_batch(self.run_id, metrics=batch))

    def close(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, or KILLED when the job was stopped (a later launch sets it running again)."""
        if self.active:
            self._guard("set_terminated", lambda: self._client.set_terminated(self.run_id, status))
            self.run_id = None
