"""The family of linear mixers in one table: the decay vocabulary and the named ops (docs/design.md §1).

Every op is one recurrence with two switches, the decay's granularity and the delta rule:

| decay \\ delta rule | off                        | on                               |
|---------------------|----------------------------|----------------------------------|
| none                | linear_attn                | delta_rule                       |
| scalar (per head)   | simple_gla                 | gated_delta_rule                 |
| channel (per key)   | gla                        | kda (and kda_bounded, its gate)  |

Adding a named op edits one row of OPS (and the op's functions in kernels.ops); the kernels, the mixers,
the tests and the benchmarks read the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# the log-decay g: absent, one value per head [B, T, H], or one per key channel [B, T, H, K]
Decay = Literal["none", "scalar", "channel"]
DECAYS: tuple[Decay, ...] = ("none", "scalar", "channel")
# the Triton kernels' DECAY constexpr
DECAY_CODE: dict[Decay, int] = {"none": 0, "scalar": 1, "channel": 2}
# the mixers' configuration word for each decay (`decay: head` in conf/mixer/*.yaml is the scalar decay)
MIXER_DECAY: dict[str, Decay] = {"none": "none", "head": "scalar", "channel": "channel"}


@dataclass(frozen=True)
class Op:
    """One named op: its switches, its chunked and single-token functions in kernels.ops, and the lower
    bound on g that its gate promises (K3's bounded gate: the kernels' dense diagonal blocks), if any."""

    name: str
    decay: Decay
    delta: bool
    chunk: str  # kernels.<chunk>, e.g. chunk_kda
    step: str  # kernels.<step>, e.g. kda_step
    lower_bound: float | None = None

    @property
    def decay_code(self) -> int:
        return DECAY_CODE[self.decay]

    @property
    def takes_lower_bound(self) -> bool:
        # the per-channel decay alone has position-pair diagonal blocks for the bound to replace
        return self.decay == "channel"


OPS: tuple[Op, ...] = (
    Op("linear_attn", "none", False, "chunk_linear_attn", "linear_attn_step"),
    Op("simple_gla", "scalar", False, "chunk_simple_gla", "simple_gla_step"),
    Op("gla", "channel", False, "chunk_gla", "gla_step"),
    Op("delta_rule", "none", True, "chunk_delta_rule", "delta_rule_step"),
    Op("gated_delta_rule", "scalar", True, "chunk_gated_delta_rule", "gated_delta_rule_step"),
    Op("kda", "channel", True, "chunk_kda", "kda_step"),
    Op("kda_bounded", "channel", True, "chunk_kda", "kda_step", lower_bound=-5.0),
)


def op(name: str) -> Op:
    """The op of OPS named `name`; a ValueError listing the names otherwise."""
    for candidate in OPS:
        if candidate.name == name:
            return candidate
    raise ValueError(f"unknown op {name!r}; the family's ops are {[o.name for o in OPS]}")


def by_switches(decay: Decay, delta: bool) -> Op:
    """The op with these two switches (its plain gate, no lower bound)."""
    for candidate in OPS:
        if candidate.decay == decay and candidate.delta == delta and candidate.lower_bound is None:
            return candidate
    raise ValueError(f"decay={decay!r} is not one of {DECAYS}")
