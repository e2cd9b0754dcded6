"""Ops of the linear-mixer family (docs/design.md §3). See kernels/README.md for the math."""

from kernels.naive import naive_recurrent, recurrent_step
from kernels.ops import (
    chunk_delta_rule,
    chunk_gated_delta_rule,
    chunk_gla,
    chunk_kda,
    chunk_linear_attn,
    chunk_simple_gla,
    delta_rule_step,
    gated_delta_rule_step,
    gla_step,
    kda_step,
    linear_attn_step,
    simple_gla_step,
    value_checks,
)

__all__ = [
    "chunk_delta_rule",
    "chunk_gated_delta_rule",
    "chunk_gla",
    "chunk_kda",
    "chunk_linear_attn",
    "chunk_simple_gla",
    "delta_rule_step",
    "gated_delta_rule_step",
    "gla_step",
    "kda_step",
    "linear_attn_step",
    "naive_recurrent",
    "recurrent_step",
    "simple_gla_step",
    "value_checks",
]
