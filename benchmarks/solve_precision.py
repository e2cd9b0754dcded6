"""How much error the UT transform's TF32 products add to L, against storing L in bf16.

`_solve_kernel` inverts (I + diag(beta) A_kk) chunk by chunk: each 16x16 diagonal block by the product
form (I - N)(I + N^2)(I + N^4)(I + N^8), then the blocks below the diagonal by block products. For 16-bit
inputs those products are single-pass TF32 (10 mantissa bits per operand) and L is then stored in bf16
(7 bits). This script emulates the kernel's block algebra on the CPU with every product's operands rounded
to TF32 (or split into 3xTF32, or kept fp32) and reports the relative RMS error of L against the float64
inverse, beside the error of rounding the exact L to bf16, for chunks of KDA-like data (L2-normalized
keys, per-channel bounded log-decays) and of the delta rule (no decay).

    python -m benchmarks.solve_precision                 # 20 chunks per case, K = 128 and 16
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import rel_rms

BC = 16


def tf32(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to TF32 (10 explicit mantissa bits), to nearest, ties away from zero (as cvt.rna)."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def matmul(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """a @ b with fp32 accumulation and operands as the tensor cores see them."""
    if precision == "tf32":
        return tf32(a) @ tf32(b)
    if precision == "tf32x3":
        a_hi, b_hi = tf32(a), tf32(b)
        return a_hi @ b_hi + (a_hi @ tf32(b - b_hi) + tf32(a - a_hi) @ b_hi)
    return a.float() @ b.float()


def inv_unit_lower(n: torch.Tensor, precision: str) -> torch.Tensor:
    """(I + n)^-1 for a strictly lower triangular 16x16 n, in the kernel's order of products."""
    n2 = matmul(n, n, precision)
    p = torch.eye(BC) - n
    n4 = matmul(n2, n2, precision)
    p = p + matmul(p, n2, precision)
    n8 = matmul(n4, n4, precision)
    p = p + matmul(p, n4, precision)
    return p + matmul(p, n8, precision)


def blocked_inverse(a: torch.Tensor, precision: str) -> torch.Tensor:
    """(I + a)^-1 of a strictly lower triangular [C, C] matrix (C = 16, 32, 64), as _solve_kernel forms it."""
    nc = a.shape[0] // BC

    def blk(i: int, j: int) -> torch.Tensor:
        return a[BC * i : BC * (i + 1), BC * j : BC * (j + 1)].float()

    inv = {(i, i): inv_unit_lower(blk(i, i), precision) for i in range(nc)}
    for d in range(1, nc):
        for i in range(d, nc):
            j = i - d
            s = sum(matmul(blk(i, m), inv[m, j], precision) for m in range(j, i))
            inv[i, j] = -matmul(inv[i, i], s, precision)
    out = torch.zeros(a.shape, dtype=torch.float32)
    for (i, j), x in inv.items():
        out[BC * i : BC * (i + 1), BC * j : BC * (j + 1)] = x
    return out


def kda_chunk(gen: torch.Generator, K: int, chunk: int = 64, lower_bound: float = -5.0) -> torch.Tensor:
    """diag(beta) A_kk of one chunk with per-channel log-decays in [lower_bound, 0] (float64)."""
    k = torch.nn.functional.normalize(torch.randn(chunk, K, generator=gen, dtype=torch.float64), dim=-1)
    g = lower_bound * torch.sigmoid(torch.randn(chunk, K, generator=gen, dtype=torch.float64))
    G = g.cumsum(0)
    decay = torch.exp((G[:, None, :] - G[None, :, :]).clamp(max=0.0))
    a = torch.einsum("ik,jk,ijk->ij", k, k, decay).tril(-1)
    beta = torch.rand(chunk, generator=gen, dtype=torch.float64)
    return beta[:, None] * a


def delta_chunk(gen: torch.Generator, K: int, chunk: int = 64) -> torch.Tensor:
    """diag(beta) A_kk of one chunk of the delta rule (no decay, beta in (0, 2))."""
    k = torch.nn.functional.normalize(torch.randn(chunk, K, generator=gen, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(chunk, generator=gen, dtype=torch.float64)
    return beta[:, None] * (k @ k.T).tril(-1)


def errors(make, gen: torch.Generator, n: int) -> dict[str, float]:
    """The largest relative RMS error of L over n chunks, per way of computing or storing it."""
    worst: dict[str, float] = {}
    for _ in range(n):
        a = make(gen)
        exact = torch.linalg.inv(torch.eye(a.shape[0], dtype=torch.float64) + a)
        found = {"bf16 store": rel_rms(exact, exact.to(torch.bfloat16))}
        for precision in ("ieee", "tf32x3", "tf32"):
            found[precision] = rel_rms(exact, blocked_inverse(a, precision))
        for key, value in found.items():
            worst[key] = max(worst.get(key, 0.0), value)
    return worst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=20, help="chunks per case (the worst is reported)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed)
    cases = {
        "KDA, bounded gate -5, K=128": lambda g: kda_chunk(g, 128),
        "KDA, weak decay -0.05, K=128": lambda g: kda_chunk(g, 128, lower_bound=-0.05),
        "delta rule, K=128": lambda g: delta_chunk(g, 128),
        "delta rule, K=16": lambda g: delta_chunk(g, 16),
    }
    print(f"{'case':32} {'bf16 store':>11} {'fp32 FMA':>9} {'3xTF32':>9} {'TF32':>9} {'TF32/bf16':>10}")
    for name, make in cases.items():
        e = errors(make, gen, args.chunks)
        ratio = e["tf32"] / e["bf16 store"]
        row = " ".join(f"{e[key]:9.2e}" for key in ("ieee", "tf32x3", "tf32"))
        print(f"{name:32} {e['bf16 store']:11.2e} {row} {ratio:10.2f}")


if __name__ == "__main__":
    main()
