"""The short convolution (causal depthwise conv over time + SiLU, kernels/conv.py) as fused Triton kernels.

Channels-last throughout: x [B, T, C] is read in place (no transposes), a program owns a tile of BLOCK_T
positions x BLOCK_C channels, and the W taps are W shifted loads of that tile (the overlap hits the cache).

Backward, with a[t] the pre-activation and da[t] = dy[t] * silu'(a[t]):

    dx[s, c]      = sum_k weight[c, W - 1 - k] * da[s + k, c]          (k = 0 .. W - 1, da = 0 past T)
    dweight[c, j] = sum_{b, t} da[t, c] * x[t - (W - 1) + j, c]

Two forms of the backward (BWD_FORM). "fused": one kernel computes both; it recomputes a[s + k] for its W
shifts instead of reading a saved one (nothing but x is kept for the backward): W sigmoids and W x W
multiply-adds an element. "two_pass": a first kernel computes da once per position (the forward's work
plus dy) with the weight gradient beside it, and stores da in x's dtype, as autograd would store the
activation's gradient; a second computes dx from da's W shifts: fewer instructions for one more round
trip of da through memory. "looped": the two-pass form whose first kernel walks several tiles of
positions a program, the W shifted x tiles loaded as one [W, positions, channels] block, and keeps the
weight gradient's products over all its tiles in registers, summing them across the positions once at its
end (the two-pass kernel sums them for every tile, a reduction across threads, and writes a partial sum
for every tile). Each runs over the positions s = -(W - 1) .. T - 1 for dx when there is an initial state,
so the rows s < 0 are the gradient of the initial state. The weight gradient is a partial sum per program
in fp32, reduced afterwards by one torch sum (no atomics: deterministic).

The two launches are torch custom ops (namespace kda_harness) with fake implementations and a registered
autograd formula, so torch.compile treats them as opaque calls and fuses the glue around them.
"""

from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

# triton.jit reads the switch when a kernel is defined, that is when this module is imported
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# (BLOCK_T, BLOCK_C, num_warps) on the GPU of each kernel, without and with an initial state. 64 channels:
# a bf16 row of a tile is 128 contiguous bytes; the forward without a state takes 128 (two such rows a
# position, half the positions: the same elements a thread), the fastest forward of check_conv.py --sweep
# on the H100 and the H200 by a third. The backward holds its 2W - 1 shifted x tiles at once, hence
# half the positions; the state's pointers cost registers in every tile, hence 16 positions with a state
# (prefill from a cache, decoding). Compiled for sm_90 at W = 4, bf16: 104 registers a thread in the
# forward with a state, 173 / 167 in the backward, no spills (tests/gpu/check_conv.py --compile).
CONFIGS = {
    ("fwd", False): (32, 128, 4),
    ("fwd", True): (16, 64, 4),
    ("bwd", False): (32, 64, 4),
    ("bwd", True): (16, 64, 4),
}
# the backward of a kernel longer than 4 taps holds 2W - 1 > 7 shifted tiles: a quarter of the elements a
# thread (W = 8: 128 / 238 registers, no spills; the tiles above spill there)
LONG_BWD_CONFIG = (16, 64, 8)
# The two-pass backward's kernels hold W shifted tiles at most, as the forward does. Compiled for sm_90 at
# W = 4, bf16: da 157 / 126 registers, dx 72 / 48, no spills; 61 + 24 instructions an element against the
# fused kernel's 151 (check_conv.py --compile); longer kernels take the state's smaller tile.
TWO_PASS_CONFIGS = {
    ("da", False): (64, 64, 4),
    ("da", True): (16, 64, 4),
    ("dx", False): (32, 64, 4),
    ("dx", True): (16, 64, 4),
    # the looped form's first kernel: a tile of 16 positions, its [W, 16, 64] x block and the weight
    # gradient's products over it in fp32 (sm_90, W = 4, bf16: 128 registers a thread against the two-pass
    # kernel's 157 at 64 positions, no spills)
    ("da_looped", False): (16, 64, 4),
    ("da_looped", True): (16, 64, 4),
}
# positions one program of the looped form's first kernel walks (in tiles of its BLOCK_T): its weight
# gradient's partial sums are one row per LOOP_POSITIONS positions instead of one per tile
LOOP_POSITIONS = 128
# "fused", "two_pass" or "looped" (module docstring): two-pass is the faster of the first two on Hopper;
# all within the reference's bounds (check_conv.py --sweep times and checks each)
BWD_FORM = "two_pass"
BWD_FORMS = ("fused", "two_pass", "looped")


@triton.jit
def _load_prefixed(
    x,  # pointer to x[b, 0, 0]
    state,  # pointer to initial_state[b, 0, 0]
    o_p,  # [BLOCK_T] positions in x; -(W - 1) .. -1 are the initial state's columns 0 .. W - 2
    o_c,  # [BLOCK_C] channels
    m_c,  # [BLOCK_C]
    T,
    C,
    W: tl.constexpr,
    HAS_STATE: tl.constexpr,
):
    """x at the positions o_p, with the initial state before position 0 and zeros outside: fp32 [BT, BC]."""
    p_x = x + o_p[:, None] * C + o_c[None, :]
    if HAS_STATE:
        # one load through a pointer chosen per position (the state has x's dtype): two masked loads would
        # hold twice the registers in every tile, though only a sequence's first tile reaches back
        p_s = state + o_c[None, :] * (W - 1) + (o_p + W - 1)[:, None]
        p_x = tl.where((o_p < 0)[:, None], p_s, p_x)
        m_p = (o_p >= 1 - W) & (o_p < T)
    else:
        m_p = (o_p >= 0) & (o_p < T)
    return tl.load(p_x, mask=m_p[:, None] & m_c[None, :], other=0.0).to(tl.float32)


@triton.jit
def _pre_activation(
    x,  # pointer to x[b, 0, 0]
    weight,  # [C, W]
    state,  # pointer to initial_state[b, 0, 0]
    o_t,  # [BLOCK_T] output positions
    o_c,  # [BLOCK_C] channels
    m_c,  # [BLOCK_C]
    T,
    C,
    W: tl.constexpr,
    HAS_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """a[t, c] = sum_j weight[c, j] x[t - (W - 1) + j, c] at the positions o_t: fp32 [BT, BC]."""
    b_a = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(W):
        b_w = tl.load(weight + o_c * W + j, mask=m_c, other=0.0).to(tl.float32)
        b_a += b_w[None, :] * _load_prefixed(x, state, o_t + (j - (W - 1)), o_c, m_c, T, C, W, HAS_STATE)
    return b_a


@triton.jit
def _silu_grad(b_dy, b_a):
    """dy * silu'(a), silu'(a) = sigma(a) (1 + a (1 - sigma(a))): zero where dy is."""
    b_sig = tl.sigmoid(b_a)
    return b_dy * b_sig * (1.0 + b_a * (1.0 - b_sig))


@triton.jit
def _short_conv_fwd_kernel(
    x,  # [B, T, C]
    weight,  # [C, W]
    state,  # [B, C, W - 1] (unused without HAS_STATE)
    y,  # [B, T, C]
    T,
    C,
    NT,  # number of position tiles per sequence
    W: tl.constexpr,
    HAS_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_t = i_bt // NT, i_bt % NT
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    # int64: B * T * C passes 2^31 at paper batch sizes and long sequences
    x += i_b.to(tl.int64) * T * C
    y += i_b.to(tl.int64) * T * C
    state += i_b.to(tl.int64) * C * (W - 1)

    b_a = _pre_activation(x, weight, state, o_t, o_c, m_c, T, C, W, HAS_STATE, BLOCK_T, BLOCK_C)
    b_y = b_a * tl.sigmoid(b_a)
    m_y = (o_t < T)[:, None] & m_c[None, :]
    tl.store(y + o_t[:, None] * C + o_c[None, :], b_y.to(y.dtype.element_ty), mask=m_y)


@triton.jit
def _dx_positions(i_t, W: tl.constexpr, HAS_STATE: tl.constexpr, BLOCK_T: tl.constexpr):
    """The positions s whose dx a tile computes; with an initial state they start at -(W - 1), its columns."""
    if HAS_STATE:
        return i_t * BLOCK_T + tl.arange(0, BLOCK_T) - (W - 1)
    return i_t * BLOCK_T + tl.arange(0, BLOCK_T)


@triton.jit
def _store_dx(dx, dstate, b_dx, o_s, o_c, m_c, T, C, W: tl.constexpr, HAS_STATE: tl.constexpr):
    """b_dx at the positions o_s: s >= 0 into dx, s < 0 into the initial state's gradient."""
    m_x = (o_s >= 0) & (o_s < T)
    p_dx = dx + o_s[:, None] * C + o_c[None, :]
    tl.store(p_dx, b_dx.to(dx.dtype.element_ty), mask=m_x[:, None] & m_c[None, :])
    if HAS_STATE:
        m_s = o_s < 0
        p_ds = dstate + o_c[None, :] * (W - 1) + (o_s + W - 1)[:, None]
        tl.store(p_ds, b_dx.to(dstate.dtype.element_ty), mask=m_s[:, None] & m_c[None, :])


@triton.jit
def _short_conv_bwd_kernel(
    x,  # [B, T, C]
    weight,  # [C, W]
    state,  # [B, C, W - 1] (unused without HAS_STATE)
    dy,  # [B, T, C]
    dx,  # [B, T, C]
    dstate,  # [B, C, W - 1] (unused without HAS_STATE)
    dweight_partial,  # [B * NT, W, C] fp32: one partial sum per program row
    T,
    C,
    NT,  # number of position tiles per sequence (over T + W - 1 positions with HAS_STATE)
    W: tl.constexpr,
    HAS_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_t = i_bt // NT, i_bt % NT
    o_s = _dx_positions(i_t, W, HAS_STATE, BLOCK_T)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    x += i_b.to(tl.int64) * T * C
    dy += i_b.to(tl.int64) * T * C
    dx += i_b.to(tl.int64) * T * C
    state += i_b.to(tl.int64) * C * (W - 1)
    dstate += i_b.to(tl.int64) * C * (W - 1)

    b_dx = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    # da at the tile's own positions (k = 0), kept for the weight gradient
    b_da0 = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(W):
        # the output position o_s + k reads x[o_s] through tap W - 1 - k: recompute its pre-activation
        o_p = o_s + k
        # not _pre_activation(o_p): its shifts off o_p are not CSE'd across k (288 more instructions)
        b_a = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
        for i in tl.static_range(W):
            b_w = tl.load(weight + o_c * W + i, mask=m_c, other=0.0).to(tl.float32)
            # the shift as one constant, so that the loads of equal shifts are one load after CSE
            b_x = _load_prefixed(x, state, o_s + (k + i - (W - 1)), o_c, m_c, T, C, W, HAS_STATE)
            b_a += b_w[None, :] * b_x
        m_p = (o_p >= 0) & (o_p < T)
        p_dy = dy + o_p[:, None] * C + o_c[None, :]
        b_dy = tl.load(p_dy, mask=m_p[:, None] & m_c[None, :], other=0.0).to(tl.float32)
        b_da = _silu_grad(b_dy, b_a)
        b_w = tl.load(weight + o_c * W + (W - 1 - k), mask=m_c, other=0.0).to(tl.float32)
        b_dx += b_w[None, :] * b_da
        if k == 0:
            b_da0 = b_da

    _store_dx(dx, dstate, b_dx, o_s, o_c, m_c, T, C, W, HAS_STATE)

    # b_da0 is zero at s < 0 and s >= T (no output there), so the state's rows add nothing here
    p_dw = dweight_partial + i_bt.to(tl.int64) * W * C + o_c
    for j in tl.static_range(W):
        b_x = _load_prefixed(x, state, o_s + (j - (W - 1)), o_c, m_c, T, C, W, HAS_STATE)
        tl.store(p_dw + j * C, tl.sum(b_da0 * b_x, axis=0), mask=m_c)


@triton.jit
def _short_conv_da_kernel(
    x,  # [B, T, C]
    weight,  # [C, W]
    state,  # [B, C, W - 1] (unused without HAS_STATE)
    dy,  # [B, T, C]
    da,  # [B, T, C] in x's dtype: dy * silu'(a)
    dweight_partial,  # [B * NT, W, C] fp32: one partial sum per program row
    T,
    C,
    NT,  # number of position tiles per sequence
    W: tl.constexpr,
    HAS_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_t = i_bt // NT, i_bt % NT
    o_t = i_t * BLOCK_T + tl.arange(0, BLOCK_T)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    x += i_b.to(tl.int64) * T * C
    dy += i_b.to(tl.int64) * T * C
    da += i_b.to(tl.int64) * T * C
    state += i_b.to(tl.int64) * C * (W - 1)

    # the forward's pre-activation at the tile's own positions, once
    b_a = _pre_activation(x, weight, state, o_t, o_c, m_c, T, C, W, HAS_STATE, BLOCK_T, BLOCK_C)
    m_t = (o_t < T)[:, None] & m_c[None, :]
    b_dy = tl.load(dy + o_t[:, None] * C + o_c[None, :], mask=m_t, other=0.0).to(tl.float32)
    # zero past T, where dy is
    b_da = _silu_grad(b_dy, b_a)
    tl.store(da + o_t[:, None] * C + o_c[None, :], b_da.to(da.dtype.element_ty), mask=m_t)
    # the weight gradient from the unrounded da; the x tiles are the ones loaded above (same shifts)
    p_dw = dweight_partial + i_bt.to(tl.int64) * W * C + o_c
    for j in tl.static_range(W):
        b_x = _load_prefixed(x, state, o_t + (j - (W - 1)), o_c, m_c, T, C, W, HAS_STATE)
        tl.store(p_dw + j * C, tl.sum(b_da * b_x, axis=0), mask=m_c)


@triton.jit
def _short_conv_da_looped_kernel(
    x,  # [B, T, C]
    weight,  # [C, W]
    state,  # [B, C, W - 1] (unused without HAS_STATE)
    dy,  # [B, T, C]
    da,  # [B, T, C] in x's dtype: dy * silu'(a)
    dweight_partial,  # [B * NP, W, C] fp32: one partial sum per program row
    T,
    C,
    NP,  # number of programs per sequence, each over SPAN tiles of BLOCK_T positions
    W: tl.constexpr,
    WP: tl.constexpr,  # W rounded up to a power of two (the block's first dimension)
    SPAN: tl.constexpr,
    HAS_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    i_bp, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_p = i_bp // NP, i_bp % NP
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    o_j = tl.arange(0, WP)
    m_j = o_j < W
    x += i_b.to(tl.int64) * T * C
    dy += i_b.to(tl.int64) * T * C
    da += i_b.to(tl.int64) * T * C
    state += i_b.to(tl.int64) * C * (W - 1)

    # tap j of the block: weight[c, j], zero past W (so that the padded taps add nothing)
    b_w = tl.load(weight + o_c[None, :] * W + o_j[:, None], mask=m_j[:, None] & m_c[None, :], other=0.0)
    b_w = b_w.to(tl.float32)[:, None, :]
    b_dw = tl.zeros([WP, BLOCK_T, BLOCK_C], dtype=tl.float32)
    for i_s in range(SPAN):
        o_t = (i_p * SPAN + i_s) * BLOCK_T + tl.arange(0, BLOCK_T)
        # x[t - (W - 1) + j] at [j, t, c]: position -(W - 1) .. -1 from the initial state, zero outside
        o_p = o_t[None, :, None] + (o_j - (W - 1))[:, None, None]
        p_x = x + o_p * C + o_c[None, None, :]
        if HAS_STATE:
            # one load through a pointer chosen per element, as _load_prefixed does
            p_s = state + o_c[None, None, :] * (W - 1) + (o_p + W - 1)
            p_x = tl.where(o_p < 0, p_s, p_x)
            m_p = (o_p >= 1 - W) & (o_p < T)
        else:
            m_p = (o_p >= 0) & (o_p < T)
        b_x = tl.load(p_x, mask=m_p & m_c[None, None, :], other=0.0).to(tl.float32)
        b_a = tl.sum(b_w * b_x, axis=0)
        m_t = (o_t < T)[:, None] & m_c[None, :]
        b_dy = tl.load(dy + o_t[:, None] * C + o_c[None, :], mask=m_t, other=0.0).to(tl.float32)
        # zero past T, where dy is
        b_da = _silu_grad(b_dy, b_a)
        tl.store(da + o_t[:, None] * C + o_c[None, :], b_da.to(da.dtype.element_ty), mask=m_t)
        # the weight gradient from the unrounded da, summed over positions once, after the loop
        b_dw += b_da[None, :, :] * b_x
    p_dw = dweight_partial + i_bp.to(tl.int64) * W * C + o_j[:, None] * C + o_c[None, :]
    tl.store(p_dw, tl.sum(b_dw, axis=1), mask=m_j[:, None] & m_c[None, :])


@triton.jit
def _short_conv_dx_kernel(
    da,  # [B, T, C]
    weight,  # [C, W]
    dx,  # [B, T, C]
    dstate,  # [B, C, W - 1] (unused without HAS_STATE)
    T,
    C,
    NT,  # number of position tiles per sequence (over T + W - 1 positions with HAS_STATE)
    W: tl.constexpr,
    HAS_STATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    i_b, i_t = i_bt // NT, i_bt % NT
    o_s = _dx_positions(i_t, W, HAS_STATE, BLOCK_T)
    o_c = i_c * BLOCK_C + tl.arange(0, BLOCK_C)
    m_c = o_c < C
    da += i_b.to(tl.int64) * T * C
    dx += i_b.to(tl.int64) * T * C
    dstate += i_b.to(tl.int64) * C * (W - 1)

    b_dx = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(W):
        # the output position s + k reads x[s] through tap W - 1 - k
        o_p = o_s + k
        m_p = (o_p >= 0) & (o_p < T)
        b_da = tl.load(da + o_p[:, None] * C + o_c[None, :], mask=m_p[:, None] & m_c[None, :], other=0.0)
        b_w = tl.load(weight + o_c * W + (W - 1 - k), mask=m_c, other=0.0).to(tl.float32)
        b_dx += b_w[None, :] * b_da.to(tl.float32)
    _store_dx(dx, dstate, b_dx, o_s, o_c, m_c, T, C, W, HAS_STATE)


def _config(kernel: str, has_state: bool, C: int, W: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_C, num_warps) of one launch."""
    if INTERPRET:
        # the interpreter runs a program as numpy calls: fewer, larger programs are faster
        return 64, max(16, min(256, triton.next_power_of_2(C))), 4
    if kernel == "bwd" and W > 4:
        return LONG_BWD_CONFIG
    if kernel in ("da", "dx", "da_looped"):
        return TWO_PASS_CONFIGS[(kernel, has_state or W > 4)]
    return CONFIGS[(kernel, has_state)]


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None) -> None:
    # the ops' own callers are kernels.conv.short_conv (which checks everything) and code calling them direct
    if x.dim() != 3 or weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"short_conv: x {list(x.shape)} and weight {list(weight.shape)}; expected [B, T, C] and [C, W]"
        )
    if initial_state is not None and initial_state.dtype != x.dtype:
        raise ValueError(
            f"short_conv: initial_state is {initial_state.dtype} but x {x.dtype}; the kernel reads both "
            "through one pointer: cast the state to x's dtype (kernels.conv.short_conv does)"
        )


def _device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    # Triton launches on the current CUDA device; make it x's (several runs packed on one host)
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@torch.library.custom_op("kda_harness::short_conv_fwd", mutates_args=())
def short_conv_fwd(x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None) -> torch.Tensor:
    """y [B, T, C] in x's dtype from x [B, T, C], weight [C, W] and an initial state [B, C, W - 1]."""
    _check_inputs(x, weight, initial_state)
    x, weight = x.contiguous(), weight.contiguous()
    B, T, C = x.shape
    W = weight.shape[1]
    y = torch.empty(B, T, C, device=x.device, dtype=x.dtype)
    if B * T * C == 0:
        return y
    has_state = initial_state is not None
    state = initial_state.contiguous() if has_state else x
    BT, BC, num_warps = _config("fwd", has_state, C, W)
    NT = triton.cdiv(T, BT)
    with _device(x):
        _short_conv_fwd_kernel[(B * NT, triton.cdiv(C, BC))](
            x, weight, state, y, T, C, NT,
            W=W, HAS_STATE=has_state, BLOCK_T=BT, BLOCK_C=BC, num_warps=num_warps,
        )  # fmt: skip
    return y


@short_conv_fwd.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("kda_harness::short_conv_bwd", mutates_args=())
def short_conv_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [B, T, C], dweight [C, W], dinitial_state [B, C, W - 1], or an empty tensor without a state)."""
    _check_inputs(x, weight, initial_state)
    dy, x, weight = dy.contiguous(), x.contiguous(), weight.contiguous()
    B, T, C = x.shape
    W = weight.shape[1]
    has_state = initial_state is not None
    dx = torch.empty(B, T, C, device=x.device, dtype=x.dtype)
    if has_state:
        state = initial_state.contiguous()
        dstate = torch.empty(B, C, W - 1, device=x.device, dtype=initial_state.dtype)
    else:
        state = dstate = x
    positions = T + (W - 1 if has_state else 0)
    if BWD_FORM not in BWD_FORMS:
        raise ValueError(f"short_conv: BWD_FORM {BWD_FORM!r}; expected one of {BWD_FORMS}")
    if BWD_FORM in ("two_pass", "looped"):
        dweight_partial = _two_pass_bwd(dy, x, weight, state, dx, dstate, has_state, BWD_FORM == "looped")
    else:
        BT, BC, num_warps = _config("bwd", has_state, C, W)
        NT = triton.cdiv(positions, BT)
        dweight_partial = torch.empty(B * NT, W, C, device=x.device, dtype=torch.float32)
        if B * C > 0 and NT > 0:
            with _device(x):
                _short_conv_bwd_kernel[(B * NT, triton.cdiv(C, BC))](
                    x, weight, state, dy, dx, dstate, dweight_partial, T, C, NT,
                    W=W, HAS_STATE=has_state, BLOCK_T=BT, BLOCK_C=BC, num_warps=num_warps,
                )  # fmt: skip
    dweight = dweight_partial.sum(0).t().to(weight.dtype).contiguous()  # [C, W]
    return dx, dweight, dstate if has_state else x.new_empty(0)


def loop_span(block_t: int) -> int:
    """Tiles of block_t positions one program of the looped form's first kernel walks."""
    return max(1, LOOP_POSITIONS // block_t)


def _two_pass_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor,
                  dx: torch.Tensor, dstate: torch.Tensor, has_state: bool,
                  looped: bool = False) -> torch.Tensor:
    """The two-pass (or looped) backward into dx and dstate; returns the weight gradient's partial sums."""
    B, T, C = x.shape
    W = weight.shape[1]
    BT, BC, warps = _config("da_looped" if looped else "da", has_state, C, W)
    span = loop_span(BT) if looped else 1
    # programs per sequence, each over `span` tiles of BT positions
    NT = triton.cdiv(T, BT * span)
    dweight_partial = torch.empty(B * NT, W, C, device=x.device, dtype=torch.float32)
    if B * C == 0 or NT == 0:
        dweight_partial.zero_()
        dx.zero_()
        if has_state:
            dstate.zero_()
        return dweight_partial
    da = torch.empty(B, T, C, device=x.device, dtype=x.dtype)
    with _device(x):
        if looped:
            _short_conv_da_looped_kernel[(B * NT, triton.cdiv(C, BC))](
                x, weight, state, dy, da, dweight_partial, T, C, NT,
                W=W, WP=triton.next_power_of_2(W), SPAN=span, HAS_STATE=has_state, BLOCK_T=BT, BLOCK_C=BC,
                num_warps=warps,
            )  # fmt: skip
        else:
            _short_conv_da_kernel[(B * NT, triton.cdiv(C, BC))](
                x, weight, state, dy, da, dweight_partial, T, C, NT,
                W=W, HAS_STATE=has_state, BLOCK_T=BT, BLOCK_C=BC, num_warps=warps,
            )  # fmt: skip
        launch_dx(da, weight, dx, dstate, has_state)
    return dweight_partial


def launch_dx(da: torch.Tensor, weight: torch.Tensor, dx: torch.Tensor, dstate: torch.Tensor,
              has_state: bool) -> None:
    """The two-pass backward's second kernel: dx (and dstate) from da [B, T, C] (check_conv times it
    alone)."""
    B, T, C = da.shape
    W = weight.shape[1]
    BT, BC, warps = _config("dx", has_state, C, W)
    NT = triton.cdiv(T + (W - 1 if has_state else 0), BT)
    _short_conv_dx_kernel[(B * NT, triton.cdiv(C, BC))](
        da, weight, dx, dstate, T, C, NT,
        W=W, HAS_STATE=has_state, BLOCK_T=BT, BLOCK_C=BC, num_warps=warps,
    )  # fmt: skip


@short_conv_bwd.register_fake
def _(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, initial_state: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dstate = initial_state.new_empty(initial_state.shape) if initial_state is not None else x.new_empty(0)
    return x.new_empty(x.shape), weight.new_empty(weight.shape), dstate


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, initial_state = inputs
    ctx.save_for_backward(x, weight, initial_state)


def _backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x, weight, initial_state = ctx.saved_tensors
    dx, dweight, dstate = short_conv_bwd(dy, x, weight, initial_state)
    return dx, dweight, dstate if initial_state is not None else None


short_conv_fwd.register_autograd(_backward, setup_context=_setup_context)


def triton_short_conv(
    x: torch.Tensor,  # [B, T, C]
    weight: torch.Tensor,  # [C, W]
    initial_state: torch.Tensor | None = None,  # [B, C, W - 1]
) -> torch.Tensor:
    """y [B, T, C] in x's dtype, differentiable in all three inputs (shapes checked by kernels.conv)."""
    if x.device.type == "cpu" and not INTERPRET:
        raise ValueError(
            "short_conv: the Triton kernel got CPU tensors but Triton's interpreter is off; set "
            "TRITON_INTERPRET=1 before triton is imported, or use backend='torch' (or 'auto') on the CPU"
        )
    if initial_state is not None:
        # the kernel reads the state and x through one pointer; the reference casts it the same way
        initial_state = initial_state.to(x.dtype)
    return short_conv_fwd(x, weight, initial_state)
