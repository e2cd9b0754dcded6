"""Shared test helpers (importable as `from helpers import CLI_TINY`: pytest puts tests/ on sys.path). The
inputs and the error measure that tests and benchmarks share live in benchmarks/common.py."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

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
