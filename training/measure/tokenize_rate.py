"""Tokenization rate per core: the Rust tokenizer alone, local ``prepare`` and the Processing script, on real text.

    python -m training.measure.tokenize_rate --tokenizer llama3/tokenizer.json \\
        --wikipedia enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2 [--news lee_background.cor]

The corpus is English Wikipedia as its dump stores it (wikitext: article prose with its markup, each ``<page>``'s
``<text>`` one document) and, with ``--news``, one news story a line; it is cut into ``--objects`` JSON Lines objects
(the shape a Processing job's instances are handed). Three ways, each repeated ``--repeats`` times after one
warm-up run (discarded), alternating, the median and the spread (min to max) printed:

* ``tokenizer``: ``Tokenizer.encode_batch`` over the documents in memory, single-threaded (``RAYON_NUM_THREADS=1``,
  ``TOKENIZERS_PARALLELISM=false``): the ceiling of one core;
* ``local prepare``: ``training.prepare.corpus.prepare`` (one process: read, tokenize, write ``train.bin``);
* ``processing script``: ``training.prepare.job.run`` with one process (read the objects, tokenize, split by hash,
  hash and write the shards, records, manifest) into a local folder, and with ``--workers`` processes (the pool).

MB counts the UTF-8 bytes of the documents' text (not the JSON around them); tokens the tokens written. Rates are
given per CPU-second the run used (this process and its pool's processes: ``getrusage``), which other programs'
load on a shared machine does not change, and per wall-clock second. It prints numbers and asserts nothing.
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path


def wikipedia_documents(path: Path) -> list[str]:
    """Each page's wikitext of a MediaWiki XML dump (bz2), in the dump's order."""
    with bz2.open(path, "rb") as handle:
        root = ET.parse(handle).getroot()
    texts = [e.text or "" for e in root.iter() if e.tag.endswith("}text") or e.tag == "text"]
    return [t for t in texts if t.strip()]


def write_objects(docs: list[str], folder: Path, objects: int) -> int:
    """``docs`` cut into ``objects`` JSON Lines files (whole documents each); their text bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-len(docs) // objects)
    for index in range(objects):
        part = docs[index * per : (index + 1) * per]
        (folder / f"part-{index:04d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    return sum(len(d.encode("utf-8")) for d in docs)


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the pool's processes, once shut down)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(run, folder: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, tokens) of one run over ``folder``."""
    started, cpu = time.perf_counter(), cpu_seconds()
    tokens = run(folder)
    return time.perf_counter() - started, cpu_seconds() - cpu, tokens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = _parser().parse_args(argv)
    if not args.wikipedia and not args.news:
        _parser().error("give --wikipedia, --news or both")
    return args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.measure.tokenize_rate", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--tokenizer", required=True, help="A tokenizer.json (a Llama 3 one for the published figure)."
    )
    parser.add_argument("--wikipedia", help="A MediaWiki XML dump, bz2.")
    parser.add_argument("--news", help="More English text, one document a line.")
    parser.add_argument(
        "--objects", type=int, default=8, help="JSON Lines objects to cut the corpus into (8)."
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="Timed runs of each way after the warm-up (3)."
    )
    parser.add_argument("--copies", type=int, default=1, help="Repeat the documents (a longer steady state).")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Processes of the pool run.")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    from tokenizers import Tokenizer  # noqa: PLC0415 - after the thread settings

    from training.prepare import corpus as local  # noqa: PLC0415
    from training.prepare import job  # noqa: PLC0415
    from training.prepare.store import LocalStore  # noqa: PLC0415

    docs = wikipedia_documents(Path(args.wikipedia)) if args.wikipedia else []
    if args.news:
        docs += [line for line in Path(args.news).read_text(encoding="utf-8").splitlines() if line.strip()]
    docs = docs * args.copies
    scratch = Path(tempfile.mkdtemp(prefix="tokenize-rate-"))
    text_bytes = write_objects(docs, scratch / "corpus", args.objects)
    write_objects(docs[: args.workers], scratch / "one", args.workers)  # one document per pool process
    tokenizer = Tokenizer.from_file(args.tokenizer)
    print(f"corpus: {len(docs)} documents ({args.copies} copies), {text_bytes / 1e6:.2f} MB of UTF-8 text in "
          f"{args.objects} objects; tokenizer {args.tokenizer} (vocabulary {tokenizer.get_vocab_size()}); "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    counter = iter(range(10**6))

    def tokenizer_alone(folder: Path) -> int:
        texts = docs if folder.name == "corpus" else docs[: args.workers]
        return sum(
            len(e.ids) for i in range(0, len(texts), 64) for e in tokenizer.encode_batch(texts[i : i + 64])
        )

    def local_prepare(folder: Path) -> int:
        out = scratch / f"local-{next(counter)}"
        meta = local.prepare([str(folder)], str(out), args.tokenizer, validation_fraction=0, block_tokens=256)
        shutil.rmtree(out)
        return int(meta["tokens"])

    def processing(workers: int):
        def run(folder: Path) -> int:
            out, here = scratch / f"job-{next(counter)}", job.local_inputs(folder)
            options = job.Options(tokenizer=args.tokenizer, validation_fraction=0)
            done = job.run(options, LocalStore(out), sorted(here), here, workers=workers, say=lambda s: None)
            shutil.rmtree(out)
            return done.tokens

        return run

    load = os.getloadavg()
    ways = {"tokenizer (1 core)": (tokenizer_alone, 1), "local prepare (1 process)": (local_prepare, 1),
            "processing script (1 process)": (processing(1), 1),
            f"processing script ({args.workers} processes)": (processing(args.workers), args.workers)}  # fmt: skip
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in ways}
    fixed: dict[str, list[tuple[float, float, int]]] = {name: [] for name in ways}
    for repeat in range(args.repeats + 1):
        for name, (run, _) in ways.items():
            took, start = timed(run, scratch / "corpus"), timed(run, scratch / "one")
            if repeat:  # the first round warms caches and is discarded
                results[name].append(took)
                fixed[name].append(start)
    print(f"load average before: {load}; after: {os.getloadavg()}. Rates per CPU-second (this process and its "
          "pool's, getrusage: other programs' load does not count) of the steady state: the corpus's run less a "
          "one-document run's (loading the tokenizer, starting the pool); wall-clock rates include it all.")  # fmt: skip
    print(
        f"{'way':34} {'MB per CPU-second':>22} {'tokens per CPU-second':>22} {'wall MB/s':>18} {'start CPU-s':>12}"
    )
    for name in ways:
        steady = [(c - f[1], n) for (_, c, n), f in zip(results[name], fixed[name], strict=True)]
        cpu = [text_bytes / 1e6 / c for c, _ in steady]
        tokens_cpu = [n / c for c, n in steady]
        wall = [text_bytes / 1e6 / w for w, _, _ in results[name]]
        print(f"{name:34} {statistics.median(cpu):8.2f} ({min(cpu):.2f}-{max(cpu):.2f}) "
              f"{statistics.median(tokens_cpu):22,.0f} {statistics.median(wall):8.2f} ({min(wall):.2f}-{max(wall):.2f})"
              f" {statistics.median(f[1] for f in fixed[name]):12.2f}")  # fmt: skip
    tokens = results["processing script (1 process)"][0][2]
    print(
        f"bytes per token: {text_bytes / tokens:.3f} (the processing script's tokens, end-of-document included)"
    )
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
