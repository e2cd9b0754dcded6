"""One fixed colour per mixer and per hybrid pattern, shared by every figure (STYLE.md rule 10).

A mixer keeps its colour whatever subset of mixers a figure shows, so a reader who learnt
"KDA is red" in one plot can trust it in the next. Mixers not listed here (a user's new mixer)
get a colour derived from a hash of their name: stable across figures and runs; where two of one
figure's names hash to the same colour, figure_colours moves the later one (in sorted order) on.
"""

from __future__ import annotations

import zlib

# Colour-blind-friendly (Okabe-Ito + two Tol colours); KDA gets the most salient one.
MIXER_COLOURS: dict[str, str] = {
    "kda": "#D55E00",  # vermilion
    "gdn": "#0072B2",  # blue
    "mamba2": "#009E73",  # bluish green
    "gla": "#CC79A7",  # reddish purple
    "deltanet": "#56B4E9",  # sky blue
    "linear_attn": "#E69F00",  # orange
    "attention": "#000000",  # black: the baseline
    "longhorn": "#882255",  # wine (Tol)
}

# Kimi Linear's hybrids (KDA with one attention layer in every n + 1; mixers/pattern.py names them), from
# the least attention to the most: Tol colours that no mixer above uses.
PATTERN_COLOURS: dict[str, str] = {
    "kda:attention 15:1": "#AA4499",  # purple
    "kda:attention 7:1": "#44AA99",  # teal
    "kda:attention 3:1": "#332288",  # indigo
    "kda:attention 1:1": "#999933",  # olive
}

# Fallback palette for mixers and patterns without an entry above; none of these repeat a listed colour.
_FALLBACK = ["#117733", "#88CCEE", "#DDCC77", "#661100", "#AA3377", "#BBBBBB", "#FFAABB", "#6699CC"]

# Legend order: KDA, its hybrids by growing attention share, then the other mixers (attention among them).
_ORDER = ["kda", *PATTERN_COLOURS, *(name for name in MIXER_COLOURS if name != "kda")]

# Line styles and markers tell variants of one mixer apart (KDA ablations share KDA's colour).
VARIANT_STYLES: list[tuple[str, str]] = [
    ("-", "o"),
    ("--", "s"),
    (":", "^"),
    ("-.", "D"),
    ((0, (5, 1)), "v"),  # type: ignore[list-item]
    ((0, (3, 1, 1, 1, 1, 1)), "P"),  # type: ignore[list-item]
    ((0, (1, 3)), "X"),  # type: ignore[list-item]
    ((0, (8, 2, 2, 2)), "*"),  # type: ignore[list-item]
]


def mixer_colour(mixer: str) -> str:
    """The colour of `mixer` in every figure (hex string)."""
    if mixer in MIXER_COLOURS:
        return MIXER_COLOURS[mixer]
    if mixer in PATTERN_COLOURS:
        return PATTERN_COLOURS[mixer]
    return _FALLBACK[zlib.crc32(mixer.encode()) % len(_FALLBACK)]


def figure_colours(names: list[str] | set[str]) -> dict[str, str]:
    """The colour of each of one figure's mixers and patterns: listed names keep theirs; an unlisted one
    takes its hashed colour unless a name before it (sorted) has it, then the next free fallback. Distinct
    while the figure has at most len(_FALLBACK) unlisted names; past that they repeat."""
    colours = {name: mixer_colour(name) for name in names if name in MIXER_COLOURS or name in PATTERN_COLOURS}
    taken: set[str] = set()
    for name in sorted(set(names) - set(colours)):
        start = _FALLBACK.index(mixer_colour(name))
        free = [_FALLBACK[(start + step) % len(_FALLBACK)] for step in range(len(_FALLBACK))]
        colour = next((c for c in free if c not in taken), free[0])
        colours[name] = colour
        taken.add(colour)
    return colours


def mixer_order(mixers: list[str] | set[str]) -> list[str]:
    """Mixers in the fixed legend order (KDA, Kimi's hybrids, the rest of MIXER_COLOURS, then others
    alphabetically)."""
    known = [name for name in _ORDER if name in mixers]
    return known + sorted(set(mixers) - set(_ORDER))
