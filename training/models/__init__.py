"""The model families the trainer builds, imports and exports: one typed ``ModelConfig`` (``config``) read from a
Hugging Face ``config.json`` or a named size, one folder per family (its config.json reading and writing, its
Hugging Face tensor names, its named sizes) and the registry that picks a family (``registry``).

Pure Python, standard library only: the request check's Lambda and the trainer's image both read it, so the plan
before launch and the model in the job come from the same config.
"""
