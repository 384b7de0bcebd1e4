"""``blackwell-training``: operate training runs from a terminal, and the Python API it is built on.

It lives in ``constructs_lib`` because it operates what these constructs deploy (the workflow's state machine, found
through the stack's outputs; its training jobs and their logs) and ships in the same wheel; the top level of the
repository is fixed. Nothing here imports ``aws_cdk`` (jsii starts node, which would cost seconds per command).
It is a part of its own, beside ``workflow``, ``image``, ``storage`` and ``identity`` rather than inside one: it is
the operator's package (it operates the whole deployment, not one construct), and of the parts it uses only their
pure modules (``workflow.launch_request``, ``_shared.console_links``) and what decides a request
(``training.request.decision``), never a construct.

The Python API (no terminal output):

* :mod:`constructs_lib.cli.api`: :class:`~constructs_lib.cli.api.TrainingRuns`, the operations (submit, runs,
  watch, logs, stop, result, curves, shell) over boto3; what it reads is assembled by small modules:
  ``history`` (an execution's training jobs), ``job_logs`` (their CloudWatch log lines), ``progress`` (the
  trainer's progress from those lines, in the contract's formats), ``summary`` (a run's result), ``curves`` (loss
  and throughput curves), ``remote_shell`` (the SSM command), ``direct`` (the SageMaker Python SDK path),
  ``records`` (runs, jobs, log events), ``request`` (reading, ``--set`` and validating a request).

The command line (``blackwell-training``):

* :mod:`constructs_lib.cli.main`: the parser and the exit statuses; ``shell`` (one command's context and shared
  arguments); ``commands/`` (the subcommands by what the user does: ``launch`` validate/plan/submit,
  ``follow`` runs/watch/logs/stop/shell, ``results`` result/curves); ``render`` and ``plots`` (what is printed
  and drawn).
"""
