"""Public ops of the linear-mixer family (docs/design.md §3): six chunked ops and six single-token steps.

All twelve functions are thin wrappers around two generic entry points, `_chunk` and `_step`. The family has
two switches and nothing else differs between the ops:

- decay granularity, read from g's shape: absent, scalar per head (`g: [B, T, H]`) or per key channel
  (`g: [B, T, H, K]`);
- the delta rule, on exactly when `beta` is given.

Each wrapper only states which switch values its op expects, so that a `g` of the wrong granularity is an
error instead of silently running another op. Every input is validated before any compute (ValueError naming
the bad value and the fix). Backends: "naive" (token loop, the ground truth), "torch" (chunkwise,
kernels/chunk_torch.py), "triton" (kernels/triton/), "auto" (triton on CUDA tensors, torch otherwise).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

from kernels import family
from kernels.chunk_torch import chunk_torch
from kernels.family import Decay
from kernels.naive import naive_recurrent, recurrent_step

BACKENDS = ("auto", "naive", "torch", "triton")
# g is a log-decay, so it must be <= 0; allow this much positive slack for round-off in the gate's computation
G_POSITIVE_TOLERANCE = 1e-4


_checks = threading.local()


@contextlib.contextmanager
def value_checks(enabled: bool) -> Iterator[None]:
    """Turn the checks of input *values* (g <= 0, g >= lower_bound, no NaN) on or off in this thread.

    Shapes, dtypes and devices are always checked. A value check reads a GPU tensor back to the host, which
    stalls the launch queue once per op call; a training loop turns them off between its log steps (its own
    finiteness check of the loss covers those steps) and on for the first step and every log step.
    """
    previous = getattr(_checks, "enabled", True)
    _checks.enabled = enabled
    try:
        yield
    finally:
        _checks.enabled = previous


def _values_checked(t: torch.Tensor) -> bool:
    # under torch.compile a read-back would break the graph; CPU tensors cost nothing to read
    if torch.compiler.is_compiling():
        return False
    return t.device.type == "cpu" or getattr(_checks, "enabled", True)


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; use one of {BACKENDS}")


def _check_float(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise ValueError(
            f"{name} has dtype {t.dtype}; it must be a floating-point tensor (cast it with .float())"
        )


def _check_g_values(op: str, g: torch.Tensor) -> None:
    if not _values_checked(g):
        return
    g_max = g.detach().max().item() if g.numel() else 0.0
    if g_max != g_max:
        raise ValueError(
            f"{op}: g contains NaN; the values feeding the decay are no longer finite (in training: the run "
            "diverged; lower the learning rate)"
        )
    if not g_max <= G_POSITIVE_TOLERANCE:
        raise ValueError(
            f"{op}: g has a maximum value of {g_max:.3g}; g is the log-decay and must be <= 0 "
            "(pass log(alpha), e.g. -softplus(x) or logsigmoid(x), not alpha itself)"
        )


def _check_finite(op: str, named: dict[str, torch.Tensor | None]) -> None:
    """q, k, v, beta and the state must hold finite values (g has its own check: -inf is a legal log-decay).

    All tensors in one read-back, and only those `_values_checked` lets through.
    """
    tensors = [(name, t) for name, t in named.items() if t is not None and t.numel() and _values_checked(t)]
    if not tensors:
        return
    finite = torch.stack([torch.isfinite(t.detach()).all() for _, t in tensors]).tolist()
    bad = [name for (name, _), ok in zip(tensors, finite, strict=True) if not ok]
    if bad:
        raise ValueError(
            f"{op}: {', '.join(bad)} hold(s) NaN or infinite values; every input must be finite (in "
            "training: the values feeding the mixer are no longer finite, the run diverged; lower the "
            "learning rate)"
        )


def _validate(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    state: torch.Tensor | None,
    decay: Decay,
    delta_rule: bool,
    token_dims: tuple[str, ...],
    state_name: str,
) -> None:
    """Shape/dtype/value checks shared by the chunked ops (token_dims = B, T, H) and the steps (B, H).

    `state` is the initial state of a chunked op (optional) or the state of a step (required by the caller);
    `state_name` is how the messages call it.
    """
    n = len(token_dims)
    lead = ", ".join(token_dims)
    for name, t, last in (("q", q, "K"), ("k", k, "K"), ("v", v, "V")):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != n + 1:
            raise ValueError(
                f"{op}: {name} has shape {_shape(t)} (rank {t.dim()}); expected [{lead}, {last}]"
            )
        _check_float(f"{op}: {name}", t)
    if k.shape != q.shape:
        raise ValueError(
            f"{op}: k has shape {_shape(k)} but q has {_shape(q)}; q and k must both be [{lead}, K]"
        )
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(
            f"{op}: v has shape {_shape(v)} but q has {_shape(q)}; v's leading dims [{lead}] must match q's"
        )
    K, V = q.shape[-1], v.shape[-1]
    if K == 0 or V == 0:
        raise ValueError(f"{op}: head dims K={K}, V={V} are unsupported; both must be >= 1")
    device = q.device
    for name, t in (("k", k), ("v", v), ("g", g), ("beta", beta), (state_name, state)):
        if t is not None and t.device != device:
            raise ValueError(
                f"{op}: {name} is on {t.device} but q is on {device}; move all inputs to one device"
            )

    lead_shape = tuple(q.shape[:-1])
    if decay == "none":
        if g is not None:
            raise ValueError(f"{op}: takes no g (no decay), got g of shape {_shape(g)}")
    else:
        want = lead_shape if decay == "scalar" else lead_shape + (K,)
        want_str = f"[{lead}]" if decay == "scalar" else f"[{lead}, K]"
        other = "per-channel ([..., K])" if decay == "scalar" else "scalar per head ([..., H])"
        if g is None:
            raise ValueError(f"{op}: g (log-decay of shape {want_str} = {list(want)}) is required, got None")
        if not isinstance(g, torch.Tensor):
            raise ValueError(f"{op}: g must be a torch.Tensor, got {type(g).__name__}")
        if tuple(g.shape) != want:
            raise ValueError(
                f"{op}: g has shape {_shape(g)}; expected {want_str} = {list(want)} "
                f"(for a {other} decay use the matching op)"
            )
        _check_float(f"{op}: g", g)
        _check_g_values(op, g)
    if delta_rule:
        if beta is None:
            raise ValueError(
                f"{op}: beta (the delta-rule write strength, [{lead}] = {list(lead_shape)}) is required"
            )
        if not isinstance(beta, torch.Tensor):
            raise ValueError(f"{op}: beta must be a torch.Tensor, got {type(beta).__name__}")
        if tuple(beta.shape) != lead_shape:
            raise ValueError(f"{op}: beta has shape {_shape(beta)}; expected [{lead}] = {list(lead_shape)}")
        _check_float(f"{op}: beta", beta)
    elif beta is not None:
        raise ValueError(f"{op}: takes no beta (delta rule off), got beta of shape {_shape(beta)}")

    if state is not None:
        B, H = q.shape[0], q.shape[-2]
        if not isinstance(state, torch.Tensor):
            raise ValueError(f"{op}: {state_name} must be a torch.Tensor, got {type(state).__name__}")
        if tuple(state.shape) != (B, H, K, V):
            raise ValueError(
                f"{op}: {state_name} has shape {_shape(state)}; expected [B, H, K, V] = {[B, H, K, V]}"
            )
        # float64 is accepted for float64 inputs only (references in tests); the contract is float32
        allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
        if state.dtype not in allowed:
            raise ValueError(
                f"{op}: {state_name} has dtype {state.dtype}; it must be torch.float32 (use .float())"
            )
    _check_finite(op, {"q": q, "k": k, "v": v, "beta": beta, state_name: state})


def _validate_scale(op: str, scale: float | None) -> None:
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"{op}: scale={scale!r}; it must be a positive number or None (= K ** -0.5)")


def _check_lower_bound(op: str, g: torch.Tensor | None, lower_bound: float) -> None:
    """`lower_bound` is a promise that g >= lower_bound everywhere (a bounded gate, e.g. K3's g_min = -5)."""
    if not (isinstance(lower_bound, (int, float)) and -float("inf") < lower_bound <= 0):
        raise ValueError(f"{op}: lower_bound={lower_bound!r}; it must be a finite number <= 0, or None")
    if g is not None and g.numel() and _values_checked(g):
        g_min = g.detach().min().item()
        if not g_min >= lower_bound - G_POSITIVE_TOLERANCE:
            raise ValueError(
                f"{op}: g has a minimum value of {g_min:.3g} below lower_bound={lower_bound}; "
                "pass the gate's true bound, or lower_bound=None"
            )


def _check_chunk_size(op: str, chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"{op}: chunk_size={chunk_size!r}; it must be a power of two >= 16 (e.g. 64)")


def _import_triton():  # noqa: ANN202 (returns the kernels.triton module)
    try:
        import kernels.triton as triton_ops
    except ImportError as e:
        raise RuntimeError(
            f"backend='triton' needs the Triton kernels in kernels/triton/, which failed to import ({e}); "
            "use backend='torch' (chunkwise reference) or backend='naive'"
        ) from e
    return triton_ops


def resolved_backend(backend: str, device: torch.device) -> str:
    """What `backend` runs as for tensors on `device`: auto is triton on CUDA, torch elsewhere."""
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    return backend


def _no_triton_on(device: torch.device) -> bool:
    """Whether Triton cannot run on `device`: not a GPU, and its interpreter is off."""
    return device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") != "1"


def check_chunk_sizes(backend: str, device: torch.device, head_dim: int, value_dim: int,
                      chunk_size: int) -> None:
    """ValueError, naming the mixer key and the fix, where the chunked op could not run with these sizes
    on `device`: a run finds it while checking its config instead of at its first step."""
    if resolved_backend(backend, device) != "triton":
        return
    if _no_triton_on(device):
        raise ValueError(f"backend=triton on {device}: the Triton kernels need a GPU here (or "
                         "TRITON_INTERPRET=1 set before triton is imported, which runs them on the CPU, "
                         "slowly); use mixer.backend=auto (torch on the CPU) or a GPU")
    try:
        limits = _import_triton()
    except RuntimeError as error:  # a config check: one line naming the fix, not a traceback
        raise ValueError(str(error)) from error
    other = "or mixer.backend=torch (the chunkwise torch op: any size, slower)"
    for key, size in (("head_dim", head_dim), ("value_dim", value_dim)):
        if size not in limits.HEAD_SIZES:
            raise ValueError(f"{key}={size}: the Triton kernels, which run this layer on {device}, take "
                             f"{', '.join(map(str, limits.HEAD_SIZES))}; choose one, {other}")
    if chunk_size not in limits.CHUNK_SIZES:
        raise ValueError(f"chunk_size={chunk_size}: the Triton kernels, which run this layer on {device}, "
                         f"take {', '.join(map(str, limits.CHUNK_SIZES))}; choose one, {other}")


def _resolve(op: str, backend: str, q: torch.Tensor) -> str:
    if backend == "auto":
        return resolved_backend(backend, q.device)
    if backend == "triton" and _no_triton_on(q.device):
        # Triton itself would only say that it found 0 active drivers
        raise ValueError(
            f"{op}: backend='triton' got tensors on {q.device} but Triton's interpreter is off; move them "
            "to a GPU, set TRITON_INTERPRET=1 before triton is imported (the kernels then run on the CPU, "
            "slowly), or use backend='torch' (or 'auto') on the CPU"
        )
    return backend


def _chunk(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    scale: float | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    backend: str,
    chunk_size: int,
    lower_bound: float | None = None,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one generic chunked op, the family's op `name` (its switches from kernels.family): validate,
    then dispatch to a backend. `recompute_states` (every chunked op's): the Triton backend keeps no
    chunk-entry states for the backward and rebuilds them there (less memory, one more state pass; the
    same result); the other backends keep what autograd keeps."""
    switches = family.op(name)
    op = switches.chunk
    _check_backend(backend)
    _check_chunk_size(op, chunk_size)
    _validate_scale(op, scale)
    decay, delta_rule = switches.decay, switches.delta_rule
    _validate(op, q, k, v, g, beta, initial_state, decay, delta_rule, ("B", "T", "H"), "initial_state")
    if lower_bound is not None:
        _check_lower_bound(op, g, lower_bound)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    backend = _resolve(op, backend, q)
    # the references compute in float32 by design; an enclosing autocast would silently run their
    # matmuls in bf16/fp16
    if backend == "naive":
        with torch.autocast(q.device.type, enabled=False):
            return naive_recurrent(q, k, v, g, beta, scale, initial_state, output_final_state)
    if backend == "torch":
        with torch.autocast(q.device.type, enabled=False):
            return chunk_torch(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
    # lower_bound and recompute_states only change how the Triton kernels compute (same result), so they
    # are passed only there
    extra = {} if lower_bound is None else {"lower_bound": lower_bound}
    if recompute_states:
        extra["recompute_states"] = True
    return _import_triton().triton_chunk(
        q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, **extra
    )


def _step(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    state: torch.Tensor,
    scale: float | None,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one generic single-token step of the family's op `name`: validate, dispatch. Returns (o in q's
    dtype, new fp32 state)."""
    switches = family.op(name)
    op = switches.step
    _check_backend(backend)
    _validate_scale(op, scale)
    if state is None:
        raise ValueError(
            f"{op}: state [B, H, K, V] (float32) is required; start from torch.zeros(B, H, K, V)"
        )
    _validate(op, q, k, v, g, beta, state, switches.decay, switches.delta_rule, ("B", "H"), "state")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    backend = _resolve(op, backend, q)
    if backend == "triton":
        return _import_triton().triton_recurrent_step(q, k, v, g, beta, state, scale)
    # "torch" and "naive" share the recurrence: one token has no chunk structure to exploit
    with torch.autocast(q.device.type, enabled=False):
        o, new_state = recurrent_step(q, k, v, g, beta, state, scale)
    return o.to(q.dtype), new_state


def chunk_linear_attn(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,  # [B, H, K, V] float32
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linear attention, S_t = S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t. Returns (o, S_T | None)."""
    return _chunk(
        "linear_attn", q, k, v, None, None,
        scale, initial_state, output_final_state, backend, chunk_size,
        recompute_states=recompute_states,
    )  # fmt: skip


def chunk_simple_gla(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    g: torch.Tensor,  # [B, T, H] log-decay <= 0
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mamba2-style / simple GLA: S_t = exp(g_t) S_{t-1} + k_t v_t^T, one scalar decay per head."""
    return _chunk(
        "simple_gla", q, k, v, g, None,
        scale, initial_state, output_final_state, backend, chunk_size,
        recompute_states=recompute_states,
    )  # fmt: skip


def chunk_gla(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    g: torch.Tensor,  # [B, T, H, K] log-decay <= 0
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    lower_bound: float | None = None,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """GLA: S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T, one decay per key channel.

    `lower_bound`: optional promise that g >= lower_bound (checked); it lets the Triton backend take a faster
    path and changes nothing in the result.
    """
    return _chunk(
        "gla", q, k, v, g, None,
        scale, initial_state, output_final_state, backend, chunk_size, lower_bound,
        recompute_states,
    )  # fmt: skip


def chunk_delta_rule(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    beta: torch.Tensor,  # [B, T, H]
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """DeltaNet: S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T."""
    return _chunk(
        "delta_rule", q, k, v, None, beta,
        scale, initial_state, output_final_state, backend, chunk_size,
        recompute_states=recompute_states,
    )  # fmt: skip


def chunk_gated_delta_rule(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    g: torch.Tensor,  # [B, T, H] log-decay <= 0
    beta: torch.Tensor,  # [B, T, H]
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet: S_t = (I - beta_t k_t k_t^T) exp(g_t) S_{t-1} + beta_t k_t v_t^T, scalar decay."""
    return _chunk(
        "gated_delta_rule", q, k, v, g, beta,
        scale, initial_state, output_final_state, backend, chunk_size,
        recompute_states=recompute_states,
    )  # fmt: skip


def chunk_kda(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, H, V]
    g: torch.Tensor,  # [B, T, H, K] log-decay <= 0
    beta: torch.Tensor,  # [B, T, H]
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
    chunk_size: int = 64,
    lower_bound: float | None = None,
    recompute_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA: S_t = (I - beta_t k_t k_t^T) Diag(exp g_t) S_{t-1} + beta_t k_t v_t^T, per-channel decay.

    `lower_bound`: as in chunk_gla (e.g. K3's bounded gate, g_min = -5).
    """
    return _chunk(
        "kda", q, k, v, g, beta,
        scale, initial_state, output_final_state, backend, chunk_size, lower_bound,
        recompute_states,
    )  # fmt: skip


def linear_attn_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    state: torch.Tensor,  # [B, H, K, V] float32
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of chunk_linear_attn. Returns (o [B, H, V] in q's dtype, new state [B, H, K, V])."""
    return _step("linear_attn", q, k, v, None, None, state, scale, backend)


def simple_gla_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    g: torch.Tensor,  # [B, H]
    state: torch.Tensor,  # [B, H, K, V] float32
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of chunk_simple_gla."""
    return _step("simple_gla", q, k, v, g, None, state, scale, backend)


def gla_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    g: torch.Tensor,  # [B, H, K]
    state: torch.Tensor,  # [B, H, K, V] float32
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of chunk_gla."""
    return _step("gla", q, k, v, g, None, state, scale, backend)


def delta_rule_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    beta: torch.Tensor,  # [B, H]
    state: torch.Tensor,  # [B, H, K, V] float32
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of chunk_delta_rule."""
    return _step("delta_rule", q, k, v, None, beta, state, scale, backend)


def gated_delta_rule_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    g: torch.Tensor,  # [B, H]
    beta: torch.Tensor,  # [B, H]
    state: torch.Tensor,  # [B, H, K, V] float32
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of chunk_gated_delta_rule."""
    return _step("gated_delta_rule", q, k, v, g, beta, state, scale, backend)


def kda_step(
    q: torch.Tensor,  # [B, H, K]
    k: torch.Tensor,  # [B, H, K]
    v: torch.Tensor,  # [B, H, V]
    g: torch.Tensor,  # [B, H, K]
    beta: torch.Tensor,  # [B, H]
    state: torch.Tensor,  # [B, H, K, V] float32
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step of chunk_kda."""
    return _step("kda", q, k, v, g, beta, state, scale, backend)
