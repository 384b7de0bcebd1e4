"""Time one training step with the loss unchunked and chunked, by process CPU time: the benchmark's tiny model
(forward, backward, gradient clipping, AdamW), one thread, interleaved rounds, so that other processes on a shared
machine do not decide the comparison (``make bench``'s wall-clock figures move by tens of percent there).

    python -m training.measure.loss_step_time            # loss_chunk_tokens 0, the default, and 32 (several chunks)

Prints the median step time per cell and the change against unchunked; asserts nothing.
"""

from __future__ import annotations

import statistics
import time

import torch

from training.contract import settings_table
from training.measure.benchmark import TINY
from training.models import settings as model_settings
from training.trainer.checkpoint import weights
from training.trainer.distributed import activation_checkpoint
from training.trainer.model import decoder

SEQ = 64
CHUNKS = (0, settings_table.LOSS_CHUNK_TOKENS_DEFAULT, 32)


def median_step_seconds(chunk: int, batch: int, ac: bool, steps: int = 60, skip: int = 5) -> float:
    shape = model_settings.model_config(TINY)  # the Llama of these flat settings, as the trainer builds it
    torch.manual_seed(0)
    net = decoder.build_model(
        shape,
        use_te=False,
        te_params_dtype=torch.float32,
        loss_chunk_tokens=chunk,
    )
    activation_checkpoint.apply(net.layers, "full" if ac else "none")
    net.to_empty(device="cpu")
    weights.initialize(net, seed=1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    tokens = torch.randint(0, shape.vocab_size, (batch, SEQ))
    targets = torch.randint(0, shape.vocab_size, (batch, SEQ))
    times = []
    for _ in range(steps):
        start = time.process_time()
        net(tokens, targets).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.process_time() - start)
    return statistics.median(times[skip:])


def main(rounds: int = 5) -> int:
    torch.set_num_threads(1)
    print(f"tiny model, seq {SEQ}, fp32, 1 thread, median of {rounds} interleaved rounds of 55 timed steps")
    for batch in (1, 4):
        for ac in (False, True):
            runs: dict[int, list[float]] = {chunk: [] for chunk in CHUNKS}
            for _ in range(rounds):
                for chunk in CHUNKS:
                    runs[chunk].append(median_step_seconds(chunk, batch, ac))
            base = statistics.median(runs[0])
            cells = [
                f"chunk {chunk}: {statistics.median(v) * 1e3:.2f} ms ({100 * (statistics.median(v) / base - 1):+.1f}%)"
                for chunk, v in runs.items()
            ]
            print(f"batch {batch} ac {'on' if ac else 'off'}: " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
