"""Development measurements, run on a developer's machine (``make bench``, ``python -m training.measure.<name>``):
the trainer's benchmark, the FSDP2 memory tracer, the plan's agreement table, the chunked-loss tables and the
exit-status check. Not part of the training image (left out of its build context and of its asset hash)."""
