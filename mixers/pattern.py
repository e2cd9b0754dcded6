"""A hybrid stack: which mixer each layer has (`model.pattern`), the config of each, and the pattern's name.

    model.num_layers=4 'model.pattern=[kda,kda,kda,attention]'     # Kimi Linear's 3:1
    model.num_layers=8 'model.pattern=[kda*7,attention]'           # `name*n`: n layers of it in a row
    mixer.kda.gate=softplus mixer.attention.use_short_conv=true    # switches per mixer kind

Each entry names a `conf/mixer/<name>.yaml`. A layer of kind X is built from that yaml, updated by the
`mixer.X.*` keys; the `mixer` node itself (the `mixer=` choice with its top-level overrides, such as
`mixer.use_short_conv=false`) configures the layers of its own class, so every single-mixer override keeps
its meaning. A section for a kind the pattern lacks is left unused (a sweep over patterns shares its
overrides); so is the `mixer` node when no layer has its class, with a warning if it was changed. Without a
pattern every layer is the `mixer` node, as it always was.

No torch here: the analysis names runs with `pattern_name` without importing the model.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

MIXER_CONF = Path(__file__).resolve().parents[1] / "conf" / "mixer"
# A yaml's `defaults` entry this module composes as Hydra does: a config of conf/ merged into the mixer node.
_HERE = re.compile(r"/(?P<name>[\w/]+)@_here_")

# train.py's logger: a warning here lands in the run's train.log
log = logging.getLogger("train")

_REPEAT = re.compile(r"(?P<name>[^*\s]+)\s*\*\s*(?P<count>\d+)")


def mixer_names(conf_dir: Path = MIXER_CONF) -> list[str]:
    """The mixers a pattern may name: the yamls of conf/mixer."""
    return sorted(p.stem for p in conf_dir.glob("*.yaml"))


def _shown(pattern: Sequence[Any]) -> str:
    return "[" + ",".join(str(entry) for entry in pattern) + "]"


def expand(pattern: Sequence[Any]) -> list[str]:
    """One name per layer: `kda*3` stands for three `kda` entries."""
    layers: list[str] = []
    for entry in pattern:
        match = _REPEAT.fullmatch(str(entry).strip())
        if match is None:
            layers.append(str(entry).strip())
        elif int(match["count"]) < 1:
            raise ValueError(f"model.pattern={_shown(pattern)}: {entry!r} repeats a mixer "
                             f"{match['count']} times; give a count >= 1, as in kda*3")
        else:
            layers += [match["name"]] * int(match["count"])
    return layers


def check_pattern(pattern: Sequence[Any] | None, num_layers: int, conf_dir: Path = MIXER_CONF) -> None:
    """A one-line ValueError naming the value and the fix if `pattern` names an unknown mixer or has not
    one entry per layer; None (no pattern) passes."""
    if pattern is None:
        return
    layers = expand(pattern)
    if not layers:  # the length check's fix would be model.num_layers=0, which no model has
        raise ValueError(f"model.pattern={_shown(pattern)} names no layer: give one mixer per layer "
                         f"({num_layers} for model.num_layers={num_layers}), or model.pattern=null for the "
                         "mixer= choice in every layer")
    names = mixer_names(conf_dir)
    unknown = [name for name in layers if name not in names]
    if unknown:
        raise ValueError(f"model.pattern={_shown(pattern)}: {unknown[0]!r} is not a mixer; choose from "
                         f"{', '.join(names)} (conf/mixer/<name>.yaml)")
    if len(layers) != num_layers:
        raise ValueError(f"model.pattern={_shown(pattern)} has {len(layers)} layers but model.num_layers="
                         f"{num_layers}: give one mixer per layer, or set model.num_layers={len(layers)}")


def mixer_yaml(name: str, conf_dir: Path = MIXER_CONF) -> DictConfig:
    """conf/mixer/<name>.yaml as Hydra composes it into the `mixer` node: the config of a `name` layer."""
    cfg = OmegaConf.load(conf_dir / f"{name}.yaml")
    assert isinstance(cfg, DictConfig)
    return with_defaults(cfg, conf_dir)


def with_defaults(node: DictConfig, conf_dir: Path = MIXER_CONF) -> DictConfig:
    """A mixer node with its yaml's `defaults` list applied as Hydra applies it: each config it names
    (`/<name>@_here_`, conf/<name>.yaml) merged in turn, the node's own keys at `_self_` (last if not
    listed). Hydra consumes the list when it composes; a yaml read from its file (OmegaConf.load) keeps it.
    A node without one is returned as it is."""
    if "defaults" not in node:
        return node
    own = OmegaConf.masked_copy(node, [str(k) for k in node if k != "defaults"])
    entries = [str(entry) for entry in node.defaults]
    parts = []
    for entry in entries if "_self_" in entries else [*entries, "_self_"]:
        match = _HERE.fullmatch(entry)
        if entry == "_self_":
            parts.append(own)
        elif match is None:
            raise ValueError(f"mixer config {node.get('_target_')}: defaults entry {entry!r}; a mixer yaml "
                             "names the configs it starts from as /<config>@_here_ (conf/<config>.yaml)")
        else:
            base = OmegaConf.load(conf_dir.parent / f"{match['name']}.yaml")
            assert isinstance(base, DictConfig)
            parts.append(with_defaults(base, conf_dir))
    merged = OmegaConf.merge(*parts)
    assert isinstance(merged, DictConfig)
    return merged


def split_kinds(mixer: Mapping[str, Any] | DictConfig,
                conf_dir: Path = MIXER_CONF) -> tuple[DictConfig, dict[str, DictConfig]]:
    """(the `mixer` node without its per-kind sections, {kind: its `mixer.<kind>.*` section})."""
    node = with_defaults(mixer if isinstance(mixer, DictConfig) else OmegaConf.create(dict(mixer)), conf_dir)
    names = set(mixer_names(conf_dir))
    kinds = {str(k): node[k] for k in node if k in names and isinstance(node[k], DictConfig)}
    own = OmegaConf.masked_copy(node, [str(k) for k in node if k not in kinds])
    return own, kinds


def _own_kinds(node: DictConfig, candidates: Sequence[str], conf_dir: Path) -> list[str]:
    """The kinds among `candidates` whose yaml builds the node's class (`_target_`)."""
    target = node.get("_target_")
    return [name for name in dict.fromkeys(candidates)
            if mixer_yaml(name, conf_dir).get("_target_") == target]


def mixer_configs(mixer: Mapping[str, Any] | DictConfig, pattern: Sequence[Any] | None,
                  conf_dir: Path = MIXER_CONF) -> DictConfig | dict[str, DictConfig]:
    """What the backbone builds its layers from: without a pattern the `mixer` node (returned as it is when
    it has no `mixer.<kind>` section, so the single-mixer model is unchanged); with one, {kind: config} for
    every kind the pattern names."""
    own, kinds = split_kinds(mixer, conf_dir)
    if pattern is None:
        if not kinds:
            return with_defaults(mixer if isinstance(mixer, DictConfig) else OmegaConf.create(dict(mixer)),
                                 conf_dir)
        mine = _own_kinds(own, mixer_names(conf_dir), conf_dir)
        strays = [kind for kind in kinds if kind not in mine]
        if strays:
            raise ValueError(f"mixer.{strays[0]}.* configures {strays[0]} layers, but this model has none "
                             f"(one mixer, {own.get('_target_')}, no model.pattern): set model.pattern to "
                             f"include {strays[0]}, or drop those overrides")
        return OmegaConf.merge(own, *(kinds[kind] for kind in mine))
    layers = expand(pattern)
    mine = _own_kinds(own, layers, conf_dir)
    if len(mine) > 1:
        raise ValueError(f"model.pattern={_shown(pattern)}: {', '.join(mine)} all build "
                         f"{own.get('_target_')}, the `mixer` node's class, so its settings fit none of them "
                         f"alone; pick mixer= of another class and set theirs as mixer.<name>.*")
    if not mine:
        _warn_unused(own, layers, conf_dir)
    configs: dict[str, DictConfig] = {}
    for kind in dict.fromkeys(layers):
        cfg = own if kind in mine else mixer_yaml(kind, conf_dir)
        configs[kind] = OmegaConf.merge(cfg, kinds[kind]) if kind in kinds else cfg
    return configs


def _warn_unused(own: DictConfig, layers: list[str], conf_dir: Path) -> None:
    """The `mixer` node configures no layer of the pattern: say so when it holds more than its yaml."""
    for name in mixer_names(conf_dir):
        yaml = mixer_yaml(name, conf_dir)
        if yaml.get("_target_") != own.get("_target_"):
            continue
        changed = sorted(str(k) for k in own if k not in yaml or own[k] != yaml[k])
        if changed:
            log.warning("model.pattern=%s has no %s layer, so mixer.%s (the mixer=%s settings) configure "
                        "nothing; set a pattern kind's switches as mixer.<kind>.<key>", _shown(layers), name,
                        ", mixer.".join(changed), name)
        return


def pattern_name(pattern: Sequence[Any] | None) -> str | None:
    """A pattern's name in tables and legends: the mixer for a pattern of one kind (`kda`), the ratio for
    the regular interleaving (`kda:attention 3:1` is [kda,kda,kda,attention] repeated), else the layers in
    short form (`kda*2,attention*2`); None for no pattern."""
    if pattern is None:
        return None
    layers = expand(pattern)
    kinds = list(dict.fromkeys(layers))
    if len(kinds) == 1:
        return kinds[0]
    counts = [layers.count(kind) for kind in kinds]
    repeats = math.gcd(*counts)
    period = [kind for kind, count in zip(kinds, counts, strict=True) for _ in range(count // repeats)]
    if layers == period * repeats:
        return f"{':'.join(kinds)} {ratio(layers)}"
    return short_form(layers)


def ratio(pattern: Sequence[Any]) -> str:
    """Layers of each kind, in order of first appearance, in lowest terms: `3:1` for [kda*3,attention]."""
    layers = expand(pattern)
    counts = [layers.count(kind) for kind in dict.fromkeys(layers)]
    repeats = math.gcd(*counts)
    return ":".join(str(count // repeats) for count in counts)


def short_form(pattern: Sequence[Any]) -> str:
    """The layers with runs written `name*n`: [kda,kda,kda,attention] -> `kda*3,attention` (a valid
    `model.pattern` again)."""
    runs: list[list[Any]] = []
    for name in expand(pattern):
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ",".join(name if count == 1 else f"{name}*{count}" for name, count in runs)


def attention_share(pattern: Sequence[Any]) -> float:
    """The fraction of the layers that are softmax attention (`attention`)."""
    layers = expand(pattern)
    return layers.count("attention") / len(layers)
