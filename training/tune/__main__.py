"""``python -m training.tune``: the tuning driver (:mod:`training.tune.driver` reads the settings and runs each
trial, :mod:`training.tune.session` runs them all and writes the report)."""

from __future__ import annotations

import os
import signal
import sys

from training.contract import settings_table
from training.trainer import refusal
from training.tune import driver, session
from training.tune.hosts import SHARE_PORT_OFFSET, Hosts


def main(argv: list[str] | None = None) -> int:
    try:
        job = driver.parse_args(list(sys.argv[1:] if argv is None else argv))
    except settings_table.ContractError as err:
        return refusal.refuse(f"invalid setting {err}", report=True)
    signal.signal(signal.SIGTERM, driver.on_sigterm(job))
    share_port = int(os.environ.get("MASTER_PORT", "29500")) + SHARE_PORT_OFFSET
    return session.run(job, Hosts.from_environment(), share_port=share_port)


if __name__ == "__main__":
    sys.exit(main())
