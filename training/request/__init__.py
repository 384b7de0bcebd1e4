"""What decides a training request before launch, in one place: ``decision.decide_request``, the one function the
workflow's Lambda, the operator CLI, the SDK path and the construct call, and the parts it runs in order: the input
fields' table (``fields``), what a deployment allows (``rules``), the input read once (``value``), the checks
(``checks``, ``evaluate_block``, ``tune_block``), a tuning run's candidates (``tuning``), the plan (``plan``,
``measured``), the reads (``reads``) and the job's request fields (``job``); ``contract`` is the one contract
between the workflow and the trainer. Standard library only: it runs in the request-check Lambda, the CLI and the
CDK synth; the training image takes only ``contract``, ``hf_config``, ``measured`` and ``plan`` (docs/request.md)."""
