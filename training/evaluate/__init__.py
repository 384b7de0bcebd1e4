"""What an evaluation job runs in the training image: lm-evaluation-harness on a finished run's Hugging Face
export, offline, over a local task folder.

* ``run.py``: the job's entry point (``python -m training.evaluate``, started by ``evaluate.sh``): settings, offline
  switches, the model, the tasks, the scores and where they go;
* ``model_folder.py``: the Hugging Face folder out of a training job's ``model.tar.gz``, and its tokenizer check;
* ``harness.py``: lm-eval itself (task index of the folder, ``HFLM``, ``simple_evaluate``, the scores);
* ``standard_tasks.py`` and ``prepare_tasks.py``: the standard small-model set (hellaswag, arc_easy, piqa,
  winogrande) as local task definitions, and the command that writes them with their public data.

Arrows: ``evaluate`` -> ``trainer`` (the failure file, MLflow) -> ``request`` (the contract).
"""
