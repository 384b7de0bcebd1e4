"""Packing efficiency: trained tokens per ``seq_length`` window, packed (best-fit decreasing, ``training.trainer.
packing``) against one example per padded window, as a Markdown table row per data set.

    python -m training.measure.packing_efficiency --data example/data --seq 256
    python -m training.measure.packing_efficiency --lognormal 512,1.0 --examples 20000 --trained 0.4 --seq 4096

``--data``: a folder made by ``prepare --init-from`` (its train split's example lengths and loss mask). The
log-normal source is a stand-in length distribution (median and sigma of the natural log; lengths clipped to [16,
seq]) with ``--trained`` of each example's tokens trained: an assumption of what instruction data looks like, not a
measurement of a data set. Compute per window is the same either way, so the ratio of trained tokens per window is
the speed-up in trained tokens per second that packing gives.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from training.trainer.data import packing, token_files


def measure(lengths: np.ndarray, trained: np.ndarray, seq: int) -> dict[str, float]:
    """Windows, fill and trained tokens per window, packed and padded, for examples of ``lengths`` tokens of
    which ``trained`` are trained."""
    windows = packing.best_fit_decreasing(lengths, seq)
    total, trained_total = float(lengths.sum()), float(trained.sum())
    return {
        "examples": len(lengths),
        "windows_packed": len(windows),
        "windows_padded": len(lengths),
        "fill_packed": total / (len(windows) * seq),
        "fill_padded": total / (len(lengths) * seq),
        "trained_packed": trained_total / len(windows),
        "trained_padded": trained_total / len(lengths),
    }


def from_data(directory: str, seq: int) -> tuple[np.ndarray, np.ndarray]:
    _, mask, offsets = packing.read_split(directory, "train", _dtype(directory))
    lengths = np.diff(offsets)
    trained = np.add.reduceat(np.asarray(mask, dtype=np.int64), offsets[:-1]) if len(lengths) else lengths
    return lengths, trained


def _dtype(directory: str) -> str:
    return str((token_files.read_metadata(directory) or {}).get("token_dtype", "uint16"))


def from_lognormal(
    spec: str, examples: int, trained: float, seq: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    median, sigma = (float(x) for x in spec.split(","))
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(median), sigma, examples)), 16, seq).astype(np.int64)
    return lengths, np.round(lengths * trained).astype(np.int64)


HEADER = (
    "| data | seq_length | examples | windows packed / padded | fill packed / padded | trained tokens per window "
    "packed / padded | packed / padded |\n|---|---:|---:|---:|---:|---:|---:|"
)


def row(name: str, seq: int, result: dict[str, float]) -> str:
    return (
        f"| {name} | {seq} | {result['examples']:,} | {result['windows_packed']:,} / {result['windows_padded']:,} | "
        f"{result['fill_packed']:.1%} / {result['fill_padded']:.1%} | {result['trained_packed']:.1f} / "
        f"{result['trained_padded']:.1f} | {result['trained_packed'] / result['trained_padded']:.2f}x |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.packing_efficiency", description=__doc__
    )
    parser.add_argument("--data", help="A folder prepared with --init-from.")
    parser.add_argument("--lognormal", help="MEDIAN,SIGMA of a log-normal length distribution.")
    parser.add_argument("--examples", type=int, default=20000)
    parser.add_argument("--trained", type=float, default=0.4, help="Share of each example's tokens trained.")
    parser.add_argument("--seq", type=int, required=True)
    args = parser.parse_args(argv)
    if bool(args.data) == bool(args.lognormal):
        parser.error("give --data or --lognormal")
    if args.data:
        lengths, trained = from_data(args.data, args.seq)
        name = args.data
    else:
        lengths, trained = from_lognormal(args.lognormal, args.examples, args.trained, args.seq)
        name = f"log-normal median {args.lognormal.split(',')[0]}, sigma {args.lognormal.split(',')[1]}"
    print(HEADER)
    print(row(name, args.seq, measure(lengths, trained, args.seq)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
