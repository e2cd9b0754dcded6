"""Collect runs into one tidy table: one row per run, config keys + summary + status.

    python -m analysis.collect runs/sweeps/kimi_fig4 [more dirs] --out table.csv
    python -m analysis.collect --wandb my-entity/kda-harness --group kimi_fig4 --out table.parquet

Columns: `status` (completed | diverged | failed | incomplete) and `reason` (why a run failed or is
incomplete), every field of `summary.json` (`best_eval_acc`, `steps_to_threshold`, `state_size`,
`device` (from train.log for runs that predate it), ...), the run's flattened config with dotted names
(`task.seq_len`, `optim.lr`, `mixer.gate`, ...), the identifying keys `task`, `mixer` (a hybrid's pattern
name, e.g. `kda:attention 3:1`), `seq_len`, `lr`,
`seed` (filled from the config when a run died before writing its summary), `variant` (the overrides
beyond task/mixer/length/lr/seed, e.g. KDA ablation switches; empty for plain runs), `sweep` and
`run_dir`.

A run directory is any folder holding `.hydra/config.yaml` (what Hydra writes before the run starts),
so runs that crashed early or were killed by SLURM still get a row. A run whose files cannot be read (a
corrupt summary.json or config) gets a `failed` row naming the file and the reason (column `unreadable`:
the file), and the others are collected as usual; `main` lists them as runs left out.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness import rundir
from harness.rundir import STATUSES
from mixers.pattern import pattern_name

# Overrides that place a run in the grid or only say where it executes; any other override makes it a
# variant (an ablation).
GRID_KEYS = frozenset(
    {"experiment", "task", "mixer", "task.seq_len", "optim.lr", "seed", "trainer.device", "trainer.max_steps",
     "trainer.cpu_threads",
     # a hybrid's layers are its `mixer` name already (kda:attention 3:1), not a variant of it
     "model.pattern", "experiment/hybrid"}
)
_IGNORED_PREFIXES = ("logger.", "hydra.", "hydra/")

# Summary fields every row has, so a table of only-failed runs still has the columns plots need.
SUMMARY_FIELDS = (
    "status",
    "best_eval_acc",
    "final_eval_acc",
    "steps",
    "steps_to_threshold",
    "wall_time_s",
    "tokens_per_s",
    "device",
    "state_size",
    "n_params",
    "task",
    "mixer",
    "seq_len",
    "lr",
    "seed",
    "error",
)

# Errors that mean the run was stopped, not that it broke.
_INTERRUPTS = ("SystemExit", "KeyboardInterrupt")

# SLURM writes one of these into the job's stderr when it kills the job.
_SLURM_KILL = re.compile(
    r"\*\*\* (?:JOB|STEP) [\d_.]+ ON \S+ (CANCELLED|DUE TO TIME LIMIT|DUE TO PREEMPTION)"
)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """rundir.flatten, with lists as JSON text (so that parquet can hold them)."""
    return {key: json.dumps(list(value)) if isinstance(value, (list, tuple)) else value
            for key, value in rundir.flatten(dict(tree), prefix).items()}


def pattern_mixer(config: Mapping[str, Any]) -> str | None:
    """A hybrid run's `mixer`: the name of its `model.pattern` (a list, or the JSON text `flatten` makes of
    one); None for a single-mixer run."""
    pattern = config.get("model.pattern")
    if isinstance(pattern, str):
        try:
            pattern = json.loads(pattern)
        except json.JSONDecodeError:
            return None
    if not isinstance(pattern, (list, tuple)) or not pattern:
        return None
    try:
        return pattern_name([str(entry) for entry in pattern])
    except ValueError:  # a malformed pattern: the run failed on it, under the name it was given
        return None


def find_run_dirs(root: Path) -> list[Path]:
    """Every run directory under `root` (or `root` itself), sorted; submitit's own folders are skipped."""
    root = Path(root)
    if not root.exists():
        raise ValueError(f"run directory {root} does not exist; pass a sweep dir such as runs/sweeps/smoke")
    found = [p.parent.parent for p in root.rglob(".hydra/config.yaml") if ".submitit" not in p.parts]
    return sorted(set(found))


# The resolvers a run's config may be resolved with here: `${hydra:...}` (read from the run's own
# hydra.yaml) and the harness's arithmetic. A run's files are data, whoever wrote them: any other resolver
# (`${oc.env:...}` would copy an environment variable, a key or a token, into the table) stays text.
_SAFE_RESOLVERS = frozenset({"hydra", "mul"})
_RESOLVER = re.compile(r"\$\{\s*([\w.-]+)\s*:")


def _resolve(node: Any, skip: tuple[str, ...] = ()) -> Any:
    """A plain container of `node` without its keys `skip`, each interpolation resolved where it can be
    (and may be: only config references and _SAFE_RESOLVERS), else kept as text."""
    from omegaconf import DictConfig, ListConfig

    if isinstance(node, DictConfig):
        keys: list[Any] = [key for key in node.keys() if key not in skip]
    elif isinstance(node, ListConfig):
        keys = list(range(len(node)))
    else:
        return node
    out = []
    for key in keys:
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)):
            out.append(_resolve(child))
            continue
        raw = child._value()
        if isinstance(raw, str) and any(name not in _SAFE_RESOLVERS for name in _RESOLVER.findall(raw)):
            out.append(raw)
            continue
        try:
            out.append(node[key])
        except Exception:  # noqa: BLE001 - an interpolation that needs what the run had
            out.append(raw)
    return dict(zip(keys, out, strict=True)) if isinstance(node, DictConfig) else out


def _load_config(run_dir: Path) -> dict[str, Any]:
    """The run's config, flattened to dotted keys.

    `${hydra:...}` (W&B names and tags in the experiment yamls) is resolved against the run's own
    .hydra/hydra.yaml, which holds what Hydra knew in the run (choices, override dirname).
    """
    from omegaconf import OmegaConf

    text = (run_dir / ".hydra" / "config.yaml").read_text()
    hydra_yaml = run_dir / ".hydra" / "hydra.yaml"
    if "${hydra:" in text and hydra_yaml.exists():
        hydra = (_read_yaml(hydra_yaml) or {}).get("hydra", {})
        cfg = OmegaConf.create({**(_load_yaml(text.replace("${hydra:", "${hydra.")) or {}),
                                "hydra": _referenced(hydra, text)})
        return flatten(_resolve(cfg, skip=("hydra",)))
    return flatten(_resolve(OmegaConf.create(_load_yaml(text) or {})))


_HYDRA_KEY = re.compile(r"\$\{\s*hydra[:.]\s*([\w-]+)")


def _referenced(hydra: dict[str, Any], text: str) -> dict[str, Any]:
    """The parts of Hydra's own config (hydra.yaml) that `text` references, and those they reference in
    turn: the rest of it (launcher, sweeper, logging) is most of the file and no run's config needs it."""
    names, todo = set(), set(_HYDRA_KEY.findall(text))
    while todo:
        name = todo.pop()
        if name in hydra and name not in names:
            names.add(name)
            todo |= set(_HYDRA_KEY.findall(json.dumps(hydra[name], default=str)))
    return {name: hydra[name] for name in hydra if name in names}


# libyaml's parser where PyYAML was built with it: the same documents, read several times faster, which
# is most of the time a report or plot of a large sweep takes
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 - a safe loader, C or Python


def _read_yaml(path: Path) -> Any:
    if not path.exists():
        return None
    return _load_yaml(path.read_text())


def variant_of(overrides: Iterable[str]) -> str:
    """The overrides beyond the grid keys, e.g. 'gate=bounded' for a KDA ablation ('' for a plain run)."""
    parts = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key in GRID_KEYS or key.startswith(_IGNORED_PREFIXES):
            continue
        if "/" in key:
            # A config-group choice such as experiment/ablation=gate_bounded: the option name says it all.
            parts.append(value)
        else:
            parts.append(f"{key.removeprefix('mixer.')}={value}")
    return ",".join(sorted(parts))


def _failure_from_logs(run_dir: Path, sweep_root: Path, job_id: str | None) -> str | None:
    """Why a run without summary.json died, if its logs say: a Python error, or SLURM killing it."""
    log = run_dir / "train.log"
    if log.exists():
        lines = log.read_text(errors="replace").splitlines()
        for index, line in enumerate(lines):
            if line.startswith("Traceback"):
                errors = [entry for entry in lines[index:] if entry and not entry.startswith(" ")]
                return errors[-1] if errors else line
    if job_id:
        for err in sweep_root.glob(f".submitit/{job_id}/*_log.err"):
            match = _SLURM_KILL.search(err.read_text(errors="replace"))
            if match:
                return f"SLURM job {job_id} {match.group(1).lower()}"
    return None


# train.log's first line names the device the run resolved (`run dir ... | device cuda:0 | bf16 autocast`)
_LOG_DEVICE = re.compile(r"\| device (\S+) \|")


def _device_from_log(run_dir: Path) -> str | None:
    """The device a run that predates summary.json's `device` trained on, from its train.log."""
    log = run_dir / "train.log"
    if not log.exists():
        return None
    with log.open(errors="replace") as handle:
        for _, line in zip(range(50), handle, strict=False):
            match = _LOG_DEVICE.search(line)
            if match:
                return match.group(1)
    return None


def _sweep_root(run_dir: Path, roots: list[Path]) -> Path:
    for root in roots:
        if run_dir == root or root in run_dir.parents:
            return root if run_dir != root else run_dir.parent
    return run_dir.parent


class UnreadableFile(ValueError):
    """A run-directory file that exists but cannot be parsed."""

    def __init__(self, path: Path, error: BaseException) -> None:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        super().__init__(f"{path.name} cannot be read ({type(error).__name__}: {first})")
        self.path = path


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UnreadableFile(path, error) from None
    if not isinstance(summary, dict):
        raise UnreadableFile(path, TypeError(f"a {type(summary).__name__}, not a JSON object"))
    return summary


def _unreadable_row(run_dir: Path, sweep_root: Path, error: BaseException) -> dict[str, Any]:
    """The row of a run whose config cannot be read: where it is, and why it is left out."""
    row: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS)
    path = getattr(error, "path", None)
    row.update(status="failed", reason=str(error) if path else f"{type(error).__name__}: {error}",
               unreadable=str(path or run_dir), run_dir=str(run_dir), sweep=sweep_root.name,
               run=str(run_dir.relative_to(sweep_root)) if sweep_root in run_dir.parents else run_dir.name)
    return row


def load_run(run_dir: Path, sweep_root: Path | None = None) -> dict[str, Any]:
    """One row of the table for one run directory; `UnreadableFile` if its config cannot be read (an
    unreadable summary.json gives a `failed` row instead)."""
    run_dir = Path(run_dir)
    sweep_root = sweep_root or run_dir.parent
    row: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS)
    try:
        config = _load_config(run_dir)
    except Exception as error:  # noqa: BLE001 - yaml and omegaconf raise many types
        raise UnreadableFile(run_dir / ".hydra" / "config.yaml", error) from None
    row.update(config)

    hydra = (_read_yaml(run_dir / ".hydra" / "hydra.yaml") or {}).get("hydra", {})
    choices = (hydra.get("runtime") or {}).get("choices") or {}
    overrides = _read_yaml(run_dir / ".hydra" / "overrides.yaml") or []
    job = hydra.get("job") or {}
    job_id = str(job.get("id")) if job.get("id") is not None else None

    # Identity from the config, for runs that died before writing their summary.
    row["task"] = config.get("task.name", choices.get("task"))
    row["mixer"] = pattern_mixer(config) or choices.get("mixer") or config.get("mixer.name")
    row["seq_len"] = config.get("task.seq_len")
    row["lr"] = config.get("optim.lr")
    row["seed"] = config.get("seed")

    summary_path = run_dir / "summary.json"
    reason: str | None = None
    try:
        summary = _read_summary(summary_path) if summary_path.exists() else None
    except UnreadableFile as error:
        summary, status = None, "failed"
        reason = f"{error}; re-launch the run (train.py rebuilds it from checkpoint.pt)"
        row["unreadable"] = str(summary_path)
    if summary is not None:
        # The config the run used, as train.py recorded it: .hydra/config.yaml is rewritten by every
        # launch into the directory, also by one that was refused or found the run already finished.
        used = summary.pop("config", None)
        if isinstance(used, dict):
            row.update({k: json.dumps(list(v)) if isinstance(v, (list, tuple)) else v
                        for k, v in used.items()})
        summary.pop("run_dir", None)
        for key, value in flatten(summary).items():
            if value is not None or row.get(key) is None:
                row[key] = value
        status = summary.get("status")
        if status not in STATUSES:
            status, reason = "failed", f"summary.json has unknown status {status!r}"
        elif status != "completed":
            reason = summary.get("error") or status
        if status == "failed" and str(reason).startswith(_INTERRUPTS):
            # Stopped from outside (Ctrl-C, SLURM preemption through submitit's requeue), not broken:
            # re-launching resumes it from its checkpoint.
            status, reason = "incomplete", f"interrupted ({reason}); re-launch resumes it"
    elif reason is None:
        reason = _failure_from_logs(run_dir, sweep_root, job_id)
        if reason is not None:
            status = "failed"
        elif (run_dir / "checkpoint.pt").exists():
            status, reason = (
                "incomplete",
                "interrupted: checkpoint but no summary.json (re-launch resumes it)",
            )
        else:
            status, reason = "incomplete", "no summary.json (never finished or still running)"
    row["status"] = status
    row["reason"] = reason
    if row.get("device") is None:
        row["device"] = _device_from_log(run_dir)
    row["variant"] = variant_of(overrides)
    row["override_dirname"] = job.get("override_dirname")
    row["job_id"] = job_id
    row["sweep"] = config.get("logger.wandb.group") or sweep_root.name
    row["run_dir"] = str(run_dir)
    # The run's name within its sweep: the override path Hydra made (mixer=kda/optim.lr=0.001/...).
    row["run"] = str(run_dir.relative_to(sweep_root)) if sweep_root in run_dir.parents else run_dir.name
    return row


def collect_dirs(paths: Iterable[Path | str]) -> pd.DataFrame:
    """The tidy table of every run under `paths` (sweep dirs or single run dirs)."""
    roots = [Path(p).resolve() for p in paths]
    rows = []
    for root in roots:
        for run_dir in find_run_dirs(root):
            sweep_root = _sweep_root(run_dir, roots)
            try:
                rows.append(load_run(run_dir, sweep_root))
            except Exception as error:  # noqa: BLE001 - one bad run must not stop the table
                rows.append(_unreadable_row(run_dir, sweep_root, error))
    return _tidy(pd.DataFrame(rows, columns=None if rows else list(SUMMARY_FIELDS) + ["reason", "run_dir"]))


def collect_wandb(path: str, *, group: str | None = None, api: Any | None = None) -> pd.DataFrame:
    """The same table from a W&B project `entity/project` (optionally one sweep's group).

    `api` is a `wandb.Api()` (made here when None; tests pass a stand-in). A run's summary carries
    the fields of summary.json (the harness logs them there); runs that crashed or are still running
    without a `status` in their summary get failed / incomplete from W&B's own run state.
    """
    if "/" not in path:
        raise ValueError(f"--wandb wants entity/project, got {path!r}; e.g. --wandb my-team/kda-harness")
    if api is None:
        import wandb

        api = wandb.Api()
    filters = {"group": group} if group else None
    rows = []
    for run in api.runs(path, filters=filters):
        config = {key: value for key, value in dict(run.config).items() if not key.startswith("_")}
        summary = getattr(run.summary, "_json_dict", None)
        summary = dict(summary if summary is not None else run.summary)
        row: dict[str, Any] = dict.fromkeys(SUMMARY_FIELDS)
        row.update(flatten(config))
        row["task"] = row.get("task.name")
        # W&B's config has the mixer's class, not its name; the tag mixer:<name> (experiment yamls) has it,
        # and the summary's `mixer` (below) too once the run finished.
        tagged = [t.split(":", 1)[1] for t in run.tags if t.startswith("mixer:")]
        target = str(row.get("mixer._target_") or "")
        row["mixer"] = pattern_mixer(row) or (tagged[0] if tagged else (target.rsplit(".", 1)[-1].lower()
                                                                         or None))
        row["seq_len"] = row.get("task.seq_len")
        row["lr"] = row.get("optim.lr")
        row["seed"] = row.get("seed")
        for key, value in flatten({k: v for k, v in summary.items() if not k.startswith("_")}).items():
            if value is not None:
                row[key.removeprefix("summary/")] = value
        status = row.get("status")
        state = getattr(run, "state", None)
        if status not in STATUSES:
            status = {"finished": "completed", "crashed": "failed", "failed": "failed"}.get(
                state, "incomplete"
            )
        row["status"] = status
        row["reason"] = None if status == "completed" else (row.get("error") or f"W&B run state {state}")
        row["variant"] = ",".join(sorted(t for t in run.tags if t.startswith("variant:"))).replace(
            "variant:", ""
        )
        row["sweep"] = run.group
        row["run_dir"] = None
        row["wandb_id"] = run.id
        row["wandb_name"] = run.name
        row["run"] = run.name
        rows.append(row)
    return _tidy(pd.DataFrame(rows))


def _tidy(table: pd.DataFrame) -> pd.DataFrame:
    """Fixed column order (identity, status, metrics, then config) and numeric dtypes."""
    for column in ("seq_len", "seed", "steps", "steps_to_threshold", "state_size", "n_params"):
        if column in table:
            table[column] = pd.to_numeric(table[column], errors="coerce").astype("Int64")
    for column in ("lr", "best_eval_acc", "final_eval_acc", "wall_time_s", "tokens_per_s"):
        if column in table:
            table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    if "variant" in table:
        table["variant"] = table["variant"].fillna("")
    first = ["sweep", "run", "task", "mixer", "variant", "seq_len", "lr", "seed", "status", "reason"]
    metrics = [c for c in SUMMARY_FIELDS if c not in first]
    ordered = [c for c in first + metrics if c in table] + sorted(
        c for c in table if c not in first + metrics
    )
    table = table[ordered]
    sort_keys = [c for c in ("sweep", "task", "mixer", "variant", "seq_len", "lr", "seed") if c in table]
    return table.sort_values(sort_keys, kind="stable", na_position="last").reset_index(drop=True)


def write_table(table: pd.DataFrame, out: Path) -> None:
    """Write CSV or parquet, chosen by the suffix."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        table.to_csv(out, index=False)
    elif out.suffix == ".parquet":
        # Mixed-type object columns (a config key that is a number in one run, text in another) -> text.
        fixed = table.copy()
        for column in fixed.columns[[dtype == "object" for dtype in fixed.dtypes]]:
            values = fixed[column].dropna()
            if len({type(v) for v in values}) > 1:
                fixed[column] = fixed[column].map(lambda v: v if v is None or _isnan(v) else str(v))
        fixed.to_parquet(out, index=False)
    else:
        raise ValueError(f"--out {out}: use a .csv or .parquet file name")


def read_table(path: Path) -> pd.DataFrame:
    """Read a table written by `write_table`."""
    path = Path(path)
    if path.suffix == ".parquet":
        table = pd.read_parquet(path)
    elif path.suffix == ".csv":
        table = pd.read_csv(path)
    else:
        raise ValueError(f"table {path}: expected a .csv or .parquet file")
    if "variant" in table:
        # An all-empty variant column reads back as float NaN.
        table["variant"] = ["" if pd.isna(v) else str(v) for v in table["variant"]]
    return table


def _isnan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.collect", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="sweep or run directories")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also collect runs from this W&B project")
    parser.add_argument("--group", help="with --wandb: only this group (the sweep name)")
    parser.add_argument("--out", type=Path, required=True, help="table.csv or table.parquet")
    args = parser.parse_args(argv)
    if not args.dirs and not args.wandb:
        parser.error("give at least one sweep directory or --wandb entity/project")
    if args.out.suffix not in (".csv", ".parquet"):
        parser.error(f"--out {args.out}: use a .csv or .parquet file name")
    tables = []
    if args.dirs:
        tables.append(collect_dirs(args.dirs))
    if args.wandb:
        tables.append(collect_wandb(args.wandb, group=args.group))
    table = _tidy(pd.concat(tables, ignore_index=True)) if len(tables) > 1 else tables[0]
    write_table(table, args.out)
    counts = table["status"].value_counts().to_dict() if len(table) else {}
    print(f"{len(table)} runs -> {args.out} ({', '.join(f'{k}: {v}' for k, v in sorted(counts.items()))})")
    left_out = table[table["unreadable"].notna()] if "unreadable" in table else table.iloc[:0]
    if len(left_out):
        print(f"runs left out ({len(left_out)}: a file cannot be read)")
        print("| run | file | reason |\n|---|---|---|")
        for _, run in left_out.iterrows():
            print(f"| {run['run']} | {run['unreadable']} | {run['reason']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
