"""Preference tuning (``objective`` dpo): the DPO losses (``losses``), the reference model's log-probabilities
computed once or with the LoRA adapters switched off (``reference``), and the objective the training loop runs
(``dpo``: its micro-batches of whole pairs, its step and its validation). The data are ``data.pairs``'."""
