"""The pieces the stages of the chunk kernels share: the constants (the interpreter switch, the 16-row
sub-chunk edge, the bounded gate's limit, the uint16 decay's steps), the dot-operand cast, the exponential,
the programmatic-dependent-launch prologue, the base pointers' moves at a kernel's entry (_head,
_rows), the loads of a [rows, D] tile, and the per-chunk decay helpers of the state passes and the dv
backward (branching on DECAY). No kernel here.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

try:  # grid dependency control (programmatic dependent launch, sm_90+), setting fwd.pdl
    import triton.language.extra.cuda  # noqa: F401

    HAS_GDC = hasattr(tl.extra.cuda, "gdc_wait")
except ImportError:
    HAS_GDC = False

# The interpreter runs on the CPU: one config, no autotune; its bf16 dots and casts as a GPU's (interpret.py).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# the per-channel intra kernels' tiles of exponentials as ex2.approx.ftz.f32 (_exp), compiled for a GPU; the
# interpreter has no inline PTX
EX2_FTZ = tl.constexpr(not INTERPRET)
# Sub-chunk edge: the diagonal blocks of the per-channel decay are handled 16 rows at a time.
BC = 16

# the plan's g16: the within-block decays G_a - G (log2 units, >= 0) stored as uint16 in steps of 1/512
# (0.068% at most in an exponential, 0.039% RMS, beside bf16's 0.2% and 0.11%); the cap 65535 / 512 = 128
# is 2^128, where fp32 overflows anyway (15 steps of g < -5.9; lower_bound >= MIN_LOWER_BOUND keeps clear)
G16_STEPS = tl.constexpr(512.0)
# log2(e): exp(x) = 2^(x log2(e)); G times it where its readers take 2^x (the plan's log2)
LOG2E = tl.constexpr(1.4426950408889634)
# exp(-lower_bound * (BC - 1)) must stay finite in fp32/bf16 (max ~ e^88): |lower_bound| <= 5.5 leaves margin.
MIN_LOWER_BOUND = -5.5


@triton.jit
def _dot_cast(x, LOWP: tl.constexpr):
    # bf16 operands feed the tensor cores for 16-bit inputs; fp32 inputs keep fp32
    if LOWP:
        return x.to(tl.bfloat16)
    else:
        return x


@triton.jit
def _exp(x, FTZ: tl.constexpr, LOG2: tl.constexpr = 0):
    # exp(x). FTZ (EX2_FTZ, compiled for a GPU only): as ex2.approx.ftz.f32 of x log2(e), one
    # MUFU.EX2 and its multiply; tl.exp's ex2.approx.f32 keeps subnormal results, which ptxas makes a compare,
    # two predicated multiplies and a select around each MUFU (sm_90 SASS). The same approximation (2^-22
    # relative) but for results under 2^-126 (1.2e-38), which become 0: decays that small change nothing.
    # LOG2 (the plan's log2): x is in log2 units already (G stored times log2(e)), so 2^x, no multiply
    if LOG2:
        y = x
    else:
        y = x * LOG2E
    if FTZ:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;",
            "=f,f",
            [y],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    elif LOG2:
        return tl.exp2(x)
    else:
        return tl.exp(x)


@triton.jit
def _pdl_start(PDL: tl.constexpr):
    # a kernel of the forward launched as a programmatic dependent of the one before it (setting fwd.pdl):
    # it lets the next kernel's programs be placed once all of its own have started, then waits until the
    # kernel before it has finished and its writes are visible, before any load or store of its own. Only
    # the launch and the placing of programs overlap the previous kernel's last wave, nothing it reads
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()


@triton.jit
def _head(i_bh, T, H: tl.constexpr):
    # the row of the [B, T, H, D] tensors where head i_bh = (batch, head) of the grid starts: each kernel
    # moves its base pointers there once at entry (_rows), and token t of the head is then at x + t * H * D
    i_b, i_h = i_bh // H, i_bh % H
    return i_b * T * H + i_h


@triton.jit
def _rows(xs, row, D: tl.constexpr):
    # the pointers of the tuple xs moved to row `row` of D elements (a head's first token of [B, T, H, D]
    # tensors: row _head(...)). Every pointer must be given: Triton 3.6's compiler cannot return a None from
    # a function, so a buffer a launch may leave out moves at the call site under `if x is not None`. The
    # adds compile in the order written, and another order is other PTX (and other registers)
    N: tl.constexpr = len(xs)
    tl.static_assert(N <= 6, "_rows takes one to six pointers")
    d = row * D
    if N == 1:
        return (xs[0] + d,)
    elif N == 2:
        return xs[0] + d, xs[1] + d
    elif N == 3:
        return xs[0] + d, xs[1] + d, xs[2] + d
    elif N == 4:
        return xs[0] + d, xs[1] + d, xs[2] + d, xs[3] + d
    elif N == 5:
        return xs[0] + d, xs[1] + d, xs[2] + d, xs[3] + d, xs[4] + d
    else:
        return xs[0] + d, xs[1] + d, xs[2] + d, xs[3] + d, xs[4] + d, xs[5] + d


@triton.jit
def _decay_head(gc, bh, K: tl.constexpr, DECAY: tl.constexpr):
    # G's base pointer moved to head row bh (_head): G is [B, T, H] for the scalar decay, [B, T, H, K] for
    # the per-channel one (given: without a decay the call site skips it, as for _rows)
    if DECAY == "channel":
        gc = gc + bh * K
    else:
        gc = gc + bh
    return gc


@triton.jit
def _load_block(x, o_t, m_t, o_d, H: tl.constexpr, D: tl.constexpr):
    # rows o_t, columns o_d of one head of a [B, T, H, D] tensor (x at the head, _head), as fp32; invalid rows
    # are 0
    return tl.load(x + o_t[:, None] * (H * D) + o_d[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)


@triton.jit
def _load_row_block(x, t, o_d, T, H: tl.constexpr, D: tl.constexpr):
    # one row t, columns o_d of one head of a [B, T, H, D] tensor as fp32 (0 if t >= T)
    return tl.load(x + t * (H * D) + o_d, mask=(o_d * 0 + t) < T, other=0.0).to(tl.float32)


@triton.jit
def _load_rows(x, o_t, m_t, H: tl.constexpr, D: tl.constexpr):
    # rows o_t of one head of a [B, T, H, D] tensor as fp32 [len(o_t), D]; invalid rows are 0
    return _load_block(x, o_t, m_t, tl.arange(0, D), H, D)


@triton.jit
def _load_row(x, t, T, H: tl.constexpr, D: tl.constexpr):
    # one row t of one head of a [B, T, H, D] tensor as fp32 [D] (0 if t >= T)
    return _load_row_block(x, t, tl.arange(0, D), T, H, D)


@triton.jit
def _load_vec(x, o_t, m_t, H: tl.constexpr):
    # one head of a [B, T, H] tensor at rows o_t as fp32
    return tl.load(x + o_t * H, mask=m_t, other=0.0).to(tl.float32)


@triton.jit
def _unchain(x, on, UNCHAIN: tl.constexpr):
    # x through a run-time branch that is always taken (on: a run-time truth). Triton gives a product whose
    # result reaches another product (a chain) all its warps along the rows (flash attention's layout): with
    # 8 warps and 64 rows, on sm_90 both warpgroups then compute the same 64 rows. Its search for the chain
    # stops at the branch's yield, so the product takes the layout of an unchained one, the warpgroups
    # splitting the columns. The branch never taken keeps a product of its own, so that it is not folded
    # into a select (which the search would follow)
    if UNCHAIN:
        if on:
            y = x
        else:
            y = x * 0.5
    else:
        y = x
    return y


@triton.jit
def _chunk_small(
    gc,
    beta,
    i_t,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    DECAY: tl.constexpr,
    BETA: tl.constexpr,
    LOG2: tl.constexpr = 0,
):
    # a state pass's small inputs of chunk i_t, too small for Triton to pipeline (sm_90 TTGIR: plain loads,
    # where the tiles are asynchronous copies a stage ahead), so each a wait of the sequential pass on memory
    # where it is used; with the plan's state_early they load at the top of the chunk's step instead: the
    # per-channel decay to the chunk's end exp(G_last) ([K]), or the scalar decay's column G ([BT]); beta
    # ([BT], BETA)
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    if DECAY == "channel":
        b_gv = _exp(_load_row(gc, tl.minimum(i_t * BT + BT, T) - 1, T, H, K), False, LOG2)
    elif DECAY == "scalar":
        b_gv = _load_vec(gc, o_t, m_t, H)
    else:
        b_gv = tl.full([K], 1.0, dtype=tl.float32)
    if BETA:
        b_b = _load_vec(beta, o_t, m_t, H)
    else:
        b_b = tl.zeros([BT], dtype=tl.float32)
    return b_gv, b_b


@triton.jit
def _key_decay_to_end(
    k,
    gc,
    o_t,
    m_t,
    t_last,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    DECAY: tl.constexpr,
):
    # K_d = K * exp(G_last - G): keys decayed to the chunk's last row ([BT, K]), and exp(G_last) ([K]).
    # For the per-channel decay, k already holds K_d (written by the intra or the cumsum kernel)
    b_k = _load_rows(k, o_t, m_t, H, K)
    if DECAY == "channel":
        b_kd = b_k
        b_dl = tl.exp(_load_row(gc, t_last, T, H, K))
    elif DECAY == "scalar":
        b_gl = tl.load(gc + t_last * H)
        b_g = _load_vec(gc, o_t, m_t, H)
        b_kd = b_k * tl.exp(tl.where(m_t, b_gl - b_g, float("-inf")))[:, None]
        b_dl = tl.exp(b_gl + tl.zeros([K], dtype=tl.float32))
    else:
        b_kd = b_k
        b_dl = tl.full([K], 1.0, dtype=tl.float32)
    return b_kd, b_dl


@triton.jit
def _key_decay_from(k, b_gv, o_t, m_t, t_last, H: tl.constexpr, K: tl.constexpr, DECAY: tl.constexpr):
    # _key_decay_to_end from the chunk's b_gv of _chunk_small (loaded earlier)
    b_k = _load_rows(k, o_t, m_t, H, K)
    if DECAY == "scalar":
        b_gl = tl.sum(tl.where(o_t == t_last, b_gv, 0.0), 0)
        b_kd = b_k * tl.exp(tl.where(m_t, b_gl - b_gv, float("-inf")))[:, None]
        b_dl = tl.exp(b_gl + tl.zeros([K], dtype=tl.float32))
    else:
        b_kd = b_k
        b_dl = b_gv
    return b_kd, b_dl


@triton.jit
def _decay_rows(b_x, b_gv, DECAY: tl.constexpr):
    # rows of Q or K times exp(G) for the scalar decay (b_gv: the chunk's column G); the per-channel decay's
    # operands come decayed already
    if DECAY == "scalar":
        b_x = b_x * tl.exp(b_gv)[:, None]
    return b_x


@triton.jit
def _load_qg(q, gc, o_t, m_t, H: tl.constexpr, K: tl.constexpr, DECAY: tl.constexpr):
    # Q * exp(G) ([BT, K]): queries (or keys) read the state decayed from the chunk start. For the per-channel
    # decay, q already holds Q * exp(G) (written by the intra forward)
    b_q = _load_rows(q, o_t, m_t, H, K)
    if DECAY == "scalar":
        b_q = b_q * tl.exp(_load_vec(gc, o_t, m_t, H))[:, None]
    return b_q
