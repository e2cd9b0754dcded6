"""Ops of the linear-mixer family (DESIGN.md §3). See kernels/README.md for the math."""

from kernels.naive import naive_recurrent, recurrent_step

__all__ = ["naive_recurrent", "recurrent_step"]
