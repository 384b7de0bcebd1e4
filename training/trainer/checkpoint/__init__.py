"""What a run saves and loads: checkpoints, the stop flag and the final model file (``checkpoint``; to be split by
the S3 checkpoint work), every parameter's value from an ``init_from`` model or a seed (``weights``), and the
exports of a finished run: the Hugging Face folder (``export_hf``), the PEFT adapter folder (``export_peft``) and the
chat template they carry (``chat_export``)."""
