"""``torch.compile`` of each block's forward (and of the chunked loss's per-chunk body), with a fallback to eager.

Per-block compilation as torchtitan's ``distributed/compile.py`` does it (read, not copied): the blocks repeat, so
one compiled graph serves them all, and the FSDP2 hooks stay outside the compiled region because the block's
``forward`` (already wrapped by ``activation_checkpoint`` when that is on) is what is compiled, not the module's
call. ``loop.build`` applies it to the meta-device model before sharding, then runs ``warm_up``.

What falls back, and what does not. Only what ``torch.compile`` raises when it cannot compile (``compile_errors``:
Dynamo's exceptions, among them a graph break under ``fullgraph``, the backend's failure and Inductor's
``InductorError``; Inductor's own lowering and C++/codegen errors; Triton's compilation and resource errors) switches
every compiled function back to eager, with one warning line per process saying where it failed. Anything else (an
out-of-memory error, a shape error in the model, a failed collective) is raised as it is: a blanket ``except`` would
hide real bugs behind a slower run.

Where failures show. Dynamo traces the forward graph at the first call, but AOTAutograd compiles the backward graph
lazily, at the first backward pass: in the training loop that would be inside FSDP2's backward, past the point where
a run can fall back (torch 2.9's FSDP2 has no way to reset an iteration that raised mid-backward). So ``warm_up``
runs a forward AND a backward pass before training, on a stand-in block sharded as the model's are (its own FSDP2
root, thrown away afterwards), with an LM head and the loss, of the run's own shape, dtype, micro-batch, sequence
length, activation checkpointing and rotary frequencies: every graph the run will compile is compiled there, a
failure in either pass falls back cleanly (every rank compiles the same graphs and fails alike), and the model's
blocks and loss chunks then find their graphs in Dynamo's cache, so the first step compiles nothing new. torch 2.9
raises a C++ compiler failure in the lazy backward bare (``InvalidCxxCompiler``); torch 2.13 wraps it in
``InductorError``: both are caught.

The compile cache. Inductor keeps what it compiled on disk (``cache_locations``): a local run says where
(``cache_line``). A compile stopped half-way (a killed run) can leave a damaged entry there, typically a 0-byte or
truncated ``.so`` (g++ writes its output in place; Inductor writes its sources atomically) or precompiled header,
which every later compile of the same code loads: a load error (``file too short``) torch raises bare from the
lazy backward compile, 2.9 and 2.13 alike, or a C++ error that names another file. A compile failure therefore also
counts a load error naming a file of the cache (``is_compile_failure``), and its warning is followed by one line
naming the damaged entries (``damaged_entries``: those the error names, then any other) and how to clear them.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import shlex
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy

from training.models.config import ModelConfig
from training.trainer import loss as loss_module
from training.trainer.distributed import activation_checkpoint, parallel
from training.trainer.model import decoder
from training.trainer.model.rotary import Rope

_COMPILE_ERRORS: tuple[tuple[str, str], ...] = (
    # Dynamo: Unsupported (a graph break under fullgraph), BackendCompilerFailed and Inductor's InductorError
    # (its subclass), TorchRuntimeError (an op failing on fake tensors), TritonMissing, GPUTooOldForTriton, ...
    ("torch._dynamo.exc", "TorchDynamoException"),
    # Inductor, raised bare where Dynamo is not on the stack (AOTAutograd's lazy backward compile)
    ("torch._inductor.exc", "OperatorIssue"),  # LoweringException, MissingOperatorWith(out)Decomp
    ("torch._inductor.exc", "InvalidCxxCompiler"),
    ("torch._inductor.exc", "CppCompileError"),  # and CUDACompileError
    ("torch._inductor.exc", "CppWrapperCodegenError"),
    ("torch._inductor.exc", "SubgraphLoweringException"),
    # Triton (GPU kernels): a kernel that does not compile, or a config that exceeds the GPU's shared memory
    ("triton.compiler.errors", "CompilationError"),
    ("triton.runtime.errors", "OutOfResources"),
)


@functools.cache
def compile_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "torch.compile cannot compile this" (``_COMPILE_ERRORS``, those this torch
    and Triton have)."""
    found: list[type[BaseException]] = []
    for module_name, name in _COMPILE_ERRORS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # no Triton on a CPU-only torch
            continue
        error = getattr(module, name, None)
        if isinstance(error, type) and issubclass(error, BaseException):
            found.append(error)
    return tuple(found)


def resolve(setting: str, device: torch.device, use_te: bool) -> bool:
    """Whether to compile: ``auto`` compiles on a GPU on the torch path (Transformer Engine runs eagerly)."""
    if setting == "auto":
        return device.type == "cuda" and not use_te
    return setting == "true"


class _State:
    """Process-wide: a failure anywhere switches every compiled function back to eager, with one warning."""

    failed: str | None = None


def _warn(err: BaseException, where: str) -> None:
    if _State.failed is None:
        _State.failed = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"  # on one line
        print(
            f"warning: torch.compile failed {where} ({_State.failed}); every block and loss chunk runs eagerly",
            file=sys.stderr,
            flush=True,
        )
        damaged = damaged_entries(err)
        if damaged:
            print(damaged_line(damaged), file=sys.stderr, flush=True)


def cache_locations() -> dict[str, Path]:
    """Where this process's compiled code is kept, as torch decides it (2.9 to 2.13 alike): Inductor's cache
    (``TORCHINDUCTOR_CACHE_DIR``, by default ``<temp dir>/torchinductor_<user>``; Triton's kernels inside it unless
    ``TRITON_CACHE_DIR`` says otherwise), and Inductor's precompiled C++ headers, which stay in the default folder
    whatever ``TORCHINDUCTOR_CACHE_DIR`` says (the temp dir moves them). Creates Inductor's folder, as a compile would."""
    from torch._inductor import config as inductor_config
    from torch._inductor.runtime import cache_dir_utils

    inductor = Path(os.path.abspath(cache_dir_utils.cache_dir()))
    found = {"inductor": inductor}
    if getattr(inductor_config, "cpp_cache_precompile_headers", False):
        codecache = importlib.import_module("torch._inductor.codecache")
        default = os.path.join(cache_dir_utils.default_cache_dir(), "precompiled_headers")
        found["precompiled_headers"] = Path(os.path.abspath(getattr(codecache, "_HEADER_DIR", default)))
    if os.environ.get("TRITON_CACHE_DIR"):
        found["triton"] = Path(os.path.abspath(os.environ["TRITON_CACHE_DIR"]))
    return found


def cache_line() -> str:
    """``compile cache: ...``: where this process's compiled code is kept (``cache_locations``); a local run prints
    it (a SageMaker job's container starts with an empty cache)."""
    places = cache_locations()
    inductor = places.pop("inductor")
    described = {"precompiled_headers": "its precompiled C++ headers in", "triton": "Triton's kernels in"}
    others = "".join(
        f", {described[name]} {path}" for name, path in places.items() if not path.is_relative_to(inductor)
    )
    return f"compile cache: {inductor} (Inductor's, TORCHINDUCTOR_CACHE_DIR){others}"


_PATH = re.compile(r"/[^\s'\"():;,]+")
_PCH_ERROR = re.compile(r"\bPCH\b|precompiled header", re.IGNORECASE)


def _messages(err: BaseException) -> str:
    """The text of ``err`` and of every exception it was raised from or during."""
    texts, seen, current = [], set(), err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(texts)


def _named_cache_files(text: str, roots: list[Path]) -> list[Path]:
    """The files of a compile cache (under ``roots``) that ``text`` names, in order."""
    named = (Path(match) for match in _PATH.findall(text))
    return list(dict.fromkeys(p for p in named if any(p.is_relative_to(root) for root in roots)))


def is_compile_failure(err: BaseException) -> bool:
    """Whether ``err`` means "this could not be compiled": a ``compile_errors`` type, or a load error (ImportError,
    OSError) naming a file of the compile cache (a damaged entry, which torch raises bare from a lazy compile)."""
    if isinstance(err, compile_errors()):
        return True
    return isinstance(err, ImportError | OSError) and bool(
        _named_cache_files(str(err), list(cache_locations().values()))
    )


def _damage(path: Path) -> str | None:
    """Why ``path``, a compiled file, cannot be whole (0 bytes; a shared object that is not ELF or whose section
    headers, the end of a linked ELF file, lie past its end), or None."""
    try:
        size = path.stat().st_size
        if size == 0:
            return "0 bytes"
        if path.suffix != ".so" or not sys.platform.startswith("linux"):
            return None
        with path.open("rb") as handle:
            head = handle.read(64)
    except OSError:
        return None
    if head[:4] != b"\x7fELF":
        return "not a shared object"
    if len(head) == 64 and head[4] == 2:  # ELF64: e_shoff at 0x28, e_shentsize and e_shnum at 0x3A
        order = "<" if head[5] == 1 else ">"
        (offset,) = struct.unpack_from(order + "Q", head, 0x28)
        entry, count = struct.unpack_from(order + "HH", head, 0x3A)
        if offset + entry * count > size:
            return f"truncated: {size} of at least {offset + entry * count} bytes"
    return None


def damaged_entries(err: BaseException | None = None) -> list[tuple[Path, str]]:
    """The damaged entries of the compile caches (``cache_locations``) and why: first the files ``err`` names (a
    precompiled header the C++ compiler could not read included), then any other compiled file (``.so``, ``.gch``)
    ``_damage`` finds there."""
    roots = [root for root in cache_locations().values() if root.is_dir()]
    found: dict[Path, str] = {}
    text = _messages(err) if err is not None else ""
    for path in _named_cache_files(text, roots):
        why = _damage(path)
        if why is None and path.suffix == ".h" and _PCH_ERROR.search(text) and Path(f"{path}.gch").is_file():
            path, why = Path(f"{path}.gch"), "the C++ compiler cannot read it"
        if why is not None:
            found.setdefault(path, why)
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith((".so", ".gch")) and (why := _damage(Path(folder, name))) is not None:
                    found.setdefault(Path(folder, name), why)
    return list(found.items())


def damaged_line(damaged: list[tuple[Path, str]], listed: int = 10) -> str:
    """One line: the first damaged entry, how many others, and the command that clears them (those entries, or
    past ``listed`` of them the cache folders that hold them); the next run compiles what they held again."""
    (first, why), others = damaged[0], len(damaged) - 1
    if len(damaged) <= listed:
        clear = "rm -f " + " ".join(shlex.quote(str(path)) for path, _ in damaged)
    else:
        roots = sorted(cache_locations().values(), key=lambda root: len(root.parts))  # outermost first
        holding = {next((r for r in roots if path.is_relative_to(r)), path.parent) for path, _ in damaged}
        clear = "rm -rf " + " ".join(shlex.quote(str(folder)) for folder in sorted(holding))
    more = f" and {others} more" if others else ""
    return f"warning: damaged compile cache entry {first} ({why}){more}: clear with `{clear}`, and the next run compiles again"


def guarded(compiled: Callable, eager: Callable, what: str) -> Callable:
    """``compiled``, or ``eager`` once any compilation has failed (the call that failed to compile is rerun
    eagerly; any other error is raised). ``what``: the function, as the warning names it."""

    @functools.wraps(eager)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _State.failed is None:
            try:
                return compiled(*args, **kwargs)
            except Exception as err:
                if not is_compile_failure(err):
                    raise
                _warn(err, f"compiling {what}")
        return eager(*args, **kwargs)

    return call


def disable_autograd_cache() -> None:
    """Turn off AOTAutograd's cache in this process. It is on disk, shared by every process of the user, and keys a
    graph by Dynamo's graph, where SDPA is one call whatever kernel it will run: the kernel is chosen while
    AOTAutograd traces, from the enabled backends and their order, which no cache key holds (torch 2.11, 2.13). A
    process pinned to Flash would load the graph a cuDNN-pinned one traced, and run cuDNN. Inductor's own cache (the
    costly part: code generation) stays on: it keys the traced graph, which names the kernel's own op."""
    functorch_config = importlib.import_module("torch._functorch.config")
    if hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = False


def apply(layers: nn.ModuleList, *, loss_chunks: bool = True) -> None:
    """Compile each block's forward (``fullgraph``: a graph break is a failure, hence eager) and, with
    ``loss_chunks``, the chunked loss's per-chunk body (AOTAutograd's cache off: ``disable_autograd_cache``)."""
    disable_autograd_cache()
    for block in layers:
        eager = block.forward
        block.forward = guarded(torch.compile(eager, fullgraph=True), eager, "a block's forward")
    if loss_chunks:
        forward, gradient = loss_module.chunk_forward, loss_module.chunk_gradient
        loss_module.set_chunk_functions(
            guarded(torch.compile(forward, fullgraph=True), forward, "the loss chunk's forward"),
            guarded(torch.compile(gradient, fullgraph=True), gradient, "the loss chunk's gradient"),
        )


def warm_up(
    shape: ModelConfig,
    checkpointing: list[str],
    *,
    batch: int,
    seq: int,
    dtype: torch.dtype,
    device: torch.device,
    rope: Rope | None,
    loss_chunk_tokens: int,
    mesh: DeviceMesh,
    policy: MixedPrecisionPolicy,
    adapt: Callable[[nn.Module], None] | None = None,
) -> None:
    """Compile now, forward and backward, what the run will compile: for each activation checkpointing variant
    in ``checkpointing`` (``none``, ``full``, ``selective``: those the model's blocks have), a stand-in block of
    ``shape`` (the model's ``ModelConfig``) with that variant, compiled as ``apply`` compiles the model's and sharded on
    ``mesh`` with
    ``policy`` as ``parallel.shard_model`` shards them, run on a ``[batch, seq]`` micro-batch in ``dtype`` on
    ``device``, then an LM head and the loss (the compiled loss chunks ``apply`` set), then backward. A collective
    on every rank of ``mesh``. A compile error in either pass (``compile_errors``) switches everything to eager with
    one warning line; any other error is raised. Values are constants: compilation depends on shapes, dtypes and
    strides. ``adapt``: what the run does to each of its blocks before activation checkpointing (LoRA's
    ``lora.apply_to_block``: adapters, the base frozen), with a frozen LM head, as the model's blocks and loss chunks
    will run; the first variant's stand-in (``activation_checkpoint.variants`` puts the first block's first) runs
    also with an input that requires no gradient: the first block's, whose frozen embedding gives none."""
    if _State.failed is not None:
        return
    h = shape.hidden_size
    kwargs = {} if rope is None else {"rotary_pos_emb": rope(seq, device)}
    for mode in checkpointing:
        with torch.device("meta"):
            block = decoder.TorchBlock(shape)
        if adapt is not None:
            adapt(block)
        stand_in = nn.ModuleList([block])
        activation_checkpoint.apply(stand_in, mode)
        apply(stand_in, loss_chunks=False)
        parallel.shard_block(block, mesh, policy)
        block.to_empty(device=device)
        for param in block.parameters():
            nn.init.constant_(param, 0.02)
        head = (
            nn.Parameter(  # frozen with the base when LoRA adapts the blocks (Dynamo guards on requires_grad)
                torch.full((shape.vocab_size, h), 0.02, dtype=dtype, device=device),
                requires_grad=adapt is None,
            )
        )
        targets = torch.zeros((batch, seq), dtype=torch.long, device=device)
        for input_grad in (True, False) if adapt is not None and mode == checkpointing[0] else (True,):
            hidden = torch.full((batch, seq, h), 0.1, dtype=dtype, device=device, requires_grad=input_grad)
            loss = loss_module.linear_cross_entropy(block(hidden, **kwargs), head, targets, loss_chunk_tokens)
            if not backward(
                loss, f"compiling a block's backward ({mode} activation checkpointing) in the warm-up"
            ):
                return


def backward(loss: torch.Tensor, where: str) -> bool:
    """``loss.backward()``, where AOTAutograd compiles the backward graphs: False, with every compiled function
    eager from then on and one warning naming ``where``, when that compile fails (``is_compile_failure``); any
    other error is raised."""
    try:
        loss.backward()
    except Exception as err:
        if not is_compile_failure(err):
            raise
        _warn(err, where)
        return False
    return True


def reset() -> None:
    """Eager loss chunks and no recorded failure (tests, and the benchmark between cells)."""
    _State.failed = None
    loss_module.set_chunk_functions(loss_module.chunk_forward, loss_module.chunk_gradient)


def failure() -> str | None:
    """Why compilation failed in this process, or None."""
    return _State.failed
