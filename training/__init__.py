"""Everything on the training side, by role (the folder is also the training image's Docker build context):

* ``training/request/``: what decides a request before anything launches: the contract between the workflow and
  the trainer (``contract.py``: settings, presets, GPUs, metric lines) and the memory/time/cost plan
  (``plan.py``). Pure Python, no torch: the request-check Lambda's asset carries it, the CLI and the synth import it,
  and the image has it (the trainer reads the contract).
* what runs in the container: ``Dockerfile``, ``train.sh`` (the SageMaker entry point), ``entrypoint.sh`` (PID 1),
  the pinned ``requirements.txt`` / ``image-requirements.txt``, and ``training/trainer/`` (the FSDP2 trainer).
* ``training/measure/``: development measurements (benchmark, memory tracer, plan agreement, loss tables, exit-status
  check), run on a developer's machine. Never in the image: ``.dockerignore`` and the image build's source asset
  leave the folder out, so a change there neither rebuilds the image nor changes its tag.

Arrows point one way: ``measure`` -> ``trainer`` -> ``request``; nothing here imports ``constructs_lib``.
"""
