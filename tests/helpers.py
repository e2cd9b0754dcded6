"""Shared test helpers (importable as `from helpers import rel_rms`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from kernels.family import Decay


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Relative RMS error ||out - ref|| / ||ref||, computed in float64.

    Both tensors must have the same shape. A zero reference gives the absolute norm of out instead, so that an
    all-zero expected value still fails when out is not zero.
    """
    if ref.shape != out.shape:
        raise ValueError(f"rel_rms: shapes differ, ref {tuple(ref.shape)} vs out {tuple(out.shape)}")
    ref64, out64 = ref.detach().double(), out.detach().double()
    denom = ref64.norm().item()
    err = (out64 - ref64).norm().item()
    return err / denom if denom > 0 else err


def make_inputs(
    decay: Decay,
    delta_rule: bool,
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    seed: int,
    lower_bound: float | None = None,
    with_state: bool = True,
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    generator: torch.Generator | None = None,
    layer_gates: bool = False,
    slow: bool = False,
) -> dict[str, torch.Tensor | None]:
    """Random inputs of one op of the family ([B, T, H, D] layout, unit-norm keys, an initial state unless
    with_state=False), the keys of `triton_chunk` / `naive_recurrent`.

    q, k, v and beta are drawn in fp32 and cast to `dtype`; g and the initial state stay fp32 (as a gate and
    the state carry emit them). `generator` (e.g. a CUDA one, drawn from in turn across calls) replaces a
    fresh one seeded with `seed` on `device`. The tests' gates (the default) are log-sigmoid of 2 z, some far
    below -5, or lower_bound * U(0, 1), and beta ~ U(0, 1); layer_gates=True draws them as a gated layer
    emits them instead: log-sigmoid(z) or lower_bound * sigmoid(z), and beta = sigmoid(z). slow (with
    layer_gates): every other channel (head, for the scalar decay) decays slowly, z - 5, so that the state
    carries across chunks.
    """
    gen = generator if generator is not None else torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen)

    q = randn(B, T, H, K).to(dtype)
    k = F.normalize(randn(B, T, H, K), dim=-1).to(dtype)
    v = randn(B, T, H, V).to(dtype)
    g = None
    if decay != "none":
        shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
        if layer_gates:
            z = randn(*shape)
            if slow:
                # g about -0.03 (bounded) or -0.007 (log-sigmoid) there: with z ~ N(0, 1) alone a bounded gate
                # decays by about e^-160 over a chunk, and exp(G_last) and the entering state barely show
                z = z - 5.0 * (torch.arange(shape[-1], device=device) % 2 == 0)
            g = F.logsigmoid(z) if lower_bound is None else lower_bound * torch.sigmoid(z)
        elif lower_bound is None:
            # log-sigmoid gates span strong and weak decay, some far below -5 (the unbounded regime)
            g = F.logsigmoid(2 * randn(*shape))
        else:
            g = lower_bound * torch.rand(shape, device=device, generator=gen)
    beta = None
    if delta_rule:
        beta = (
            torch.sigmoid(randn(B, T, H))
            if layer_gates
            else torch.rand(B, T, H, device=device, generator=gen)
        )
        beta = beta.to(dtype)
    h0 = randn(B, H, K, V) if with_state else None
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": h0}


def token_loop_inputs(decay: Decay, delta_rule: bool, B: int, T: int, H: int, K: int, V: int,
                      generator: torch.Generator, strong_decay: bool = False) -> list[torch.Tensor]:
    """q, k, v[, g][, beta] in float32 for an op's positional call (tests/test_ops.py, bench_ops_cpu.py):
    L2-normalised keys, log-decays logsigmoid(randn), beta in (0, 1); `strong_decay` sets about 5% of the
    decays to -5 .. -20, to exercise the overflow safety of the chunked forms."""
    q = torch.randn(B, T, H, K, generator=generator)
    k = F.normalize(torch.randn(B, T, H, K, generator=generator), dim=-1)
    v = torch.randn(B, T, H, V, generator=generator)
    inputs = [q, k, v]
    if decay != "none":
        shape = (B, T, H) if decay == "scalar" else (B, T, H, K)
        g = F.logsigmoid(torch.randn(*shape, generator=generator))
        if strong_decay:
            strong = torch.rand(*shape, generator=generator) < 0.05
            g = torch.where(strong, -5 - 15 * torch.rand(*shape, generator=generator), g)
        inputs.append(g)
    if delta_rule:
        inputs.append(torch.rand(B, T, H, generator=generator))
    return inputs


# A real task at a tiny size, for runs of `python train.py` in a fresh process (the stand-in task of
# conftest.py exists only inside the test process).
CLI_TINY = [
    "task=palindrome",
    "mixer=attention",
    "task.seq_len=16",
    "task.num_train=64",
    "task.num_eval=16",
    "task.params.vocab_size=8",
    "model.d_model=16",
    "mixer.head_dim=8",
    "trainer.batch_size=8",
    "trainer.device=cpu",
    "trainer.cpu_threads=1",
]


# A W&B run file (`run-<id>.wandb`: what offline mode writes and `wandb sync` uploads): a 7-byte header
# (":W&B", magic 0xBEE1, version 0), then LevelDB's log format in 32 KiB blocks, each chunk a 7-byte
# header (CRC-32 of its type byte and data, length, type) and its data; a block's last < 7 bytes are padding.
_WANDB_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file, as wandb's own protobuf messages (`wandb_internal_pb2.Record`).

    wandb ships no Python reader for these files (its Go core reads them), so this reads the framing
    itself, checking every chunk's CRC, and parses each record with wandb's schema.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    ident, magic, version = _WANDB_HEADER.unpack_from(data)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path}: not a W&B run file (header {ident!r} {magic:#x} v{version})")
    position, pending, payloads = _WANDB_HEADER.size, None, []
    while position < len(data):
        left = _BLOCK - position % _BLOCK
        if left < _CHUNK.size:
            position += left
            continue
        crc, length, kind = _CHUNK.unpack_from(data, position)
        chunk = data[position + _CHUNK.size:position + _CHUNK.size + length]
        position += _CHUNK.size + length
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc or len(chunk) != length:
            raise ValueError(f"{path}: chunk at byte {position - _CHUNK.size - length} is corrupt")
        if kind == _FULL and pending is None:
            payloads.append(chunk)
        elif kind == _FIRST and pending is None:
            pending = chunk
        elif kind in (_MIDDLE, _LAST) and pending is not None:
            pending += chunk
            if kind == _LAST:
                payloads.append(pending)
                pending = None
        else:
            raise ValueError(f"{path}: chunk of type {kind} out of order")
    if pending is not None:
        raise ValueError(f"{path}: ends inside a record")
    records = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records
