"""Tuning: one SageMaker job runs many short trials of the trainer and ranks them.

``python -m training.tune`` (``train.sh`` runs it when the job has the ``tune_trials`` hyperparameter) is the
driver: it runs each trial as a fresh ``train.sh`` (so a fresh ``torchrun``) of :mod:`training.tune.trial`, with a
hard timeout and its whole process group killed after it, measures it, and writes the ranked table, the charts,
the measurement records and the winning request. Nothing here imports ``constructs_lib``.
"""
