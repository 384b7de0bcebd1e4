"""The typed, frozen description of a dense decoder-only language model: what varies between the families the
trainer supports (Llama 3, Qwen 2/2.5, Qwen 3, Mistral, Gemma 3 text), and what follows from it: the parameter
count, the shapes of one block's projections, each layer's attention window and RoPE, and the training FLOPs per
token.

One ``ModelConfig`` describes the model everywhere: the request check's plan, the trainer's two blocks, weight
import and export, LoRA's targets. It is read from a Hugging Face ``config.json`` by the family's folder
(``training.models.<family>``) or taken from a named size (``training.models.registry``).

The block (every family here): ``x + attn(norm(x))`` then ``x + mlp(norm(x))`` (``norm_placement="pre"``), or,
Gemma 3's four norms (``"sandwich"``), ``x + post_norm(attn(norm(x)))`` and ``x + post_norm(mlp(norm(x)))``.
Attention: ``num_heads`` query heads of ``head_dim`` (explicit: Qwen 3 32B's 64 x 128 is not its hidden 5120),
``num_kv_heads`` key/value heads shared as grouped-query attention, optional bias per projection, optional
per-head RMSNorm of query and key before RoPE (``qk_norm``), scores scaled by ``query_pre_attn_scalar ** -0.5``
(``head_dim ** -0.5`` when None), causal, within ``sliding_window`` tokens on the layers whose ``layer_types``
entry is ``"sliding"``. MLP: gated, ``down(act(gate(x)) * up(x))`` with SiLU (SwiGLU) or the tanh GELU (GeGLU).
Norms: RMSNorm ``x / rms(x) * w``, or Gemma's ``x / rms(x) * (1 + w)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh")
"""The gated MLP's activation: ``silu`` (SwiGLU: Llama, Qwen, Mistral) or ``gelu_tanh`` (GeGLU with the tanh
approximation of GELU, Hugging Face's ``gelu_pytorch_tanh``: Gemma 3)."""
NORMS: tuple[str, ...] = ("rmsnorm", "rmsnorm_unit_offset")
"""``rmsnorm``: ``x / rms(x) * w`` (weights start at 1); ``rmsnorm_unit_offset``: Gemma's ``x / rms(x) * (1 + w)``
(weights start at 0, computed in fp32; Transformer Engine calls it ``zero_centered_gamma``)."""
NORM_PLACEMENTS: tuple[str, ...] = ("pre", "sandwich")
"""``pre``: one norm before attention and one before the MLP; ``sandwich``: also one after each (Gemma 3)."""
LAYER_TYPES: tuple[str, ...] = ("full", "sliding")
"""A layer's attention: causal over the whole sequence, or causal within ``sliding_window`` tokens."""
POSITION_ENCODINGS: tuple[str, ...] = ("rope", "none")
"""Rotary embeddings, or none (NoPE: the causal mask alone lets a decoder infer positions)."""
ROPE_SCALINGS: tuple[str, ...] = ("none", "linear", "llama3")
"""RoPE frequency scaling: none; ``linear`` (every frequency divided by ``factor``: Gemma 3's global layers);
``llama3`` (Llama 3.1's frequency-dependent scaling)."""
PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of one block, by their Hugging Face names (every family here uses these)."""


class ModelConfigError(ValueError):
    """A model configuration the trainer cannot build: one line, ``"<field> <what is wrong; what is
    supported>"``. ``field``: the setting or config.json key at fault."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name} {message}")
        self.field = field_name
        self.reason = message


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding of one kind of layer: base ``theta`` and the frequency scaling (``ROPE_SCALINGS``) with its
    parameters (``factor`` for linear and llama3; the other three for llama3 only)."""

    theta: float = 10000.0
    scaling: str = "none"
    factor: float | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        _check(self.theta > 0, "rope_theta", f"must be positive; got {self.theta!r}")
        _check_choice("rope_scaling", self.scaling, ROPE_SCALINGS)
        wanted = {
            "none": (),
            "linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        }[self.scaling]
        for name in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            value = getattr(self, name)
            if name in wanted:
                _check(value is not None and value > 0, name, f"must be positive for {self.scaling} scaling")
            else:
                _check(value is None, name, f"is not a parameter of RoPE scaling {self.scaling!r}")


@dataclass(frozen=True)
class AttentionBias:
    """Which attention projections have a bias (Qwen 2: query, key and value; Llama, Qwen 3 and Gemma 3 with
    ``attention_bias``: all four)."""

    q: bool = False
    k: bool = False
    v: bool = False
    o: bool = False

    @property
    def qkv(self) -> bool:
        """The query, key and value biases (the trainer fuses the three projections, so they go together)."""
        return self.q

    @property
    def any(self) -> bool:
        return self.q or self.k or self.v or self.o


@dataclass(frozen=True)
class ModelConfig:
    """A dense decoder's architecture (see the module's docstring for the block). ``family`` names the folder
    (``training.models.<family>``) that maps it to and from its Hugging Face class."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    activation: str = "silu"
    norm: str = "rmsnorm"
    norm_placement: str = "pre"
    norm_eps: float = 1e-5
    attention_bias: AttentionBias = field(default_factory=AttentionBias)
    qk_norm: bool = False
    query_pre_attn_scalar: float | None = None
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    position_encoding: str = "rope"
    rope: RopeConfig = field(default_factory=RopeConfig)
    local_rope: RopeConfig | None = None
    scale_embeddings: bool = False
    tie_embeddings: bool = False
    max_position_embeddings: int | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:  # every layer full attention
            object.__setattr__(self, "layer_types", ("full",) * self.num_layers)
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            _check(_positive_int(value), name, f"must be a positive integer; got {value!r}")
        _check(_positive_int(self.ffn_hidden_size), "ffn_hidden_size", "must be a positive integer")
        _check(
            self.num_heads % self.num_kv_heads == 0,
            "num_kv_heads",
            f"{self.num_kv_heads} must divide num_heads {self.num_heads} (grouped-query attention)",
        )
        _check(
            self.head_dim % 2 == 0 or self.position_encoding == "none", "head_dim", "must be even for RoPE"
        )
        _check_choice("activation", self.activation, ACTIVATIONS)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("norm_placement", self.norm_placement, NORM_PLACEMENTS)
        _check_choice("position_encoding", self.position_encoding, POSITION_ENCODINGS)
        _check(self.norm_eps > 0, "norm_eps", f"must be positive; got {self.norm_eps!r}")
        bias = self.attention_bias
        _check(
            bias.q == bias.k == bias.v,
            "attention_bias",
            "must be on all of the query, key and value projections or on none (the trainer fuses them)",
        )
        self._check_layers()

    def _check_layers(self) -> None:
        _check(
            len(self.layer_types) == self.num_layers,
            "layer_types",
            f"has {len(self.layer_types)} entries for num_layers {self.num_layers}",
        )
        for kind in self.layer_types:
            _check_choice("layer_types", kind, LAYER_TYPES)
        if "sliding" in self.layer_types:
            window = self.sliding_window
            _check(_positive_int(window), "sliding_window", f"must be a positive integer; got {window!r}")
        scalar = self.query_pre_attn_scalar
        _check(scalar is None or scalar > 0, "query_pre_attn_scalar", f"must be positive; got {scalar!r}")
        _check(
            self.max_position_embeddings is None or _positive_int(self.max_position_embeddings),
            "max_position_embeddings",
            "must be a positive integer",
        )

    # ---------------------------------------------------------------------------------------------------------
    # Per layer
    # ---------------------------------------------------------------------------------------------------------

    @property
    def kv_heads(self) -> int:
        """Key/value heads (the name the planner's formulas use)."""
        return self.num_kv_heads

    @property
    def q_width(self) -> int:
        """The query projection's output (and the output projection's input): ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """The key (and value) projection's output: ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim

    @property
    def attention_scale(self) -> float:
        """The factor on query . key: ``query_pre_attn_scalar ** -0.5`` (Gemma 3), else ``head_dim ** -0.5``."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def embedding_multiplier(self) -> float:
        """What the input embedding is multiplied by: sqrt(hidden_size) for Gemma, else 1."""
        return self.hidden_size**0.5 if self.scale_embeddings else 1.0

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (a query sees itself and the ``window - 1`` tokens before it, as
        Hugging Face's ``sliding_window``), or None for full causal attention."""
        return self.sliding_window if self.layer_types[layer] == "sliding" else None

    def rope_of(self, layer: int) -> RopeConfig | None:
        """Layer ``layer``'s rotary embedding (Gemma 3's sliding layers have their own base), or None (NoPE)."""
        if self.position_encoding == "none":
            return None
        if self.layer_types[layer] == "sliding" and self.local_rope is not None:
            return self.local_rope
        return self.rope

    def attention_span(self, layer: int, seq_length: int) -> int:
        """Keys one query of layer ``layer`` is counted against in a ``seq_length`` window: the sequence, or the
        sliding window when shorter."""
        window = self.window(layer)
        return seq_length if window is None else min(seq_length, window)

    # ---------------------------------------------------------------------------------------------------------
    # Shapes and counts
    # ---------------------------------------------------------------------------------------------------------

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """One block's linear layers (``PROJECTIONS``) as ``(out_features, in_features)``."""
        h, f = self.hidden_size, self.ffn_hidden_size
        return {
            "q_proj": (self.q_width, h),
            "k_proj": (self.kv_width, h),
            "v_proj": (self.kv_width, h),
            "o_proj": (h, self.q_width),
            "gate_proj": (f, h),
            "up_proj": (f, h),
            "down_proj": (h, f),
        }

    def block_norms(self) -> int:
        """Hidden-size norm weights in one block: 2 (pre-norm) or 4 (sandwich)."""
        return 4 if self.norm_placement == "sandwich" else 2

    def block_parameter_count(self) -> int:
        """Parameters of one block (every layer has the same; a window changes no parameter): the seven
        projections, their biases, the block's norms and the query/key norms (``head_dim`` each)."""
        matrices = sum(rows * cols for rows, cols in self.projection_shapes().values())
        bias = self.attention_bias
        biases = (bias.q * self.q_width) + (bias.k + bias.v) * self.kv_width + bias.o * self.hidden_size
        norms = self.block_norms() * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return matrices + biases + norms

    def root_parameter_count(self) -> int:
        """Parameters outside the blocks: the embedding, the LM head (none of its own when tied), the final norm."""
        matrices = 1 if self.tie_embeddings else 2
        return matrices * self.vocab_size * self.hidden_size + self.hidden_size

    def parameter_count(self) -> int:
        """Every parameter of the model (equal to the Hugging Face model's ``num_parameters()``: tested)."""
        return self.num_layers * self.block_parameter_count() + self.root_parameter_count()

    def flops_per_token(self, seq_length: int, lora_parameters: int = 0) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), the PaLM/Megatron convention the project's
        MFU uses: ``6 * N + 12 * sum over layers of (num_heads * head_dim) * span``. N: the parameters taking
        part in matmuls (all but the input embedding, a lookup; the LM head counts, also when tied). The second
        term is attention's QK^T and AV matmuls, each query counted against every key of its span (the whole
        ``seq_length``, although the causal mask skips about half; a sliding-window layer's ``min(seq_length,
        window)``), over the query heads' width (grouped-query attention changes neither matmul's size).
        For Llama (``num_heads * head_dim == hidden_size``, no window) this is ``6N + 12 * L * H * S``.

        LoRA (``lora_parameters`` > 0, the adapters' count): the frozen weights run their forward and
        input-gradient GEMMs but no weight-gradient GEMM, ``4 * N``, and the adapters all three, ``6 * Na``; the
        attention term is unchanged (as Megatron-Bridge and NeMo AutoModel count a LoRA run's MFU)."""
        # The LM head is a matmul whether or not it shares the embedding's matrix.
        lm_head = self.vocab_size * self.hidden_size
        matmul_params = self.num_layers * self.block_parameter_count() + self.hidden_size + lm_head
        spans = sum(self.attention_span(layer, seq_length) for layer in range(self.num_layers))
        attention = 12.0 * self.q_width * spans
        if lora_parameters:
            return 4.0 * matmul_params + 6.0 * lora_parameters + attention
        return 6.0 * matmul_params + attention

    def lora_block_parameter_count(self, rank: int, targets: tuple[str, ...] | list[str]) -> int:
        """One block's LoRA adapter parameters: ``rank * (in + out)`` for each targeted projection
        (``PROJECTIONS`` names)."""
        shapes = self.projection_shapes()
        unknown = [t for t in targets if t not in shapes]
        _check(
            not unknown, "lora_targets", f"{unknown} are not projections; allowed: {', '.join(PROJECTIONS)}"
        )
        return sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets)

    def trimmed(self, num_layers: int, vocab_size: int | None = None) -> ModelConfig:
        """This model with ``num_layers`` blocks (its first ones, the last taking the kind of the model's last
        layer when that kind would otherwise be missing: a Gemma 3 of 2 layers has a sliding and a global one) and
        optionally another vocabulary: what the memory traces measure in place of a whole named size (every
        per-layer term is in, the trace's time does not grow with the layers)."""
        kinds = list(self.layer_types[:num_layers])
        if num_layers > 1 and self.layer_types[-1] not in kinds:
            kinds[-1] = self.layer_types[-1]
        return replace(
            self,
            num_layers=num_layers,
            layer_types=tuple(kinds),
            vocab_size=self.vocab_size if vocab_size is None else vocab_size,
        )

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> ModelConfig:
        """The config of ``summary()``'s dict (a saved run's, a run's settings'), checked as any config is."""
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(summary) - known)
        _check(not unknown, "model_config", f"has unknown keys {unknown}; known: {', '.join(sorted(known))}")
        values = dict(summary)
        try:
            values["attention_bias"] = AttentionBias(**values.get("attention_bias", {}))
            values["rope"] = RopeConfig(**values.get("rope", {}))
            if values.get("local_rope") is not None:
                values["local_rope"] = RopeConfig(**values["local_rope"])
            values["layer_types"] = tuple(values.get("layer_types", ()))
            return cls(**values)
        except TypeError as err:
            raise ModelConfigError("model_config", f"is not a model config: {err}") from None

    def summary(self) -> dict[str, Any]:
        """The config as plain JSON-ready values (nested dataclasses as dicts)."""
        out: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, RopeConfig | AttentionBias):
                value = {f.name: getattr(value, f.name) for f in fields(value)}
            elif isinstance(value, tuple):
                value = list(value)
            out[item.name] = value
        return out


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ModelConfigError(name, message)


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    _check(value in allowed, name, f"must be one of {', '.join(allowed)}; got {value!r}")
