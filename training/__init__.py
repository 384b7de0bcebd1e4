"""Everything on the training side, by role (the folder is also the training image's Docker build context):

* ``training/request/``: what decides a request before anything launches: the contract between the workflow and
  the trainer (``contract.py``: settings, presets, GPUs, metric lines) and the memory/time/cost plan
  (``plan.py``). Pure Python, no torch: the request-check Lambda's asset carries it, the CLI and the synth import it,
  and the image has what the container reads of it (the contract, ``hf_config.py``; not ``plan.py``).
* what runs in the container: ``Dockerfile``, ``train.sh`` (the SageMaker entry point), ``entrypoint.sh`` (PID 1),
  the pinned ``requirements.txt`` / ``image-requirements.txt``, ``training/trainer/`` (the FSDP2 trainer), and
  ``evaluate.sh`` with ``training/evaluate/`` (the evaluation job).
* ``training/measure/``: development measurements (benchmark, memory tracer, plan agreement, loss tables, exit-status
  check), run on a developer's machine. Never in the image: ``.dockerignore`` (the one list, which the image build's
  source asset reads too) leaves the folder out, so a change there neither rebuilds the image nor changes its tag;
  so are the data-preparation scripts (``prepare/corpus.py``, ``evaluate/prepare_tasks.py``), run before any job.

Arrows point one way: ``measure`` -> ``trainer`` -> ``request``; nothing here imports ``constructs_lib``.
"""
