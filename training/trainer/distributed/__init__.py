"""Distribution and precision: the process group and FSDP2 sharding (``parallel``), the cluster's hosts and the
launcher (``cluster``, ``launch``), activation checkpointing (``activation_checkpoint``), ``torch.compile``
(``compile``), the precision's recipe (``precision``) and fp32 master weights (``master_weights``), and the step's
overheads (``levers``)."""
