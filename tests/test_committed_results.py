"""The committed REPORT.md and figure numbers of results/kimi_fig4_h200/ are what the committed runs give,
by the commands its README gives under "Reading it": a change to the analysis that is not followed by
regenerating them, or runs committed without them, fails here."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from analysis import plot, report

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "kimi_fig4_h200"

pytestmark = pytest.mark.slow


def _reading_commands() -> list[list[str]]:
    """The `python -m analysis.*` commands of the README's "Reading it" block, one argv each."""
    text = (RESULTS / "README.md").read_text()
    block = re.search(r"## Reading it\s+```bash\n(.*?)```", text, re.S)
    assert block, "results/kimi_fig4_h200/README.md has no bash block under '## Reading it'"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.startswith("python -m analysis.")]


def test_the_committed_report_and_figure_numbers_regenerate_from_the_committed_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    commands = _reading_commands()
    modules = [c[2] for c in commands]
    assert modules[0] == "analysis.report" and len(modules) >= 3 and set(modules[1:]) == {"analysis.plot"}
    figure_dirs = set()
    for argv in commands:
        args = argv[3:]
        out = args.index("--out") + 1
        committed = Path(args[out])
        args[out] = str(tmp_path / committed.relative_to(RESULTS.relative_to(ROOT)))
        module = report if argv[2] == "analysis.report" else plot
        assert module.main(args) == 0
        if module is report:
            assert Path(args[out]).read_text() == (ROOT / committed).read_text(), \
                f"{committed} is stale: regenerate it with `{' '.join(argv)}`"
        else:
            figure_dirs.add(committed)
    for committed in sorted(figure_dirs):
        made = sorted((tmp_path / committed.relative_to(RESULTS.relative_to(ROOT))).glob("*.csv"))
        assert made, f"the figure commands wrote no numbers into {committed}"
        for csv in made:
            assert csv.read_text() == (ROOT / committed / csv.name).read_text(), \
                f"{committed}/{csv.name} is stale: regenerate the figures with the README's commands"
