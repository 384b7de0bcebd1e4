"""Prepare a corpus into shards and one manifest: on a laptop, or on each instance of a SageMaker Processing job.

    python -m training.prepare.job --input corpus/ --output prepared/ --tokenizer tokenizer.json
    python -m training.prepare.job --input s3://bucket/raw/ --output s3://bucket/prepared/run1/ \\
        --tokenizer /opt/ml/processing/input/model/tokenizer.json          (in the Processing job)

In a Processing job each instance is handed its share of the input objects (``ShardedByS3Key``) under
``/opt/ml/processing/input/data`` (``--local-input``) and lists the whole input prefix to know every shard. It
prepares its objects in a process pool (one process per core, each with its own single-threaded tokenizer), each
worker writing its shard's files and then the shard's record (which marks it complete) straight to the output with
conditional writes (``store``: never an overwrite). A shard whose record is already there, with the same settings
and every file of the recorded size and SHA-256, is skipped: a rerun only does what is missing. The instance that
finds every shard complete writes the tokenizer files and then the manifest (``metadata.json``); an instance that
finishes earlier leaves that to the last.

A bad record stops the run with one line naming the object and the line (exit 2); the shards written before stay
complete and are skipped by the rerun. What the run writes depends only on the input objects and the settings
(``prepare.json``, written first): one instance or many, one worker or sixteen, give the same bytes.

On a laptop the same run is ``python -m training.prepare --sharded FILE_OR_FOLDER ... --output FOLDER``
(``prepare_local``): each file is the object its name below the folder given (or, named itself, its own name) would
be under ``input_uri``, so its output equals the Processing job's for the same objects and settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.prepare import sources
from training.prepare.chat_data import TEMPLATE_SECONDS
from training.prepare.kinds import KindError, file_sha256, make_kind, single_threaded
from training.prepare.shard import (
    RECORD_FILE,
    ShardError,
    record_name,
    settings_sha256,
    shard_id,
    write_shard,
)
from training.prepare.store import LocalStore, S3Store, Store, StoreError
from training.request import data_manifest as manifest
from training.request.data_manifest import MANIFEST_FILE, ManifestError

SETTINGS_FILE = "prepare.json"
PROCESSING_INPUT = "/opt/ml/processing/input/data"
"""Where a Processing job puts this instance's share of the input objects."""
EXIT_MESSAGE = "/opt/ml/output/message"
"""What a Processing container hands back: SageMaker returns the first 1 KB of this file (UTF-8) as the job's
``ExitMessage`` (DescribeProcessingJob), concatenated over the instances; its ``FailureReason`` is SageMaker's own
(AWS docs: "Save and Access Metadata Information About Your Processing Job")."""
MESSAGE_BYTES = 1024
PROCESSING_SCRATCH = "/opt/ml/processing/scratch"
"""Where a Processing job's workers write a shard's files before upload: on the volume SageMaker mounts for
``/opt/ml/processing`` (``VolumeSizeInGB``), not the container's root file system."""


@dataclass(frozen=True)
class Options:
    """What is prepared and how (the command line's options)."""

    kind: str = "text"
    tokenizer: str | None = None
    text_field: str = "text"
    init_from: str | None = None
    max_tokens: int | None = None
    too_long: str = "drop"
    validation_fraction: float = 0.01
    template_seconds: float = TEMPLATE_SECONDS
    """The longest one rendering of the chat template may take (it does not change what is written)."""

    def check(self) -> None:
        if not 0 <= self.validation_fraction < 0.5:
            raise KindError(f"validation-fraction: must be in [0, 0.5); got {self.validation_fraction}")
        if not self.template_seconds > 0:
            raise KindError(f"template-seconds: must be above 0; got {self.template_seconds}")


@dataclass
class Outcome:
    """What one instance did: shards prepared and skipped here, and whether it wrote the manifest."""

    prepared: int = 0
    skipped: int = 0
    tokens: int = 0
    source_bytes: int = 0
    seconds: float = 0.0
    complete: int = 0
    total: int = 0
    manifest: bool = False


_WORKER: dict[str, Any] = {}


def _start_worker(options: Options, store: Store, scratch: str) -> None:
    """A pool process: its own single-threaded tokenizer, loaded once."""
    single_threaded()
    _WORKER.update(kind=make_kind(options.kind, **asdict(options)), store=store, scratch=Path(scratch),
                   fraction=options.validation_fraction)  # fmt: skip


def prepare_one(key: str, path: str, settings_hash: str) -> dict[str, Any]:
    """Prepare and write one shard (in a pool process, or in this one); its record."""
    kind, store, scratch = _WORKER["kind"], _WORKER["store"], _WORKER["scratch"]
    folder = scratch / shard_id(key)
    try:
        record = write_shard(Path(path), key, kind, _WORKER["fraction"], folder)
        record["settings_sha256"] = settings_hash
        for entry in record["splits"].values():
            for file in entry["files"].values():
                store.put(file["name"], folder / Path(file["name"]).name, file["sha256"])
        body = folder / RECORD_FILE
        body.write_text(json.dumps(record, sort_keys=True, indent=1) + "\n")
        store.put(record_name(key), body, file_sha256(body))
        return record
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def complete_record(store: Store, key: str, settings_hash: str) -> dict[str, Any] | None:
    """The shard's record when the shard is complete: the record there, made with these settings, and every file
    it lists there with its size and SHA-256. ``StoreError`` for a shard made with other settings."""
    raw = store.get(record_name(key))
    if raw is None:
        return None
    record = json.loads(raw)
    if record.get("settings_sha256") != settings_hash:
        raise StoreError(f"{store.where}{record_name(key)}: the shard of {key} was prepared with other settings; "
                         "prepare into another output")  # fmt: skip
    for entry in record["splits"].values():
        for file in entry["files"].values():
            if store.head(file["name"]) != (file["bytes"], file["sha256"]):
                raise StoreError(f"{store.where}{file['name']}: not the bytes its record lists (size or SHA-256 "
                                 "differ); the output was changed: prepare into another output")  # fmt: skip
    return record


def run(options: Options, store: Store, all_keys: list[str], here: dict[str, Path], *, workers: int,
        say: Callable[[str], None] = print, scratch: str | None = None) -> Outcome:  # fmt: skip
    """Prepare the objects ``here`` (key -> local file; this instance's share of ``all_keys``) into ``store``,
    then write the manifest when every shard of ``all_keys`` is complete. Shards are written in a folder made
    under ``scratch`` (default: the system's temporary folder) and removed once uploaded."""
    options.check()
    kind = make_kind(options.kind, **asdict(options))
    settings = {**kind.settings(), "validation_fraction": options.validation_fraction}
    digest = settings_sha256(settings)
    if store.head(SETTINGS_FILE) is None and store.head(MANIFEST_FILE) is not None:
        raise StoreError(f"{store.where} holds a {MANIFEST_FILE} of another preparation (no {SETTINGS_FILE}: not "
                         "sharded); prepare into another output")  # fmt: skip
    _put_json(store, SETTINGS_FILE, settings)
    outcome, started = Outcome(total=len(all_keys)), time.monotonic()
    todo = []
    for key in sorted(here):
        if complete_record(store, key, digest) is None:
            todo.append(key)
        else:
            outcome.skipped += 1
    say(f"{len(here)} input objects here ({len(all_keys)} in all): {outcome.skipped} already complete, "
        f"{len(todo)} to prepare with {workers} processes")  # fmt: skip
    if scratch:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prepare-", dir=scratch) as folder:
        for record in _prepare_all(
            options, store, folder, [(k, str(here[k])) for k in todo], digest, workers
        ):
            outcome.prepared += 1
            outcome.tokens += sum(e["tokens"] for e in record["splits"].values())
            outcome.source_bytes += int(record["source_bytes"])
            elapsed = time.monotonic() - started
            tokens = sum(e["tokens"] for e in record["splits"].values())
            say(f"shard {outcome.prepared}/{len(todo)} {record['key']}: {tokens:,} tokens ({outcome.tokens:,} so far "
                f"here, {outcome.source_bytes / 1e6 / max(elapsed, 1e-9):.2f} MB/s of input)")  # fmt: skip
    outcome.seconds = time.monotonic() - started
    finish(kind, options, store, all_keys, digest, outcome, say)
    return outcome


def _prepare_all(options: Options, store: Store, scratch: str, tasks: list[tuple[str, str]], digest: str,
                 workers: int) -> Any:  # fmt: skip
    """Each task's record as it completes: in this process (``workers`` 1) or a pool; the first error stops all."""
    if workers <= 1 or len(tasks) <= 1:
        _start_worker(options, store, scratch)
        for key, path in tasks:
            yield prepare_one(key, path, digest)
        return
    with ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                             initargs=(options, store, scratch)) as pool:  # fmt: skip
        pending = {pool.submit(prepare_one, key, path, digest) for key, path in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    for other in pending:
                        other.cancel()
                    raise future.exception()  # type: ignore[misc]
                yield future.result()


def finish(kind: Any, options: Options, store: Store, all_keys: list[str], digest: str, outcome: Outcome,
           say: Callable[[str], None]) -> None:  # fmt: skip
    """Write the model files and the manifest when every shard is complete (whichever instance sees it first)."""
    names = store.listing(manifest.SHARDS)
    complete = [k for k in all_keys if record_name(k) in names]
    outcome.complete = len(complete)
    if len(complete) < len(all_keys):
        say(
            f"{len(complete)} of {len(all_keys)} shards complete: the last instance to finish writes the manifest"
        )
        return
    records = [json.loads(store.get(record_name(k)) or b"{}") for k in all_keys]
    settings = {**kind.settings()}
    meta = manifest.build(
        settings, records, validation_fraction=options.validation_fraction, settings_sha256=digest
    )
    problems = manifest.listing_problems(meta, names, store.where)
    if problems:
        raise StoreError(problems[0])
    for name, path in kind.model_files().items():
        store.put(name, path, file_sha256(path))
    outcome.manifest = _put_json(store, MANIFEST_FILE, meta)
    splits = ", ".join(f"{split} {entry['tokens']:,}" for split, entry in meta["splits"].items())
    say(f"manifest {store.where}{MANIFEST_FILE}: {len(records)} shards, {meta['tokens']:,} tokens ({splits})")


def _put_json(store: Store, name: str, value: Any) -> bool:
    """Write ``value`` as JSON (sorted keys: the same bytes from every instance) unless it is already there."""
    with tempfile.TemporaryDirectory(prefix="prepare-json-") as folder:
        path = Path(folder) / Path(name).name
        path.write_text(json.dumps(value, sort_keys=True, indent=1) + "\n")
        try:
            return store.put(name, path, file_sha256(path))
        except StoreError:
            if name == SETTINGS_FILE:
                raise StoreError(f"{store.where} was prepared with other settings ({SETTINGS_FILE} differs); "
                                 "prepare into another output, or delete the old output first") from None  # fmt: skip
            raise


def local_inputs(folder: Path) -> dict[str, Path]:
    """Every input file under ``folder`` by its key (its path below the folder, ``/``-separated)."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
            if p.is_file() and sources.is_input(p.name)}  # fmt: skip


def input_keys(inputs: list[str]) -> dict[str, Path]:
    """Local inputs by the key each would have under ``input_uri``: a folder's files by their path below it (what
    ``aws s3 sync FOLDER INPUT_URI`` names them), a file named itself by its name. ``KindError`` for a name that is
    neither, a file of no input format, two files with one key, or no input at all."""
    found: dict[str, Path] = {}
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            items = local_inputs(path)
        elif path.is_file() and sources.is_input(path.name):
            items = {path.name: path}
        elif path.is_file():
            raise KindError(f"input: {name} is not an input format ({', '.join(sources.SUFFIXES)}, optionally "
                            f"{' or '.join(sources.COMPRESSIONS)})")  # fmt: skip
        else:
            raise KindError(f"input: {name} is neither a file nor a folder")
        for key, file in items.items():
            if key in found:
                raise KindError(
                    f"input: {found[key]} and {file} would both be the object {key}; give each once"
                )
            found[key] = file
    if not found:
        raise KindError(f"input: no input objects in {', '.join(inputs)} (formats {', '.join(sources.SUFFIXES)}, "
                        f"optionally {' or '.join(sources.COMPRESSIONS)})")  # fmt: skip
    return found


def local_kind(inputs: list[str], init_from: str | None) -> str:
    """The kind a local ``--sharded`` run prepares, as local ``prepare`` tells it: ``text`` without
    ``--init-from``; with it ``pairs`` when the first input object's first record has ``chosen`` and ``rejected``
    (preference pairs), else ``chat``."""
    if not init_from:
        return "text"
    here = input_keys(inputs)
    key = min(here)
    try:
        first = next(sources.records(here[key], key, text_field=None), (None, None))[1]
    except sources.SourceError:
        return "chat"  # the run names the object and the line
    return "pairs" if isinstance(first, dict) and {"chosen", "rejected"} <= first.keys() else "chat"


def prepare_local(inputs: list[str], output: str, options: Options, *, workers: int,
                  say: Callable[[str], None] = print) -> dict[str, Any]:  # fmt: skip
    """``python -m training.prepare --sharded``: the Processing job's run on this machine, every input here, into
    the folder ``output``; the manifest. A run refused before any shard was complete leaves nothing behind in a
    folder it made (as local prepare); complete shards stay, for the same command to go on from."""
    here = input_keys(inputs)
    made = [p for p in (Path(output), *Path(output).parents) if not p.exists()]
    store = LocalStore(output)
    try:
        run(options, store, sorted(here), here, workers=workers, say=say)
    except BaseException:
        if made and not any(Path(output).glob(f"{manifest.SHARDS}*/{manifest.RECORD_FILE}")):
            shutil.rmtree(output, ignore_errors=True)
            for folder in made[1:]:  # the parents it made, deepest first, while empty
                try:
                    folder.rmdir()
                except OSError:
                    break
        raise
    return json.loads(store.get(MANIFEST_FILE) or b"{}")


def s3_keys(uri: str, client: Any) -> list[str]:
    """Every input object's key below the prefix ``uri`` (what ``ShardedByS3Key`` shares out)."""
    return sorted(k for k in S3Store(uri, client).listing() if sources.is_input(k) and not k.endswith("/"))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.model:  # a Processing job's model channel: the tokenizer (text) or the model folder (chat, pairs)
        args.tokenizer = args.tokenizer or (
            str(Path(args.model) / "tokenizer.json") if args.kind == "text" else None
        )
        args.init_from = args.init_from or (args.model if args.kind != "text" else None)
    options = Options(kind=args.kind, tokenizer=args.tokenizer, text_field=args.text_field, init_from=args.init_from,
                      max_tokens=args.max_tokens, too_long=args.too_long,
                      validation_fraction=args.validation_fraction, template_seconds=args.template_seconds)  # fmt: skip
    try:
        store, all_keys, here = _where(args)
        if not all_keys:
            raise KindError(
                f"input: no input objects under {args.input} (formats {', '.join(sources.SUFFIXES)})"
            )
        run(
            options,
            store,
            all_keys,
            here,
            workers=args.workers or os.cpu_count() or 1,
            say=lambda s: print(s, flush=True),
            scratch=args.scratch,
        )
    except (ShardError, KindError, ManifestError, StoreError, *_s3_errors()) as err:
        refuse(f"error: {err}", args.exit_message)
        return 2
    return 0


def _s3_errors() -> tuple[type[Exception], ...]:
    """botocore's errors (S3 refused or could not be reached), when botocore is there (not for a local run)."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415
    except ImportError:
        return ()
    return (ClientError, BotoCoreError)


def refuse(line: str, message_file: str | None) -> None:
    """The one error line on stderr (the job's log) and, in a Processing job, as its ``ExitMessage`` (the first
    ``MESSAGE_BYTES`` of ``message_file``, cut at a whole UTF-8 character)."""
    print(line, file=sys.stderr, flush=True)
    if message_file:
        path = Path(message_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(line.encode("utf-8")[:MESSAGE_BYTES].decode("utf-8", "ignore").encode("utf-8"))


def main_local(args: argparse.Namespace) -> int:
    """``python -m training.prepare --sharded ...`` (its parsed arguments): ``prepare_local``, then what was
    written and the trainer's options, as local ``prepare`` prints them."""
    refused = [option for option, given in (("--validation-file", args.validation_file),
                                            ("--block-tokens", args.block_tokens)) if given is not None]  # fmt: skip
    if refused:
        print(f"error: {', '.join(refused)}: not with --sharded (the split is by each record's hash: "
              "--validation-fraction)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        kind = local_kind(args.inputs, args.init_from)
        options = Options(kind=kind, tokenizer=args.tokenizer, text_field=args.text_field, init_from=args.init_from,
                          max_tokens=args.max_tokens, too_long=args.too_long,
                          validation_fraction=args.validation_fraction, template_seconds=args.template_seconds)  # fmt: skip
        meta = prepare_local(args.inputs, args.output, options, workers=args.workers or os.cpu_count() or 1,
                             say=lambda s: print(s, flush=True))  # fmt: skip
    except (ShardError, KindError, ManifestError, StoreError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    splits = ", ".join(f"{name} {entry['tokens']:,} tokens" for name, entry in meta["splits"].items())
    print(f"prepared {len(meta['shards'])} input objects into {args.output} (sharded, split by hash): {splits}; "
          f"tokenizer {meta['tokenizer']['name']}, vocab_size {meta['vocab_size']}, token_dtype {meta['token_dtype']}")  # fmt: skip
    if options.kind == "pairs":
        print(f"train with: --dataset channel --data_dir {args.output} --init_from {args.init_from} --token_dtype "
              f"{meta['token_dtype']} --seq_length {max(8, -(-meta['max_example_tokens'] // 8) * 8)} (at least)")  # fmt: skip
    elif options.kind == "chat":
        from training.prepare.chat import seq_length_advice  # noqa: PLC0415 - conversations only

        print(f"train with: --dataset channel --data_dir {args.output} --init_from {args.init_from} --token_dtype "
              f"{meta['token_dtype']} {seq_length_advice(meta, args.init_from)}")  # fmt: skip
    else:
        print(f"train with: --dataset channel --data_dir {args.output} --vocab_size {meta['vocab_size']} "
              f"--token_dtype {meta['token_dtype']}")  # fmt: skip
    return 0


def _where(args: argparse.Namespace) -> tuple[Store, list[str], dict[str, Path]]:
    """The output store, every input key, and this instance's input files."""
    if args.input.startswith("s3://"):
        import boto3  # noqa: PLC0415 - in the image and the CLI; not needed for a local run

        client = boto3.client("s3")
        if not args.input.endswith("/"):
            raise KindError(f"input: must be s3://bucket/prefix/ (ending in /); got {args.input}")
        all_keys = s3_keys(args.input, client)
        here = local_inputs(Path(args.local_input))
    else:
        here = local_inputs(Path(args.input))
        all_keys = sorted(here)
    if args.output.startswith("s3://"):
        import boto3  # noqa: PLC0415

        return S3Store(args.output, boto3.client("s3")), all_keys, here
    return LocalStore(args.output), all_keys, here


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.prepare.job", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--input", required=True, help="A folder, or s3://bucket/prefix/ in a Processing job."
    )
    parser.add_argument(
        "--output", required=True, help="A folder or s3://bucket/prefix/ (never overwritten)."
    )
    parser.add_argument(
        "--local-input", default=PROCESSING_INPUT, help="This instance's share of an S3 input."
    )
    parser.add_argument(
        "--kind",
        default="text",
        choices=("text", "chat", "pairs"),
        help="What the records are (default text).",
    )
    parser.add_argument("--tokenizer", help="A local tokenizer.json (text; default byte-level).")
    parser.add_argument(
        "--text-field", default="text", help="JSON Lines field / Parquet column of a document."
    )
    parser.add_argument("--init-from", help="A model folder with its chat template (chat, pairs).")
    parser.add_argument(
        "--model", help="A folder with tokenizer.json (text) or a chat model's files (chat, pairs)."
    )
    parser.add_argument(
        "--max-tokens", type=_limit, help="Longest example kept (chat; pairs: both sequences; default none)."
    )
    parser.add_argument(
        "--too-long", default="drop", choices=("drop", "truncate"), help="Above --max-tokens (chat, pairs)."
    )
    parser.add_argument(
        "--validation-fraction", type=float, default=0.01, help="Share held out by hash (0.01)."
    )
    parser.add_argument(
        "--template-seconds", type=float, default=TEMPLATE_SECONDS,
        help=f"The longest one rendering of the chat template may take (chat; default {TEMPLATE_SECONDS:g}).",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, help="Processes (default: one per core).")
    parser.add_argument(
        "--scratch", help=f"Where shards are written before upload (a Processing job: {PROCESSING_SCRATCH})."
    )
    parser.add_argument(
        "--exit-message", help=f"Where an error line also goes (a Processing job: {EXIT_MESSAGE})."
    )
    return parser


def _limit(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


if __name__ == "__main__":
    sys.exit(main())
