"""The trainer's fixtures the measurements' tests share (a world of one process for the benchmark's loops)."""

from tests.training.conftest import process_group  # noqa: F401 (a fixture, used by name)
