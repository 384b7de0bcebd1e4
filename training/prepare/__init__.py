"""Data preparation, run where the data is, before any job: text files or JSON Lines -> the trainer's token files
(``corpus``: ``python -m training.prepare``), conversations -> conversation data through the model's own chat template
(``chat``, ``chat_data``: ``python -m training.prepare ... --init-from MODEL``), and a tokenizer trained on your own
text (``tokenizer``: ``python -m training.prepare.tokenizer``)."""
