"""The training batches: token files and synthetic tokens (``token_files``) and conversation data packed into
windows (``packing``)."""
