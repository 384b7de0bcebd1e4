"""Everything on the training side, by role (the folder is also the training image's Docker build context):

* what decides a request before anything launches, pure Python, no torch (the request-check Lambda's asset carries
  it, the CLI and the synth import it): ``training/contract/`` (the one contract between the workflow and the
  trainer, by concern: settings, hardware and prices, the container's names, model shapes, metric lines),
  ``training/plan/`` (the memory/time/cost plan, by job) and ``training/request/`` (the decision). The image has what
  the container reads of them (the contract, the plan's estimate, ``hf_config.py``, ``sft_data.py``).
* what runs in the container: ``Dockerfile``, ``train.sh`` (the SageMaker entry point), ``entrypoint.sh`` (PID 1),
  the pinned ``requirements.txt`` / ``image-requirements.txt``, ``training/trainer/`` (the FSDP2 trainer, by role:
  ``model/``, ``data/``, ``checkpoint/``, ``distributed/``, ``observe/``), ``training/tune/`` (the tuning driver),
  and ``evaluate.sh`` with ``training/evaluate/`` (the evaluation job).
* ``training/prepare/``: data preparation (``python -m training.prepare``), run where the data is, before any job.
* ``training/measure/``: development measurements (benchmark, memory tracer, plan agreement, loss tables, exit-status
  check), run on a developer's machine. Never in the image: ``.dockerignore`` (the one list, which the image build's
  source asset reads too) leaves the folder out, so a change there neither rebuilds the image nor changes its tag;
  so are ``prepare/`` and ``evaluate/prepare_tasks.py``, run before any job.

Arrows point one way: ``measure`` -> ``trainer`` -> ``request`` -> ``plan`` -> ``contract``; nothing here imports
``constructs_lib``.
"""
