"""The one layer skeleton shared by every linear mixer (docs/design.md §1, §4).

    x ─┬─ q/k/v projections ─ [short conv + SiLU] ─ [feature map] ─ [L2 norm q, k] ─┐
       ├─ the mixer's own gates: log-decay g, write strength beta (and, for Mamba2, v·dt)
       │                                                                           op (kernels/)
       └─ output gate  W_g x ──────────────────────── RMSNorm per head ─ · gate ─ W_o ─> y

A subclass states only what differs, in the paper's words:

- `decay`: "none" | "scalar" | "channel", the granularity of the log-decay `g` (absent, `[B, T, H]`,
  `[B, T, H, K]`; kernels.family's words);
- `delta_rule`: whether the layer erases (`beta` given) or only writes;
- `gates(x, k, v) -> (v, g, beta)`: how it computes them from the input.

The pair (decay, delta_rule) picks the op from the family table of docs/design.md §1; nothing else in the
layer knows which mixer it is. `paper_defaults` holds the switch values of the mixer's paper, applied
under whatever the caller passes, so `GLA(d_model)` is GLA as published and a yaml can still flip any
switch. Unknown keyword arguments reach `LinearMixer.__init__` and raise a TypeError there.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import kernels
from kernels import family
from kernels.conv import short_conv
from kernels.family import Decay
from kernels.ops import check_chunk_sizes
from mixers.base import Mixer
from mixers.recompute import gated_rms_norm_projection, l2_norm, recomputed, shared_cast, wide

FEATURE_MAPS = ("identity", "elu+1", "relu")
OUTPUT_GATES = ("none", "sigmoid", "swish")
OUTPUT_GATE_RANKS = ("low", "full")
BACKENDS = ("auto", "triton", "torch", "naive")


def _unit_fp32(x: torch.Tensor) -> torch.Tensor:  # [..., K] -> fp32 [..., K] of unit length
    return F.normalize(wide(x), dim=-1)


def _unit_of_projection(x: torch.Tensor, proj: nn.Linear, conv: ShortConvolution, heads: int,
                        dim: int) -> torch.Tensor:  # [B, T, D] -> fp32 [B, T, heads, dim] of unit rows
    y = conv(proj(x), None)[0]
    return _unit_fp32(y.view(*y.shape[:2], heads, dim))


# (decay, delta_rule) -> (chunked op, single-token step): the 3 x 2 table of docs/design.md §1, from the
# family table (kernels.family)
OPS: dict[tuple[Decay, bool], tuple[Callable[..., Any], Callable[..., Any]]] = {
    (op.decay, op.delta_rule): (getattr(kernels, op.chunk), getattr(kernels, op.step)) for op in family.PLAIN
}


@functools.cache
def _takes_lower_bound(op: Callable[..., Any]) -> bool:
    return "lower_bound" in inspect.signature(op).parameters


# a constant of the op for torch.compile: called at trace time, not traced (whose tracing of the cache
# wrapper warns in every compiled run)
@torch.compiler.assume_constant_result
def accepts_lower_bound(op: Callable[..., Any]) -> bool:
    """Whether `op` takes `lower_bound=` (a Triton fast path for a bounded log-decay; same result without)."""
    return _takes_lower_bound(op)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is unknown; use one of {allowed}")
    return value


def _positive_int(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r}; it must be a positive integer")
    return value


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y, for y > 0 (stable for small y: log(expm1(y)))."""
    return y + torch.log(-torch.expm1(-y))


def log_uniform(n: int, low: float, high: float) -> torch.Tensor:
    """n samples spread log-uniformly over [low, high] (the Mamba time-step initialisation)."""
    return torch.exp(torch.rand(n) * (math.log(high) - math.log(low)) + math.log(low))


class ShortConvolution(nn.Module):
    """Causal depthwise convolution over time (each channel its own kernel of `size` taps), then SiLU.

    `forward(x, conv_state)` prepends the last `size - 1` inputs kept from earlier calls (zeros at the start
    of a sequence), so a sequence cut into pieces, down to one token at a time, gives the output of one call.
    The op is kernels.conv.short_conv: `backend` "auto" runs its fused Triton kernel on CUDA and the F.conv1d
    reference on the CPU, "triton" forces the kernel, "torch" / "naive" the reference.
    """

    def __init__(self, channels: int, size: int, backend: str = "auto") -> None:
        super().__init__()
        self.channels, self.size = channels, size
        self.backend = _choice("backend", backend, BACKENDS)
        self.weight = nn.Parameter(torch.empty(channels, 1, size))
        # the init of nn.Conv1d for a depthwise kernel: fan_in = size
        bound = 1 / math.sqrt(size)
        nn.init.uniform_(self.weight, -bound, bound)

    def init_state(self, batch_size: int, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
        """The cache at the start of a sequence: zeros [B, channels, size - 1], the last inputs before it."""
        return torch.zeros(batch_size, self.channels, self.size - 1, device=device, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, C]
        conv_state: torch.Tensor | None = None,  # [B, C, size - 1], the last inputs before x
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (y [B, T, C], new conv_state [B, C, size - 1]), both in x's dtype."""
        return short_conv(x, self.weight[:, 0], conv_state, backend=self.backend)


class MambaDecay(nn.Module):
    """Mamba2's scalar, data-dependent decay per head: dt = softplus(W x + dt_bias), g = -dt * exp(A_log).

    Shared by Mamba2 and Gated DeltaNet. Init as in Mamba2: dt log-uniform in [dt_min, dt_max], A in [1, 16].
    """

    def __init__(self, d_model: int, num_heads: int, dt_min: float = 1e-3, dt_max: float = 1e-1) -> None:
        super().__init__()
        if not 0 < dt_min <= dt_max:
            raise ValueError(
                f"dt_min={dt_min}, dt_max={dt_max}; need 0 < dt_min <= dt_max (Mamba2: 1e-3, 1e-1)"
            )
        self.dt_proj = nn.Linear(d_model, num_heads, bias=False)
        self.dt_bias = nn.Parameter(inverse_softplus(log_uniform(num_heads, dt_min, dt_max)))
        self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(1, 16)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [B, T, D]
        """Returns (g [B, T, H] log-decay, dt [B, T, H]), both float32."""
        dt = F.softplus(self.dt_proj(x).float() + self.dt_bias)  # [B, T, H]
        return -dt * self.A_log.float().exp(), dt


class BetaProjection(nn.Module):
    """The delta rule's write strength per head: beta = sigmoid(W x) in (0, 1), or 2 sigmoid(W x) in (0, 2)
    with `allow_neg_eigval` (the transition I - beta k k^T then has an eigenvalue in (-1, 1) along k, which
    lets the state flip sign: needed for state tracking such as parity)."""

    def __init__(self, d_model: int, num_heads: int, allow_neg_eigval: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, num_heads, bias=False)
        self.allow_neg_eigval = allow_neg_eigval

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, T, H] float32
        beta = torch.sigmoid(self.proj(x).float())
        return 2 * beta if self.allow_neg_eigval else beta


def _conv_of_projection(x: torch.Tensor, proj: nn.Linear, conv: ShortConvolution) -> torch.Tensor:
    # conv(W x), recomputed in the backward from x (which the projections share) instead of keeping W x, the
    # conv's only saved tensor: one more GEMM
    return recomputed(lambda x, *_: conv(proj(x))[0], x, proj.weight, conv.weight)


class LinearMixer(Mixer):
    """The skeleton; see the module docstring. Subclasses set `decay`, `delta_rule`, `paper_defaults`
    and implement `gates`.

    `lean_backward` (False; `model.lean_backward` sets it on every layer) keeps less for the backward
    (mixers/README.md): one autocast cast of x for all projections; the short convs, KDA's gate and the
    output gate recomputed from it; the L2 norm and the output norm as the Functions of mixers/recompute.py,
    which save their inputs instead of their fp32 intermediates; the Triton op's chunk-entry states rebuilt
    in its backward (`recompute_states`). False runs the plain torch expressions, the reference."""

    lean_backward: bool = False
    # what the compiled body recomputes in the backward instead of keeping (mixers.model.RECOMPUTABLE)
    recompute: frozenset[str] = frozenset()

    decay: ClassVar[Decay] = "none"
    delta_rule: ClassVar[bool] = False
    paper_defaults: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Give a subclass's `__init__(d_model, *, own kwargs, **skeleton)` the full signature it accepts:
        its own kwargs, then the skeleton's with the paper defaults. `inspect.signature` (the backbone's
        unknown-key check, help(), IDEs) then lists every accepted key; an unknown one still raises here."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        own = [p for p in inspect.signature(init).parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own}
        skeleton = [
            p.replace(default=cls.paper_defaults.get(p.name, p.default))
            for p in inspect.signature(LinearMixer.__init__).parameters.values()
            if p.kind is p.KEYWORD_ONLY and p.name not in names
        ]
        init.__signature__ = inspect.Signature(own + skeleton)

    def __init__(
        self,
        d_model: int,
        *,
        layer_idx: int = 0,
        num_heads: int = 2,
        head_dim: int = 128,
        value_dim: int | None = None,
        use_short_conv: bool = True,
        conv_size: int = 4,
        feature_map: str = "identity",
        qk_norm: bool = True,
        output_norm: bool = True,
        norm_eps: float = 1e-5,
        output_gate: str = "none",
        output_gate_rank: str = "low",
        output_gate_low_rank_dim: int | None = None,
        chunk_size: int = 64,
        backend: str = "auto",
    ) -> None:
        super().__init__(d_model, layer_idx=layer_idx)
        H = self.num_heads = _positive_int("num_heads", num_heads)
        K = self.head_dim = _positive_int("head_dim", head_dim)
        V = self.value_dim = _positive_int("value_dim", head_dim if value_dim is None else value_dim)
        self.use_short_conv = use_short_conv
        self.conv_size = conv_size
        self.feature_map = _choice("feature_map", feature_map, FEATURE_MAPS)
        self.qk_norm = qk_norm
        self.output_gate = _choice("output_gate", output_gate, OUTPUT_GATES)
        self.output_gate_rank = _choice("output_gate_rank", output_gate_rank, OUTPUT_GATE_RANKS)
        if not isinstance(chunk_size, int) or chunk_size < 16 or chunk_size & (chunk_size - 1):
            raise ValueError(f"chunk_size={chunk_size!r}; it must be a power of two >= 16 (e.g. 64)")
        self.chunk_size = chunk_size
        self.backend = _choice("backend", backend, BACKENDS)
        # a bounded gate (KDA with gate=bounded) sets this to g_min so a kernel can take its fast path
        self.g_lower_bound: float | None = None

        self.q_proj = nn.Linear(d_model, H * K, bias=False)
        self.k_proj = nn.Linear(d_model, H * K, bias=False)
        self.v_proj = nn.Linear(d_model, H * V, bias=False)
        if use_short_conv:
            if conv_size < 2:
                raise ValueError(
                    f"conv_size={conv_size}; a short conv needs >= 2 taps (papers: 4) or use_short_conv=false"
                )
            self.q_conv = ShortConvolution(H * K, conv_size, backend)
            self.k_conv = ShortConvolution(H * K, conv_size, backend)
            self.v_conv = ShortConvolution(H * V, conv_size, backend)
        self.o_norm = nn.RMSNorm(V, eps=norm_eps) if output_norm else None
        if output_gate != "none":
            if output_gate_rank == "full":
                self.o_gate_proj: nn.Module = nn.Linear(d_model, H * V, bias=False)
            else:
                # Kimi Linear: rank = head_dim, with a bias on the up-projection
                rank = V if output_gate_low_rank_dim is None else _positive_int(
                    "output_gate_low_rank_dim", output_gate_low_rank_dim)
                self.o_gate_proj = nn.Sequential(nn.Linear(d_model, rank, bias=False), nn.Linear(rank, H * V))
        self.o_proj = nn.Linear(H * V, d_model, bias=False)
        self.chunk_op, self.step_op = OPS[(self.decay, self.delta_rule)]

    def check_device(self, device: torch.device) -> None:
        check_chunk_sizes(self.backend, device, self.head_dim, self.value_dim, self.chunk_size)

    @classmethod
    def with_paper_defaults(cls, skeleton: dict[str, Any]) -> dict[str, Any]:
        """The caller's skeleton kwargs over the mixer's paper defaults."""
        return {**cls.paper_defaults, **skeleton}

    def gates(
        self,
        x: torch.Tensor,  # [B, T, D]
        k: torch.Tensor,  # [B, T, H, K], after conv / feature map / L2 norm
        v: torch.Tensor,  # [B, T, H, V]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Returns (v to write, g log-decay or None, beta or None) for this mixer."""
        raise NotImplementedError

    def _qkv(
        self,
        x: torch.Tensor,
        cache: dict[str, Any] | None,
        inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,  # x for each projection
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        x_q, x_k, x_v = (x, x, x) if inputs is None else inputs
        # recomputed (mixers.model.RECOMPUTABLE): the graph keeps none of W x, conv(W x) or the unit rows
        if ("qk" in self.recompute and torch.compiler.is_compiling() and self.use_short_conv and cache is None
                and not self.lean_backward and self.qk_norm and self.feature_map == "identity"):
            q, k = (checkpoint(_unit_of_projection, x_, proj, conv, self.num_heads, self.head_dim,
                               use_reentrant=False)
                    for x_, proj, conv in ((x_q, self.q_proj, self.q_conv), (x_k, self.k_proj, self.k_conv)))
            v = self.v_conv(self.v_proj(x_v), None)[0]
            return q, k, v.view(B, T, self.num_heads, self.value_dim)
        # (a cache wants the convs' final states: the modules' own path)
        if self.use_short_conv and cache is None and self.lean_backward:
            q = _conv_of_projection(x_q, self.q_proj, self.q_conv)
            k = _conv_of_projection(x_k, self.k_proj, self.k_conv)
            v = _conv_of_projection(x_v, self.v_proj, self.v_conv)
        else:
            q, k, v = self.q_proj(x_q), self.k_proj(x_k), self.v_proj(x_v)  # [B, T, H*K] (q, k), [B, T, H*V]
            if self.use_short_conv:
                get = (lambda name: None) if cache is None else cache.get
                q, conv_q = self.q_conv(q, get("conv_q"))
                k, conv_k = self.k_conv(k, get("conv_k"))
                v, conv_v = self.v_conv(v, get("conv_v"))
                if cache is not None:
                    cache.update(conv_q=conv_q, conv_k=conv_k, conv_v=conv_v)
        q = q.view(B, T, self.num_heads, self.head_dim)
        k = k.view(B, T, self.num_heads, self.head_dim)
        v = v.view(B, T, self.num_heads, self.value_dim)
        if self.feature_map == "elu+1":
            q, k = F.elu(q) + 1, F.elu(k) + 1
        elif self.feature_map == "relu":
            q, k = F.relu(q), F.relu(k)
        if self.qk_norm:
            # unit keys keep the eigenvalues of I - beta k k^T in [1 - beta, 1]: the recurrence cannot blow up
            # in fp32 on every device, as CUDA's autocast gives F.normalize (the CPU's gives bf16): the op
            # picks its precision from q's dtype, and bf16 q, k (its 16-bit path) diverge in training
            if self.lean_backward:
                q, k = l2_norm(wide(q)), l2_norm(wide(k))
            elif "qk_norm" in self.recompute and torch.compiler.is_compiling():
                # the partitioner recomputes a checkpointed region in the backward, the widening included
                q, k = (checkpoint(_unit_fp32, t, use_reentrant=False) for t in (q, k))
            else:
                q, k = _unit_fp32(q), _unit_fp32(k)
        return q, k, v

    def _op_kwargs(self, op: Callable[..., Any]) -> dict[str, Any]:
        if self.g_lower_bound is not None and accepts_lower_bound(op):
            return {"lower_bound": self.g_lower_bound}
        return {}

    def _normed_output(self, o: torch.Tensor, x: torch.Tensor, *parameters: torch.Tensor) -> torch.Tensor:
        # W_o (RMSNorm(o) * act(W_g x)) as one Function (the parameters, Recomputed's inputs, are read through
        # the modules)
        B, T = x.shape[:2]
        gate = None
        if self.output_gate != "none":
            gate = self.o_gate_proj(x).view(B, T, self.num_heads, self.value_dim)
        # nn.RMSNorm's eps=None: the machine epsilon of the (fp32) computation
        eps = torch.finfo(torch.float32).eps if self.o_norm.eps is None else self.o_norm.eps
        return gated_rms_norm_projection(o, gate, self.o_norm.weight, eps, self.output_gate,
                                         self.o_proj.weight)

    def _output(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:  # o: [B, T, H, V]
        B, T = x.shape[:2]
        if self.lean_backward and self.o_norm is not None:
            if self.output_gate == "none":
                return self._normed_output(o, x)
            # the gate's logits recomputed in the backward from x (which the projections share): one GEMM
            parameters = (self.o_norm.weight, self.o_proj.weight, *self.o_gate_proj.parameters())
            return recomputed(self._normed_output, o, x, *parameters)
        if self.o_norm is not None:
            # in float32 (float64 stays): under bf16 autocast o arrives in bf16, the norm's weight in fp32
            o = self.o_norm(wide(o))
        if self.output_gate != "none":
            gate = self.o_gate_proj(x).view(B, T, self.num_heads, self.value_dim)
            o = o * (torch.sigmoid(gate) if self.output_gate == "sigmoid" else F.silu(gate))
        return self.o_proj(o.reshape(B, T, self.num_heads * self.value_dim))

    def _inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x for (q_proj, k_proj, v_proj, gates, output gate). Under autocast each projection would cast
        (and save) its own low-precision copy of x: with lean_backward they share one (views of one cast,
        their gradients summed in fp32 as the separate casts' were; the gates' view feeds every gate
        projection, whose gradients autograd sums in the low precision first)."""
        device = x.device.type
        if self.lean_backward and x.dtype == torch.float32 and torch.is_autocast_enabled(device):
            return shared_cast(x, torch.get_autocast_dtype(device), 5)
        return (x,) * 5

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]. With a `cache` (from init_cache) this is a prefill: it starts from the
        cache and leaves the state after x in it, so `step` can continue."""
        x_q, x_k, x_v, x_gates, x_out = self._inputs(x)
        q, k, v = self._qkv(x, cache, (x_q, x_k, x_v))
        v, g, beta = self.gates(x_gates, k, v)
        args = (q, k, v) + ((g,) if g is not None else ()) + ((beta,) if beta is not None else ())
        o, state = self.chunk_op(
            *args,
            initial_state=None if cache is None else cache["state"],
            output_final_state=cache is not None,
            backend=self.backend,
            chunk_size=self.chunk_size,
            # the Triton op's chunk-entry states rebuilt in the backward (the other backends ignore it)
            recompute_states=self.lean_backward,
            **self._op_kwargs(self.chunk_op),
        )  # o: [B, T, H, V]
        if cache is not None:
            cache["state"] = state
        return self._output(x_out, o)

    def init_cache(self, batch_size: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
        """The recurrent state [B, H, K, V] (float32) and, with the short conv, the last conv_size - 1
        projected q/k/v inputs of each conv ([B, channels, conv_size - 1], `dtype`)."""
        H, K, V = self.num_heads, self.head_dim, self.value_dim
        cache: dict[str, Any] = {
            "state": torch.zeros(batch_size, H, K, V, device=device, dtype=torch.float32)
        }
        if self.use_short_conv:
            for name, conv in (("conv_q", self.q_conv), ("conv_k", self.k_conv), ("conv_v", self.v_conv)):
                cache[name] = conv.init_state(batch_size, device, dtype)
        return cache

    def step(self, x: torch.Tensor, cache: dict[str, Any]) -> torch.Tensor:  # [B, D] -> [B, D]
        x_q, x_k, x_v, x_gates, x_out = self._inputs(x[:, None])  # [B, 1, D] each
        q, k, v = self._qkv(x_q, cache, (x_q, x_k, x_v))
        v, g, beta = self.gates(x_gates, k, v)
        args = (q[:, 0], k[:, 0], v[:, 0])  # [B, H, K], [B, H, K], [B, H, V]
        args += ((g[:, 0],) if g is not None else ()) + ((beta[:, 0],) if beta is not None else ())
        o, cache["state"] = self.step_op(
            *args, cache["state"], backend=self.backend, **self._op_kwargs(self.step_op)
        )
        return self._output(x_out, o[:, None])[:, 0]

    def state_size(self, seq_len: int | None = None) -> int:
        """Numbers held per sequence while decoding, independent of seq_len:
        H*K*V (state) + (conv_size - 1) * (2*H*K + H*V) with the short conv. Counted from `init_cache`."""
        cache = self.init_cache(1, device="meta", dtype=torch.float32)
        return sum(t.numel() for t in cache.values())
