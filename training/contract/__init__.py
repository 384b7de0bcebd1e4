"""The one contract between the infrastructure (``constructs_lib``) and the trainer (``training.trainer``), by concern:
everything that crosses from a Step Functions execution to the trainer's log lines is named here, once.

* ``hardware``: the precisions and which GPUs run them, the GPU training instance types, their prices and peaks;
* ``container``: the fixed paths, channels, file names, entry points and environment variables of the container;
* ``shapes``: the model's shape, its presets and FLOPs (until ``training/models/`` replaces them);
* ``settings_table``: the hyperparameters SageMaker passes to ``train.sh`` (names, types, ranges, allowed values,
  defaults); ``settings_checks``: the rules across them; ``settings_parse``: raw settings -> parsed ones;
* ``tuning``: a tuning job's names; ``evaluation``: an evaluation job's;
* ``metric_lines``: the lines the trainer prints and the regexes SageMaker's ``MetricDefinitions`` read them with.

Pure Python (standard library only, no torch): the CDK app imports it at synth time, the request check in its Lambda
and the trainer at run time. Nothing here imports ``constructs_lib`` or the rest of ``training``. No module here
re-exports another's names: import each from the module that holds it.
"""
