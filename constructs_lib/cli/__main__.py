"""``python -m constructs_lib.cli``: the same as the ``blackwell-training`` console script."""

from constructs_lib.cli.main import console_script

console_script()
