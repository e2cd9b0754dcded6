"""The family of linear mixers in one table: the two switches' vocabulary and the named ops (docs/design.md
§1).

Every op is one recurrence with two switches, the decay's granularity and the delta rule:

| decay \\ delta_rule | False                      | True                             |
|---------------------|----------------------------|----------------------------------|
| "none"              | linear_attn                | delta_rule                       |
| "scalar" (per head) | simple_gla                 | gated_delta_rule                 |
| "channel" (per key) | gla                        | kda (and kda_bounded, its gate)  |

These words are the only spelling of the switches: the ops (kernels.ops), the mixers' `decay` and
`delta_rule`, the launch plan and the Triton kernels' `DECAY` / `DELTA` constexprs, the tests and the
benchmarks take them from here. Adding a named op edits one row of OPS (and the op's functions in
kernels.ops); the kernels, the mixers, the tests and the benchmarks read the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

# the log-decay g: absent, one value per head [..., H], or one per key channel [..., H, K]
Decay = Literal["none", "scalar", "channel"]
DECAYS: tuple[Decay, ...] = ("none", "scalar", "channel")


@dataclass(frozen=True)
class Op:
    """One named op: its switches, its chunked and single-token functions in kernels.ops, and the lower
    bound on g that its gate promises (K3's bounded gate: the kernels' dense diagonal blocks), if any."""

    name: str
    decay: Decay
    delta_rule: bool
    chunk: str  # kernels.<chunk>, e.g. chunk_kda
    step: str  # kernels.<step>, e.g. kda_step
    lower_bound: float | None = None

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
# the six points of the switches' table, each with its plain gate (no lower bound)
PLAIN: tuple[Op, ...] = tuple(o for o in OPS if o.lower_bound is None)


def op(name: str) -> Op:
    """The op of OPS named `name`; a ValueError listing the names otherwise."""
    for candidate in OPS:
        if candidate.name == name:
            return candidate
    raise ValueError(f"unknown op {name!r}; the family's ops are {[o.name for o in OPS]}")


def by_switches(decay: Decay, delta_rule: bool) -> Op:
    """The op with these two switches (its plain gate, no lower bound)."""
    for candidate in PLAIN:
        if candidate.decay == decay and candidate.delta_rule == delta_rule:
            return candidate
    raise ValueError(f"decay={decay!r} is not one of {DECAYS}")


def decay_of(q: torch.Tensor, g: torch.Tensor | None) -> Decay:
    """The decay switch as g's shape gives it beside q ([..., H, K]): no g, g of q's leading dims [..., H]
    (one per head), or q's shape (one per key channel)."""
    if g is None:
        return "none"
    return "scalar" if g.dim() == q.dim() - 1 else "channel"
