"""One on-disk home per machine for what compiling a run produces, so that a sweep compiles once.

A compiled run's first step pays for tracing, compiling the graphs and building their Triton kernels. The
products persist on disk between processes in three caches: inductor's FX graph cache (the compiled
graphs, with their Triton kernels bundled), AOTAutograd's (the forward and backward graphs) and Triton's
own (the kernel binaries, our ops' included). `share_compile_caches` turns them on and points inductor's
and Triton's directories at one directory per machine (under ~/.cache, which outlives /tmp, inductor's
default), so every job of a sweep on the machine, each its own process, finds what the first one built.
A directory or switch the user set in the environment is kept.

Triton's cache of autotuning results (TRITON_CACHE_AUTOTUNING) is not needed: our kernels take their
launch configs from kernels/triton/plan.py, not from `triton.autotune`, and inductor caches its own
autotuning (`autotune_local_cache`, in its directory).
"""

from __future__ import annotations

import importlib
import os
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


def default_root() -> Path:
    """~/.cache/kda_harness/compile ($XDG_CACHE_HOME in place of ~/.cache when set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(base).expanduser() / "kda_harness" / "compile"


def cache_dirs(root: Path | None = None) -> dict[str, Path]:
    """{"inductor": dir, "triton": dir}: the directory the environment names, else root/inductor and
    root/triton (root: default_root()); what share_compile_caches gives a run."""
    root = default_root() if root is None else root
    return {name: Path(os.environ.get(variable) or root / name) for name, variable in DIR_VARIABLES}


def share_compile_caches(root: Path | None = None) -> dict[str, str]:
    """Turn on the compile caches and give inductor and Triton one directory per machine (root/inductor,
    root/triton) where the environment names none; returns {"inductor": dir, "triton": dir} as used.
    Call before the first compile: both read their directory from the environment when they write."""
    own = cache_dirs(root)
    dirs = {}
    for name, variable in DIR_VARIABLES:
        if not os.environ.get(variable):
            os.environ[variable] = str(own[name])
        dirs[name] = os.environ[variable]
    for module_name, switch, variable in SWITCHES:
        module = importlib.import_module(module_name)
        # a torch without the switch has no such cache; one forced by the user's variable is theirs
        if hasattr(module, switch) and not (variable and variable in os.environ):
            setattr(module, switch, True)
    return dirs


def cache_counts() -> dict[str, int]:
    """The compile caches' hits, misses and bypasses so far in this process, as `cache_name: count`."""
    from torch._dynamo.utils import counters

    return {name: int(counters[group][name]) for group, name in COUNTERS}
