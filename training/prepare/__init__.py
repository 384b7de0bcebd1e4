"""Data preparation, run where the data is, before any job: text files or JSON Lines -> the trainer's token files
(``corpus``: ``python -m training.prepare``), conversations -> conversation data through the model's own chat template
(``chat``, ``chat_data``: ``python -m training.prepare ... --init-from MODEL``), and a tokenizer trained on your own
text (``tokenizer``: ``python -m training.prepare.tokenizer``).

At scale, the same preparation runs where the data lives (``job``: a SageMaker Processing job over many instances,
each its share of the S3 objects, a process per core): input objects (``sources``) become shards (``shard``, each
record split by its own hash, ``kinds``), written without overwriting (``store``), and one manifest (``manifest``),
byte for byte the same whichever instances made them; ``plan`` sizes it before launch."""
