"""Helpers that several parts share, and nothing else: cdk-nag packs and acknowledgements (``nag``), subnet
selections (``subnets``), customer-keyed log groups (``log_keys``), Amazon States Language text (``asl``), AWS
console links of a run (``console_links``), and the lazy re-exports of the package ``__init__`` files (``lazy``).

This ``__init__`` imports nothing: ``asl``, ``console_links`` and ``lazy`` are pure Python, which the operator CLI
imports without loading aws_cdk; the other modules use aws_cdk.
"""
