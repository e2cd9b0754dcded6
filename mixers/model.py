"""The backbone: a small language model around any mixer (docs/design.md §2, §4).

    tokens [B, T] -> embedding -> N x (x + mixer(norm(x)); x + mlp(norm(x)))
                  -> norm -> LM head -> logits [B, T, V]

Each layer's mixer is built from its config (`conf/mixer/<name>.yaml`: `_target_` + kwargs) by
`build_mixer`, so the model knows no mixer by name: every layer the same mixer, or, with a `pattern`, the
mixer each layer's entry names (a hybrid stack, mixers/pattern.py). `LanguageModel.step` decodes one token
at a time through each mixer's cache and gives the same logits as the full forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import hydra
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.checkpoint import checkpoint

from kernels.swiglu import swiglu, swiglu_reference
from mixers.base import Mixer
from mixers.loss import linear_cross_entropy
from mixers.pattern import check_pattern, expand, mixer_configs

# Keys Hydra's instantiate reads itself; they are not constructor arguments.
_HYDRA_KEYS = {"_target_", "_recursive_", "_convert_", "_partial_", "_args_"}


def build_mixer(mixer_cfg: Mapping[str, Any] | DictConfig, d_model: int, layer_idx: int,
                name: str | None = None) -> Mixer:
    """Instantiate one mixer from its config, turning a misspelt kwarg into an error that names it.

    `name` is the yaml's name (Hydra's choice for `mixer`), used only in error messages.
    """
    cfg = mixer_cfg if isinstance(mixer_cfg, DictConfig) else OmegaConf.create(dict(mixer_cfg))
    target = cfg.get("_target_")
    if not target:
        raise ValueError(f"mixer config {name or ''!r} has no _target_: add "
                         "`_target_: mixers.<module>.<Class>` to its yaml")
    from_yaml = name is not None
    name = name or str(target).rsplit(".", 1)[-1]
    factory = hydra.utils.get_object(str(target))
    accepted, takes_any = _accepted_kwargs(factory)
    unknown = sorted(str(k) for k in cfg if k not in _HYDRA_KEYS and k not in accepted)
    # A constructor with **kwargs may accept more than its signature shows: then instantiate decides.
    if unknown and not takes_any:
        where = f"conf/mixer/{name}.yaml or the override" if from_yaml else "the mixer config"
        raise ValueError(f"mixer {name!r} ({target}) got unknown parameter(s) {unknown}; "
                         f"it accepts {accepted}. Fix the key in {where}.")
    try:
        mixer = hydra.utils.instantiate(cfg, d_model=d_model, layer_idx=layer_idx)
    except Exception as error:  # Hydra wraps the constructor's TypeError/ValueError in InstantiationException
        cause = error.__cause__ or error
        if isinstance(cause, ValueError):
            # the constructor's own check names the value and the fix; the whole config would bury it
            raise ValueError(f"mixer {name!r}: {cause}") from error
        raise ValueError(f"mixer {name!r} ({target}) could not be built with {OmegaConf.to_container(cfg)}: "
                         f"{cause}; it accepts {accepted}") from error
    if not isinstance(mixer, nn.Module):
        raise ValueError(f"mixer {name!r}: _target_ {target} built a {type(mixer).__name__}, "
                         "not an nn.Module")
    return mixer


def _accepted_kwargs(factory: Any) -> tuple[list[str], bool]:
    """Keyword arguments a mixer's constructor accepts, following **kwargs up the class hierarchy
    (a mixer that forwards **kwargs to its base class accepts the base's parameters too).
    Returns (names, whether some constructor on the way takes arbitrary **kwargs)."""
    skip = {"self", "d_model", "layer_idx"}
    names: list[str] = []
    if isinstance(factory, type):
        functions = [c.__dict__["__init__"] for c in factory.__mro__
                     if "__init__" in c.__dict__ and c is not object]
    else:
        functions = [factory]
    for function in functions:
        params = inspect.signature(function).parameters.values()
        names += [p.name for p in params if p.name not in skip and p.name not in names
                  and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return names, False
    return names, True


# What the compiled body may recompute in its backward instead of keeping (`model.recompute`), each part a
# checkpointed region under torch.compile (eager keeps what it keeps; the lean layers keep less their own
# way): the linear layers' fp32 unit q, k from the short convs' outputs (qk_norm); q's and k's projections,
# convs and unit rows from the block's normed input (qk); the SwiGLU's product from the up projection's
# output (swiglu); the whole MLP from its input (mlp). What each saves, traced at MQAR B256 T1K:
# benchmarks/results/cpu_compiled_saved.md; what each costs in time: `gpu.sh recompute_step`.
RECOMPUTABLE = ("qk_norm", "qk", "swiglu", "mlp")


def check_recompute(parts: Sequence[str]) -> None:
    """One line naming model.recompute's value and the choices where a part is none of RECOMPUTABLE."""
    unknown = [part for part in parts if part not in RECOMPUTABLE]
    if unknown:
        raise ValueError(f"model.recompute={list(parts)}: {unknown[0]!r} is not a part it can recompute; "
                         f"choose from {', '.join(RECOMPUTABLE)} (e.g. model.recompute=[qk,mlp])")


class MLP(nn.Module):
    """The channel mixer of a block: SwiGLU (gated, the default) or a plain GELU MLP."""

    def __init__(self, d_model: int, hidden: int, kind: str = "swiglu", fused: bool = False) -> None:
        super().__init__()
        if kind not in ("swiglu", "gelu"):
            raise ValueError(f"model.mlp={kind!r}: choose 'swiglu' or 'gelu'")
        self.kind = kind
        self.fused = fused
        self.up = nn.Linear(d_model, 2 * hidden if kind == "swiglu" else hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)
        self.recompute: frozenset[str] = frozenset()  # RECOMPUTABLE's parts; LanguageModel sets it

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., D] -> [..., D]
        if "mlp" in self.recompute and torch.compiler.is_compiling():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.kind == "swiglu":
            # fused: the Triton kernels on CUDA, which keep only h for the backward
            if not self.fused and "swiglu" in self.recompute and torch.compiler.is_compiling():
                h = checkpoint(swiglu_reference, h, use_reentrant=False)
            else:
                h = swiglu(h, impl="auto" if self.fused else "torch")
        else:
            h = F.gelu(h)
        return self.down(h)


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, d_model: int, mixer: Mixer, mlp: MLP, norm_eps: float) -> None:
        super().__init__()
        self.mixer_norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.mixer = mixer
        self.mlp_norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        x = x + self.mixer(self.mixer_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def step(self, x: torch.Tensor, cache: dict[str, Any]) -> torch.Tensor:  # [B, D]
        x = x + self.mixer.step(self.mixer_norm(x), cache)
        return x + self.mlp(self.mlp_norm(x))


class LanguageModel(nn.Module):
    """Token embedding -> `num_layers` blocks (mixer + MLP) -> final RMSNorm -> LM head.

    Args:
        vocab_size: number of token ids (the task's `num_tokens`).
        mixer: the mixer config (`_target_` + kwargs); each layer gets its own instance. With a pattern it
            configures the layers of its own class, and its `<kind>` sections the others (mixers/pattern.py).
        d_model: width D.
        num_layers: number of blocks.
        mlp: "swiglu" or "gelu".
        mlp_ratio: hidden width of the MLP over D; SwiGLU uses 2/3 of it (rounded up to a multiple of
            32) so both kinds have about the same parameter count.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: share the embedding matrix with the LM head.
        lean_backward: keep less for the backward (mixers/README.md): the mixers' recomputing Functions
            (`LinearMixer.lean_backward`) and the fused SwiGLU kernels on CUDA. Off: the plain torch
            expressions, the reference.
        mixer_name: the mixer's yaml name, for error messages.
        pattern: one mixer name (a conf/mixer yaml) per layer, `name*n` for n in a row; None: `mixer` in
            every layer.
        recompute: RECOMPUTABLE's parts the compiled body recomputes in its backward instead of keeping.
    """

    def __init__(
        self,
        vocab_size: int,
        mixer: Mapping[str, Any] | DictConfig,
        *,
        d_model: int = 256,
        num_layers: int = 2,
        mlp: str = "swiglu",
        mlp_ratio: float = 4.0,
        norm_eps: float = 1e-5,
        tie_embeddings: bool = False,
        lean_backward: bool = False,
        mixer_name: str | None = None,
        pattern: Sequence[str] | None = None,
        recompute: Sequence[str] = (),
    ) -> None:
        super().__init__()
        if vocab_size < 1 or d_model < 1 or num_layers < 1:
            raise ValueError(f"vocab_size={vocab_size}, d_model={d_model}, num_layers={num_layers}: "
                             "all must be >= 1")
        check_pattern(pattern, num_layers)
        configs = mixer_configs(mixer, pattern)
        # (config, name) per layer; the same config object for every layer of one kind
        layers = ([(configs, mixer_name)] * num_layers if pattern is None
                  else [(configs[name], name) for name in expand(pattern)])
        self.pattern = None if pattern is None else expand(pattern)
        hidden = int(mlp_ratio * d_model)
        if mlp == "swiglu":
            hidden = 32 * -(-int(2 * hidden / 3) // 32)
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(
            Block(d_model, build_mixer(layer_mixer, d_model, i, name),
                  MLP(d_model, hidden, mlp, fused=lean_backward), norm_eps)
            for i, (layer_mixer, name) in enumerate(layers)
        )
        for block in self.blocks:
            if hasattr(block.mixer, "lean_backward"):
                block.mixer.lean_backward = lean_backward
        self.set_recompute(recompute)
        self.norm = nn.RMSNorm(d_model, eps=norm_eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        # The mixers initialise themselves (their gates need specific ranges); the backbone's own
        # matrices get GPT-2's small normal init, which trains these small models reliably.
        for module in [self.embedding, self.lm_head, *(block.mlp for block in self.blocks)]:
            for parameter in module.parameters():
                nn.init.normal_(parameter, std=0.02)
        if tie_embeddings:
            self.lm_head.weight = self.embedding.weight

    @property
    def mixers(self) -> list[Mixer]:
        return [block.mixer for block in self.blocks]

    def set_recompute(self, parts: Sequence[str]) -> None:
        """What the compiled body recomputes in its backward instead of keeping: RECOMPUTABLE's `parts`, in
        every layer that has them (a mixer without q, k projections ignores qk_norm and qk)."""
        check_recompute(parts)
        chosen = frozenset(parts)
        for block in self.blocks:
            block.mlp.recompute = chosen
            if hasattr(block.mixer, "recompute"):
                block.mixer.recompute = chosen

    def features(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, D]
        """The final normalised hidden states, the LM head's input (training scores only labelled positions:
        `scored_loss`)."""
        x = self.embedding(tokens)  # [B, T, D]
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, vocab]
        return self.lm_head(self.features(tokens))

    def scored_loss(self, features: torch.Tensor, positions: torch.Tensor,
                    targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed cross-entropy, hits [N] bool) of the head at `positions` (flat indices into [B * T])
        against `targets` [N], without forming the logits of any other position (mixers/loss.py)."""
        hidden = features.flatten(0, 1).index_select(0, positions)  # [N, D]
        return linear_cross_entropy(hidden, self.lm_head.weight, targets)

    def init_cache(self, batch_size: int, device: torch.device | str,
                   dtype: torch.dtype = torch.float32) -> list[dict[str, Any]]:
        """One decoding cache per layer, created by its mixer."""
        return [block.mixer.init_cache(batch_size, device=device, dtype=dtype) for block in self.blocks]

    def step(self, tokens: torch.Tensor, caches: list[dict[str, Any]]) -> torch.Tensor:  # [B] -> [B, vocab]
        """Decode one token per sequence, updating `caches` in place."""
        x = self.embedding(tokens)  # [B, D]
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.step(x, cache)
        return self.lm_head(self.norm(x))

    def state_size(self, seq_len: int) -> int:
        """Numbers held per sequence at decode time after `seq_len` tokens, summed over layers."""
        return sum(mixer.state_size(seq_len) for mixer in self.mixers)
