"""`benchmarks.speed ops --report`: the markdown table rebuilt from a CSV, with FLA's anchor figures."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")

from benchmarks.speed import load_rows, write_markdown

FIELDS = "shape,op,impl,B,T,H,D,ms_fwd,ms_fwdbwd,mb_fwdbwd"
ANCHORS = """# FLA 0.6.0 on some GPU, a comment line
op,B,T,H,D,ms_fwd,ms_fwdbwd,Mtok_per_s_fwd
gdn,32,2048,2,128,ERR,RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results
kda_safe_gate,32,2048,2,128,0.528,2.437
kda_safe_gate,8,8192,16,128,3.063,15.427
"""


def _report(tmp_path: Path, csv_text: str, anchors: Path | None = None) -> str:
    """The markdown that --report writes for a CSV of this text (and an anchor file)."""
    csv_path = tmp_path / "bench.csv"
    csv_path.write_text(csv_text)
    write_markdown(load_rows(csv_path, anchors), tmp_path / "out.md", "# test")
    return (tmp_path / "out.md").read_text()


def _table_line(md: str, shape: str, op: str) -> list[str]:
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {shape} | {op} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_report_uses_anchors_only_where_the_run_has_no_fla(tmp_path: Path) -> None:
    anchors = tmp_path / "anchors.csv"
    anchors.write_text(ANCHORS)
    md = _report(
        tmp_path,
        "\n".join(
            [
                FIELDS,
                "B32T2K,kda_bounded,ours,32,2048,2,128,0.5,2.0,300.0",
                "B32T2K,gated_delta_rule,ours,32,2048,2,128,0.3,1.4,",
                "B32T2K,sdpa,sdpa,32,2048,2,128,0.25,1.0,100.0",
                "B8T8K,kda_bounded,ours,8,8192,16,128,3.0,12.0,4000.0",
                "B8T8K,kda_bounded,fla,8,8192,16,128,2.0,10.0,5000.0",
            ]
        )
        + "\n",
        anchors,
    )
    # columns: shape, op, ours fwd, FLA fwd, torch fwd, SDPA fwd, ours fwd+bwd, FLA fwd+bwd, torch fwd+bwd,
    # SDPA fwd+bwd, ours/FLA fwd, ours/FLA fwd+bwd, ours/SDPA fwd, ours/SDPA fwd+bwd
    small = _table_line(md, "B32T2K", "kda_bounded")
    assert small[3] == "0.528 (a)" and small[7] == "2.437 (a)"
    assert small[10] == f"{0.5 / 0.528:.2f}" and small[11] == f"{2.0 / 2.437:.2f}"
    assert small[12] == "2.00" and small[13] == "2.00"
    # a side-by-side FLA timing wins over the anchor
    big = _table_line(md, "B8T8K", "kda_bounded")
    assert big[3] == "2.0" and big[11] == "1.20"
    # FLA's refusal on Triton 3.6 / Hopper is named, not a number
    gated = _table_line(md, "B32T2K", "gated_delta_rule")
    assert gated[3] == "refused (#640)" and gated[10] == "-"
    assert "(a): FLA 0.6.0 from" in md
    # where the run timed FLA and the anchors have it too, both side by side in their own table
    versus = md.split("## FLA in this run against the anchor file")[1].split("##")[0]
    assert "| B8T8K | kda_bounded | 2.0 | 3.063 | 10.0 | 15.427 |" in versus
    assert "| B32T2K | kda_bounded |" not in versus
    # the memory table: MiB side by side, ratios where both sides have a number
    mem = md.split("## Peak memory")[1]
    assert "| B32T2K | kda_bounded | 300.0 | - | - | 100.0 | - | 3.00 |" in mem
    assert "| B8T8K | kda_bounded | 4000.0 | 5000.0 | - | - | 0.80 | - |" in mem


def test_report_without_anchors_has_no_fla_column_values(tmp_path: Path) -> None:
    # a CSV of an earlier run, before the memory column existed
    md = _report(
        tmp_path, "shape,op,impl,B,T,H,D,ms_fwd,ms_fwdbwd\nB32T2K,kda_bounded,ours,32,2048,2,128,0.5,2.0\n"
    )
    assert _table_line(md, "B32T2K", "kda_bounded")[3] == "-"
    assert "(a):" not in md
    assert "## Peak memory" not in md
    assert "against the anchor file" not in md


def test_report_names_fla_refusals_timed_in_the_run(tmp_path: Path) -> None:
    err = "ERR RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated"
    md = _report(
        tmp_path,
        FIELDS
        + f"\nB8T8K,simple_gla,ours,8,8192,16,128,0.9,4.3,\nB8T8K,simple_gla,fla,8,8192,16,128,0.8,{err},\n",
    )
    line = _table_line(md, "B8T8K", "simple_gla")
    assert line[3] == "0.8" and line[7] == "refused (#640)" and line[11] == "-"


def test_report_of_a_sweep_alone_pivots_the_implementations(tmp_path: Path) -> None:
    md = _report(
        tmp_path,
        FIELDS
        + "\nsweep,kda_bounded,ours,1,8192,16,128,0.5,1.6,800.0"
        + "\nsweep,sdpa,sdpa,1,8192,16,128,0.4,2.0,190.0"
        + "\nsweep,kda_bounded,fla,1,8192,16,128,1.0,3.2,900.0\n",
    )
    # a sweep-only run has no (empty) fixed-shape or memory tables
    assert "## Fixed shapes" not in md and "## Peak memory" not in md
    assert "| 8192 | kda_bounded | 0.5 | 1.0 | 0.4 | 1.6 | 3.2 | 2.0 | 0.50 | 0.80 |" in md


def test_report_sets_host_time_beside_gpu_time(tmp_path: Path) -> None:
    md = _report(
        tmp_path,
        FIELDS
        + ",host_ms_fwd\nB32T2K,linear_attn,fla,32,2048,2,128,0.4,1.8,384.0,0.38"
        + "\nB32T2K,linear_attn,ours,32,2048,2,128,0.13,0.8,436.0,0.05\n",
    )
    host = md.split("## Host time")[1]
    assert "| B32T2K | linear_attn | fla | 0.38 | 0.4 | 0.95 |" in host
    assert "| B32T2K | linear_attn | ours | 0.05 | 0.13 | 0.38 |" in host
