"""``blackwell-training``: operate training runs from a terminal, and the Python API it is built on.

It lives in ``constructs_lib`` because it operates what these constructs deploy (the workflow's state machine, found
through the stack's outputs; its training jobs and their logs) and ships in the same wheel; the top level of the
repository is fixed. Nothing here imports ``aws_cdk`` (jsii starts node, which would cost seconds per command).
It is a part of its own, beside ``workflow``, ``image``, ``storage`` and ``identity`` rather than inside one: it is
the operator's package (it operates the whole deployment, not one construct), and of the parts it uses only their
pure modules (``workflow.request_check``, ``_shared.console_links``), never a construct.

* :mod:`constructs_lib.cli.api`: :class:`~constructs_lib.cli.api.TrainingRuns`, the operations (submit, runs,
  watch, logs, stop, result) over boto3;
* :mod:`constructs_lib.cli.progress`: the trainer's progress read from its log lines (the contract's formats);
* :mod:`constructs_lib.cli.main`: the argparse and rich front end (``blackwell-training``).
"""
