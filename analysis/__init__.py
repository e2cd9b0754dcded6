"""Turn sweeps into tables and paper-style figures: `python -m analysis.collect`, `python -m analysis.plot`.

See docs/sweeps.md. Colours per mixer live in `analysis.colours` (one place for every figure).
"""
