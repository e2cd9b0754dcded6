"""One on-disk home per machine for what compiling a run produces, so that a sweep compiles once.

A compiled run's first step pays for tracing, compiling the graphs and building their Triton kernels. The
products persist on disk between processes in three caches: inductor's FX graph cache (the compiled
graphs, with their Triton kernels bundled), AOTAutograd's (the forward and backward graphs) and Triton's
own (the kernel binaries, our ops' included). `share_compile_caches` turns them on and points inductor's
and Triton's directories at one directory per machine (under ~/.cache, which outlives /tmp, inductor's
default), so every job of a sweep on the machine, each its own process, finds what the first one built.
A directory or switch the user set in the environment is kept.

Inductor's directory is one per version of kernels/. Our custom ops (the chunk op, the short convolution,
SwiGLU) are opaque to the compiler: their fake implementations and autograd formulas decide what a compiled
graph hands its backward (the chunk op's kept buffers, chunk.saved_layout), yet AOTAutograd's cache key
covers the traced graph, not their source, so a graph cached under another version of them is reused and
fails on a buffer's shape (or, where the shapes agree, hands the backward the wrong buffer). Triton's
binaries are keyed by their source and stay shared. A version's directory that no run has set up for
PRUNE_DAYS is removed when a run sets up the caches.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import shutil
import time
from pathlib import Path

INDUCTOR_DIR, TRITON_DIR = "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"
DIR_VARIABLES = (("inductor", INDUCTOR_DIR), ("triton", TRITON_DIR))
# (config module, switch, the environment variable that forces it): turned on unless the variable is set
SWITCHES = (
    ("torch._inductor.config", "fx_graph_cache", "TORCHINDUCTOR_FX_GRAPH_CACHE"),
    ("torch._inductor.config", "autotune_local_cache", None),
    ("torch._functorch.config", "enable_autograd_cache", "TORCHINDUCTOR_AUTOGRAD_CACHE"),
)
# the counters (torch._dynamo.utils.counters) that say whether the first step found the caches' entries
COUNTERS = (
    ("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"),
    ("inductor", "fxgraph_cache_bypass"), ("aot_autograd", "autograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"), ("aot_autograd", "autograd_cache_bypass"),
)


# the sources whose version names inductor's directory
KERNELS = Path(__file__).resolve().parents[1] / "kernels"
PRUNE_DAYS = 14


@functools.cache
def code_version(kernels: Path = KERNELS) -> str:
    """12 hex digits of a hash of every .py file under `kernels` (its path and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(kernels.rglob("*.py")):
        digest.update(path.relative_to(kernels).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def inductor_name(version: str | None = None) -> str:
    """The name of inductor's directory under the root for this version of kernels/ (the current one)."""
    return f"inductor-{version or code_version()}"


def default_root() -> Path:
    """~/.cache/kda_harness/compile ($XDG_CACHE_HOME in place of ~/.cache when set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "kda_harness" / "compile"


def cache_dirs(root: Path | None = None) -> dict[str, Path]:
    """{"inductor": dir, "triton": dir}: the directory the environment names, else root/inductor-VERSION
    (inductor_name) and root/triton (root: default_root()); what share_compile_caches gives a run."""
    root = default_root() if root is None else root
    own = {"inductor": root / inductor_name(), "triton": root / "triton"}
    return {name: Path(os.environ.get(variable) or own[name]) for name, variable in DIR_VARIABLES}


def prune(root: Path, keep: Path, days: float = PRUNE_DAYS) -> list[Path]:
    """Remove inductor's directories of other versions of kernels/ under root (and the unversioned one of
    older harnesses) that no run has set up for `days`; returns those removed."""
    removed = []
    for path in [root / "inductor", *root.glob("inductor-*")]:
        if path == keep or not path.is_dir():
            continue
        if time.time() - path.stat().st_mtime > days * 86400:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def share_compile_caches(root: Path | None = None) -> dict[str, str]:
    """Turn on the compile caches and give inductor and Triton one directory per machine (root/inductor-
    VERSION, root/triton) where the environment names none; returns {"inductor": dir, "triton": dir} as
    used. Call before the first compile: both read their directory from the environment when they write."""
    own = cache_dirs(root)
    dirs = {}
    for name, variable in DIR_VARIABLES:
        if not os.environ.get(variable):
            os.environ[variable] = str(own[name])
            if name == "inductor":
                # set up now: its mtime says when a run last used this version's directory
                own[name].mkdir(parents=True, exist_ok=True)
                os.utime(own[name])
                prune(own[name].parent, own[name])
        dirs[name] = os.environ[variable]
    for module_name, switch, variable in SWITCHES:
        module = importlib.import_module(module_name)
        # a torch without the switch has no such cache; one forced by the user's variable is theirs
        if hasattr(module, switch) and not (variable and variable in os.environ):
            setattr(module, switch, True)
    return dirs


def compiled_frames() -> int:
    """How many Python frames torch.compile has converted to graphs so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def graph_skips() -> int:
    """How many times inductor has skipped CUDA graphs for a compiled graph so far in this process (it
    logs why: a CPU tensor, a mutated input, dynamic shapes)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def cache_counts() -> dict[str, int]:
    """The compile caches' hits, misses and bypasses so far in this process, as `cache_name: count`."""
    from torch._dynamo.utils import counters

    return {name: int(counters[group][name]) for group, name in COUNTERS}
