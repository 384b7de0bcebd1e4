"""One trial of a tuning run, under torchrun (``train.sh`` with ``TRAINER_MODULE=training.tune.trial``).

The trainer's own run (:func:`training.trainer.loop.run`, the same settings, data, checkpoint save and summary
line), with two differences: no model file or Hugging Face export at the end (a trial is a measurement), and rank 0
watches its own step lines and, once the step time is stable (:class:`training.tune.stability.Stability`, from the
driver's environment variables), sends itself SIGTERM: the trainer's stop flag makes every rank stop at the same
step, save one checkpoint and print its summary, exactly as a stopped job does.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

import torch.distributed as dist

from training.contract import metric_lines
from training.trainer import config, loop
from training.trainer.__main__ import exit_now
from training.trainer.distributed import parallel
from training.tune.stability import Stability, cv, from_environment


class StopWhenStable:
    """An ``emit`` for the trainer's lines (rank 0's): prints each line, keeps the timed step times, and asks the
    run to stop (SIGTERM to this process) the first time they are stable."""

    def __init__(
        self, stability: Stability, emit: Callable[[str], None] = print, max_steps: int | None = None
    ) -> None:
        self.stability, self.emit, self.max_steps = stability, emit, max_steps
        self.times: list[float] = []
        self.asked = False

    def __call__(self, line: str) -> None:
        self.emit(line)
        parsed = metric_lines.parse_step_line(line)
        if parsed is None or "step_time" not in parsed[1]:
            return
        self.times.append(parsed[1]["step_time"])
        last = self.max_steps is not None and parsed[0] >= self.max_steps  # the run ends there anyway
        if not self.asked and not last and self.stability.stable(self.times):
            self.asked = True
            window = self.times[-self.stability.window :]
            self.emit(
                f"tune: step time stable at step {parsed[0]} (cv {cv(window):.2%} over the last {len(window)} timed "
                f"steps, target {self.stability.cv_target:.2%}): stopping"
            )
            os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    cfg, _ = config.parse_args(argv)
    env = parallel.init_distributed()
    watcher = StopWhenStable(
        from_environment(dict(os.environ)), lambda line: print(line, flush=True), max_steps=cfg.max_steps
    )
    loop.run(cfg, env, emit=watcher, final_save=False)
    dist.barrier(group=env.cpu_group)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    exit_now(main())
