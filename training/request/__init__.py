"""What decides a training request before launch, in one place: ``decision.decide_request``, the one function the
workflow's Lambda, the operator CLI, the SDK path and the construct call, and the parts it runs in order: the input
fields' table (``fields``), what a deployment allows (``rules``), the input read once (``value``), the checks
(``checks``, ``evaluate_block``, ``tune_block``), a tuning run's candidates and plan (``tuning``, ``tuning_plan``),
the reads (``reads``) and the job's request fields (``job``). It reads the one contract between the workflow and the
trainer (``training.contract``) and the plan (``training.plan``). Standard library only: it runs in the
request-check Lambda, the CLI and the CDK synth; the training image takes only ``hf_config`` and ``sft_data`` of it
(docs/request.md)."""
