"""What a run reports: throughput, MFU and memory (``metrics``), the loss and progress between log lines
(``progress``), and the trackers it logs to (``tracking``: TensorBoard through ``tensorboard``, MLflow through
``mlflow_log``)."""
