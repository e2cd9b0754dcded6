"""Fill a long sweep over short stretches of machine time: start it detached, poll, bring back what finished.

A lent GPU machine runs one command at most ten minutes, keeps a detached process alive between commands
while it is held, and starts bare the next time. So a grid that needs hours fills a stretch at a time:

    python tools/campaign.py start PLAN... --hold-minutes 20 --minutes 8 --out $OUT  # first command
    python tools/campaign.py wait --minutes 9 --out $OUT              # each following one (with
                                                                      # --hold-minutes M: a new hold)
    python tools/campaign.py stop --out $OUT                          # the last one of the stretch
    python tools/campaign.py unpack /path/to/campaign-*.tar.gz        # here; commit the run directories
    python tools/campaign.py left PLAN...                             # what is left, in device minutes
    python tools/campaign.py extend RESULTS... --max-steps 20000      # a plan: unsolved cells, longer
    python tools/campaign.py seeds RESULTS... --seeds 1,2            # a plan: every cell, more seeds

`start` copies this checkout (its committed runs included) to `--work`, then runs the plan's stages there,
one `python train.py -m <overrides>` after another, in a new process session that outlives the command.
Every run the checkout already holds finished is skipped by train.py itself, so a fresh machine goes on
where the committed results end. A `start` in another `--work` on the same machine also takes the runs
that the machine's earlier campaigns finished and the checkout does not hold yet (their work directories
are recorded in ~/.cache/kda_harness/campaigns.json), so none trains twice before its archive is unpacked
here; the next pack takes them again. `wait`, `stop` and `start` end by packing every run directory that
finished since the copy (summary.json, metrics.jsonl, train.log, .hydra/; never checkpoints) into one
archive under `--out`, with a status table on the console. `stop` ends the stages with SIGTERM, so the
runs in flight checkpoint and stay `incomplete` there. A stop with `--out` packs them too, checkpoint
included, one `resume-*` archive a run (in parts of at most 15 MiB), as many as fit what a call brings
back, the runs furthest on first, and the next machine's `start --resume FILES...` puts them back into its
copy, where train.py resumes each from its checkpoint; `stop --without-checkpoints` leaves them on the
machine, named, and the next stretch trains them again from step 0. `start` and
`wait` take `--with-checkpoints` too: the runs train on, and each one's last checkpoint travels, so a
machine taken back before the next call costs only the steps since then. With `--fill`,
a hold whose pending cells no longer fit starts the first of them anyway, for the stop to checkpoint, and a
cell longer than the whole hold keeps its place in plan order while half the hold is left (postponed for
every shorter cell, it would wait behind all later stages; early stopping may still end it within one).
`left PLAN... --resume FILES...` prices the runs those archives carry for the steps they have left.

A plan is a text file, one stage per line: the overrides of one multirun, in the order they should run
(`#` starts a comment). In a stage with its hydra.sweep.dir, `optim.lr=best` stands for each cell's lr as
analysis.report takes it from the cell's finished runs there (analysis.lr_rule), picked cell by cell once
no other cell of the plan still trains that cell (more seeds at the best lr; needs --hold-minutes).
`start` first composes train.py's config for every stage (each swept value once) and refuses a plan with a
stage that does not compose (a misspelt key or choice), before anything is copied or started.
Only the standard library, harness/ and analysis/lr_rule.py are used here, so `wait` and `stop` need no
Hydra.

With `start ... --hold-minutes M` (the machine goes back M minutes after `start` began) the supervisor
runs the plan cell by cell instead: each stage's comma-separated values expand into cells (their
cartesian product, the last key varying fastest), each run as a multirun of its own single values, so
it lands in the directory the stage's multirun gives it. A stage whose launcher runs K > 1 at once runs up
to K of its pending cells at once, a block of them that one multirun gives (a product of values of its
swept keys), packed as before: K is hydra.launcher.n_jobs where the stage or its launcher's yaml sets it,
else hydra.launcher.jobs_per_gpu x the machine's GPUs (the launcher's rule; hydra/launcher=joblib_gpu: 3
a GPU), and the launcher spreads them over every GPU. On a machine of several GPUs a block takes only the
GPUs its runs need (its CUDA_VISIBLE_DEVICES), and the next pending cell that fits, of any stage, starts on
the idle ones beside it.
Before each launch it estimates the cell's duration from the finished runs of the work copy (`estimate`;
those of the machine's GPU where there are any: an H100 is slower than an H200); a cell that would not
end a minute before the deadline is postponed (left pending for the next stretch) and the next pending
cell that fits runs instead, so the end of a hold fills with short runs rather than with a run that is
lost. A cell whose run holds a checkpoint (put back by `start --resume`) goes before every other, in
plan order among them, though without `--fill` one that cannot end within the hold is postponed like any
other (`start` says so; the status table lists it as `carried`, not in flight). `wait --hold-minutes M`
(or `start` again on the running campaign) moves the hold to M minutes from then, once the lender has said
how much time the machine has left (M = 0: the runs in flight finish and no other starts, for a call that
waits out the last run before `stop`). Cells that the checkout holds finished are skipped without a launch.
When nothing pending fits, the supervisor ends and says so; `wait` and `status` list the postponed cells.

A carried checkpoint is a run's model, optimizer and schedule (22 to 35 MB for Fig. 4's Palindrome and
Stack models): a lent machine sends back 8 files a call, 64 MiB together, and its working tree with what is
carried is at most 64 MiB, so a call brings back at most CARRY_BYTES (48 MiB, CARRY_FILES files) of
checkpoints, and checkpoints and compile caches (about 45 MB) may not both fit in one call. A cell whose
checkpoint would be larger (sized from the finished runs of its model; Fig. 4's MQAR models, about 68 MiB)
is hold-bound: a hold runs those that fit it first, the longest first, and --fill never starts one, as a
hold's end would lose it whole. `start --carry-calls N` lets a stop's checkpoints take N calls: the stop
packs up to N calls' worth, brings back the first share and leaves the rest on the machine, and `fetch
--out $OUT` in each next call (chained, before the machine goes back) brings back the next; only cells
over N calls' worth are hold-bound then. The next machine takes them the same way, one call's files
carried a call: `mkdir -p /tmp/resume && cp CALL1/* /tmp/resume/` in the first, then `start --resume
/tmp/resume/* CALL2/*`. A pack by `start` or `wait` (the runs train on) stays within one call.

A bare machine compiles every model again (13 to 49 s of a run's first step on the H200, against 3 to 4 s
with warm caches). `stop --with-caches` (or `wait`) also packs the compile caches into --out, in parts of
at most 15 MiB, and the next machine's `start --caches PARTS...` adds them to its own before the first run;
carried here in an ignored directory (`.caches/`), they travel with the checkout to the next machine.

A failed run is recorded and the campaign goes on, unless its first BROKEN_AFTER runs all failed before
their first step: then the machine or checkout cannot train (a kernel its Triton does not compile), and
the supervisor stops, naming the error, rather than failing every cell of the plan in turn.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import fcntl
import io
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.lr_rule import cell_lr  # noqa: E402  (standard library only)
from harness.caches import cache_dirs, default_root, inductor_name  # noqa: E402  (standard library only at import)
from harness.gpus import gpu_name, runs_at_once, visible_gpus, visible_subset  # noqa: E402  (standard library only)
from harness.rundir import FileUnreadable, RunDir, read_metrics  # noqa: E402  (standard library only)

# A run directory's files that travel back; checkpoints are too large and only resume on the same machine.
RUN_FILES = ("summary.json", "metrics.jsonl", "train.log")
HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")
# The launchers' yamls (hydra/launcher=NAME), whose n_jobs and jobs_per_gpu a stage that does not set them
# runs with, below a checkout; the launcher's keys for its runs at once: n_jobs on the machine, or
# jobs_per_gpu on each GPU (n_jobs wins where both are set).
LAUNCHERS = Path("conf") / "hydra" / "launcher"
LAUNCHER_CONF = ROOT / LAUNCHERS
N_JOBS_KEY, PER_GPU_KEY = "n_jobs", "jobs_per_gpu"
# Where run directories live in a checkout: archives unpack only below these.
RUN_ROOTS = ("results", "runs")
# the overrides that place a run's directory (a stage that sets both says where its run is written)
SWEEP_PLACE = ("hydra.sweep.dir", "hydra.sweep.subdir")

# A plan's `optim.lr=best`: the lr analysis.report takes for the cell (analysis.lr_rule), read from the
# finished runs of the cell under the stage's hydra.sweep.dir once no other cell of the plan still trains
# it, so that seeds planned before a cell's other lrs came in land where the report counts them.
BEST_KEY, BEST = "optim.lr", "best"
# Not copied to the work directory: version control, carried wheels, caches and checkpoints (restored
# from there by --caches and --resume).
SKIP = {".git", ".whl", ".device", ".gl", ".caches", ".resume", "__pycache__", ".pytest_cache", ".ruff_cache",
        "wandb", "outputs", "multirun", ".scratch"}
# A later command's new end of the hold (seconds since the epoch), which the supervisor reads before each
# launch: the machine's time left is known only once it has started.
HOLD_FILE = "hold"
# The runs `start --resume` put back, each with the size of its train.log then: one whose log has not grown
# since was not launched here, so the status table says so instead of counting it in flight.
CARRIED_FILE = "carried.json"
# The runs an earlier campaign finished that snapshot put into this copy, each with its summary then: they
# were not trained here, so they do not tell whether this checkout trains (broken).
KEPT_FILE = "kept.json"
# The machine's record of the work directories its campaigns copied the checkout to (a JSON list), beside
# the compile caches: a start in another one takes the runs they finished instead of training them again.
# The variable names another file (the tests' own).
REGISTRY, REGISTRY_VARIABLE = "campaigns.json", "KDA_CAMPAIGN_REGISTRY"
# With a deadline, a cell runs only if its estimate ends this long before it: the estimate is a mean,
# and the archive of the last call still has to be made.
MARGIN_S = 60.0
# What train.py does not train again; their summaries also give a run's speed (a failed run is retried
# and often ended at its first step).
FINISHED_STATUSES = ("completed", "diverged")
# A campaign whose first runs all fail before their first step has a machine or checkout that cannot train
# (a kernel that does not compile there, a missing package), not a failed run among others: after this
# many the supervisor stops instead of failing every cell of the plan in turn.
BROKEN_AFTER = 3


# A file that comes back from a lent machine is at most 16 MiB: a larger compile-cache archive goes in parts.
PART_BYTES = 15 * 2**20
# What a call brings back (64 MiB) and what travels to the next machine with the checkout (64 MiB) bound the
# checkpoints one call carries: an archive cut off by either is lost whole, so runs past this are not packed.
CARRY_BYTES = 48 * 2**20
# A call brings back 8 files: the rest are left for the finished runs' archive and the command's own logs.
CARRY_FILES = 5
# Where stop --carry-calls N stages the checkpoints that later calls' `fetch` bring back.
CARRY_DIR = "carry"
# With --fill, the first pending cell that does not fit starts anyway while at least this much of the hold is
# left: less would end before its first checkpoint could be worth carrying.
FILL_MIN_S = 120.0
# With --fill, a carryable cell longer than the whole hold is not postponed for shorter ones while at least
# this share of the hold is left: it ends within one only by stopping early, so it should have most of one.
BEYOND_HOLD_SHARE = 0.5
# A checkpoint holds each parameter's fp32 value and AdamW's two fp32 moments (the rest is small).
CHECKPOINT_BYTES_PER_PARAM = 12
# Keys that do not change a model's parameters, so runs that differ only in them size a cell's checkpoint.
NOT_SHAPE = ("task.seq_len", "seed", "optim.", "trainer.", "logger.", "hydra")


class CampaignError(RuntimeError):
    """A command cannot go on; the message says why and what to do."""


def read_plan(path: Path) -> list[list[str]]:
    """The stages of a plan file: one list of overrides per non-empty line, comments dropped."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise CampaignError(f"plan {path} {what}: give a text file with one stage's overrides a line")
    stages = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            stages.append(shlex.split(line, comments=True))
        except ValueError as error:  # an unclosed quote
            raise CampaignError(f"plan {path} line {number}: {error} in {line.strip()!r}; close the quote, "
                                "or quote the whole override as the shell would") from None
    stages = [stage for stage in stages if stage]
    if not stages:
        raise CampaignError(f"plan {path} has no stage: write one line of train.py overrides per stage")
    for stage in stages:
        if any(arg in ("-m", "--multirun") or not arg or "=" not in arg for arg in stage):
            raise CampaignError(f"plan {path}: stage {' '.join(stage)!r} must be key=value overrides only "
                                "(the -m is added)")
        for arg in stage:
            key, value = arg.split("=", 1)
            # the launcher would refuse it only once the stage runs
            if key.lstrip("+") == f"hydra.launcher.{PER_GPU_KEY}" and not _is_null(value) \
                    and (_jobs(value) or 0) < 1:
                raise CampaignError(f"plan {path}: stage {' '.join(stage)!r}: {arg}: give the runs per GPU, "
                                    "an integer >= 1 (or null, for the launcher's n_jobs)")
        best = [arg for arg in stage if arg.startswith(f"{BEST_KEY}=") and BEST in split_values(
            arg.split("=", 1)[1])]
        if best and (best[0] != f"{BEST_KEY}={BEST}" or not any(a.startswith(f"{SWEEP_PLACE[0]}=")
                                                                 for a in stage)):
            raise CampaignError(f"plan {path}: stage {' '.join(stage)!r}: {BEST_KEY}={BEST} stands alone "
                                f"and needs the stage's {SWEEP_PLACE[0]}=DIR (where its cell's runs are)")
    return stages


def split_values(value: str) -> list[str]:
    """The comma-separated values of one override's value, as Hydra's sweep reads them: commas inside
    quotes, brackets or parentheses (a list, a `range(...)`) and escaped ones do not split."""
    values, depth, quote, current, escaped = [], 0, "", "", False
    for char in value:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(current)
            current = ""
            continue
        current += char
    return values + [current]


class Cell:
    """One point of a stage's sweep: the stage's overrides with every swept key at one value. `n_jobs`: its
    stage's runs at once, or None where its launcher runs `jobs_per_gpu` on each GPU (launcher_jobs)."""

    def __init__(self, stage: int, overrides: list[str], swept: list[int], n_jobs: int | None,
                 jobs_per_gpu: int | None = None) -> None:
        self.stage, self.overrides, self.swept, self.n_jobs = stage, overrides, swept, n_jobs
        self.jobs_per_gpu = jobs_per_gpu
        self.values = {arg.split("=", 1)[0]: arg.split("=", 1)[1] for arg in overrides}
        # what names its run (hydra.* and hydra/* configure the sweep): two cells alike here are one run
        # (values as numbers: 1e-3 and 0.001 alike), unless they set apart where it is written (eager and
        # eager_repeat: one config, two directories)
        self.run_values = {k: v for k, v in self.values.items() if not k.startswith("hydra")}
        self.run_key = tuple(sorted((k, _number(v)) for k, v in {
            **self.run_values, **{k: self.values[k] for k in SWEEP_PLACE if k in self.values}}.items()))

    def run_dir(self) -> str | None:
        """Where its run is written when the stage says so itself (hydra.sweep.dir and a subdir of literal
        text or ${key} of the cell's own values), relative to the checkout; None otherwise."""
        if not all(k in self.values for k in SWEEP_PLACE):
            return None
        try:
            subdir = re.sub(r"\$\{([^}]+)\}", lambda m: self.values[m.group(1)], self.values[SWEEP_PLACE[1]])
        except KeyError:
            return None
        return None if "$" in subdir else str(Path(self.values[SWEEP_PLACE[0]]) / subdir)

    def with_value(self, key: str, value: str) -> Cell:
        """The cell with `key` set to `value`, that position counted as swept: cells of one stage whose
        values there differ then run in separate blocks (product_block)."""
        position = next(i for i, arg in enumerate(self.overrides) if arg.split("=", 1)[0] == key)
        overrides = list(self.overrides)
        overrides[position] = f"{key}={value}"
        return Cell(self.stage, overrides, sorted({*self.swept, position}), self.n_jobs, self.jobs_per_gpu)

    def __repr__(self) -> str:
        swept = [self.overrides[i] for i in self.swept]
        if self.values.get(BEST_KEY) == BEST:
            swept.append(f"{BEST_KEY}={BEST}")
        return f"stage {self.stage + 1} " + (" ".join(swept) if swept else "(single run)")


def expand(stages: list[list[str]], conf: Path = LAUNCHER_CONF) -> list[Cell]:
    """The cells of every stage in plan order: the cartesian product of each stage's swept values in the
    order of its keys, the last fastest. (Hydra puts keys that the experiment's hydra.sweeper.params also
    sweeps first, in that file's order; the directories are the same, only the order can differ.) Each
    carries its stage's runs at once (launcher_jobs, its launcher's yamls under `conf`)."""
    cells = []
    for index, stage in enumerate(stages):
        choices = []
        for arg in stage:
            key, value = arg.split("=", 1)
            # hydra.* and hydra/* overrides configure the sweep and are not swept
            values = [value] if key.startswith("hydra") else split_values(value)
            choices.append([f"{key}={v}" for v in values])
        swept = [i for i, choice in enumerate(choices) if len(choice) > 1]
        n_jobs, jobs_per_gpu = launcher_jobs(stage, conf)
        cells += [Cell(index, list(point), swept, n_jobs, jobs_per_gpu)
                  for point in itertools.product(*choices)]
    return cells


def _is_null(text: str) -> bool:
    return text.strip() in ("null", "Null", "NULL", "~")


def _jobs(text: str | None) -> int | None:
    """A launcher's n_jobs or jobs_per_gpu as an override or its yaml writes it: the integer, else None."""
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def launcher_defaults(name: str, conf: Path = LAUNCHER_CONF) -> dict[str, str]:
    """n_jobs and jobs_per_gpu as conf/hydra/launcher/NAME.yaml sets them, over those of the yamls its
    defaults list names (read as text: the campaign runs without Hydra); {} for a launcher not there
    (Hydra's own: basic, joblib)."""
    values: dict[str, str] = {}
    seen: set[str] = set()

    def read(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        try:
            text = (conf / f"{name}.yaml").read_text()
        except OSError:
            return
        listed = re.search(r"^defaults:\s*\n((?:[ \t]*-[^\n]*\n?)+)", text, re.MULTILINE)
        for entry in re.findall(r"-\s*([\w.-]+)", listed.group(1)) if listed else []:
            if entry != "_self_":
                read(entry)
        for key, value in re.findall(rf"^({N_JOBS_KEY}|{PER_GPU_KEY}):[ \t]*([^#\n]*)", text, re.MULTILINE):
            values[key] = value.strip()

    read(name)
    return values


def launcher_jobs(stage: list[str], conf: Path = LAUNCHER_CONF) -> tuple[int | None, int | None]:
    """(n_jobs, jobs_per_gpu) of the stage's multirun, one of them None: the stage's hydra.launcher.n_jobs
    or jobs_per_gpu over its hydra/launcher's yaml (launcher_defaults), and, as the launcher takes them,
    n_jobs where set (a count), else jobs_per_gpu; (1, None) with neither (Hydra's basic launcher runs one
    at a time)."""
    values: dict[str, str] = {}
    for arg in stage:
        key, value = arg.split("=", 1)
        if key.lstrip("+") == "hydra/launcher":
            values = {**launcher_defaults(value, conf), **values}
        elif key.lstrip("+") in (f"hydra.launcher.{N_JOBS_KEY}", f"hydra.launcher.{PER_GPU_KEY}"):
            values[key.rsplit(".", 1)[1]] = value
    n_jobs, per_gpu = _jobs(values.get(N_JOBS_KEY)), _jobs(values.get(PER_GPU_KEY))
    if n_jobs is not None:
        return n_jobs, None
    if per_gpu is not None and per_gpu >= 1:
        return None, per_gpu
    return 1, None


# Run in the checkout to be copied (its conf/ and harness/): composes train.py's config for each list of
# overrides read from stdin, and prints the first that does not compose as [index, message].
_COMPOSE = r"""
import json, sys
from hydra import compose, initialize_config_dir
import harness.config  # noqa: F401  (train.py's typed schema, `base_config`)
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    for index, overrides in enumerate(json.load(sys.stdin)):
        try:
            compose("config", overrides=overrides)
        except Exception as error:
            # Hydra's hint to add a misspelt key with `+` would only move the error: train.py refuses it
            text = str(error).split("Config search path:")[0].split("To append to your config use")[0]
            if error.__cause__ is not None:
                text += ": " + str(error.__cause__).splitlines()[0]
            print(json.dumps([index, " ".join(text.split())]))
            sys.exit(1)
"""


def check_stages(stages: list[list[str]], source: Path, plans: list[Path]) -> None:
    """CampaignError naming the first stage that train.py's config cannot compose (a misspelt key or group
    choice, a value of the wrong type), found before anything is copied or started: launched, such a stage
    fails whole without recording a run. Each swept value is composed once, beside the first values of the
    stage's other keys; sweep functions (range(...), glob(*)) and optim.lr=best are left to the launch."""
    cases, owners = [], []
    for index, stage in enumerate(stages):
        choices = []
        for arg in stage:
            key, value = arg.split("=", 1)
            values = [value] if key.startswith("hydra") else split_values(value)
            if (key == BEST_KEY and BEST in values) or re.fullmatch(r"\w+\(.*\)", value.strip()):
                continue
            choices.append([f"{key}={v}" for v in values])
        first = [choice[0] for choice in choices]
        for case in [first] + [first[:position] + [value] + first[position + 1:]
                               for position, choice in enumerate(choices) for value in choice[1:]]:
            if case not in cases:
                cases.append(case)
                owners.append(index)
    try:
        result = subprocess.run([sys.executable, "-c", _COMPOSE, str(source / "conf")], cwd=source,
                                input=json.dumps(cases), capture_output=True, text=True, timeout=300,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    filter(None, [str(source), os.environ.get("PYTHONPATH")]))})
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CampaignError(f"cannot check the plan's stages with {source}/train.py's config: {error}") \
            from None
    if result.returncode == 0:
        return
    try:
        index, message = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise CampaignError(f"cannot check the plan's stages with {source}/train.py's config: {last}") \
            from None
    stage = stages[owners[index]]
    raise CampaignError(f"plan {', '.join(map(str, plans))}: stage {' '.join(stage)!r}: {message}; fix the "
                        "line (nothing was copied or started)")


def group_overrides(cells: list[Cell]) -> list[str]:
    """The overrides of one multirun running `cells` (a product_block of one stage): each swept key with
    the block's values, in plan order."""
    first = cells[0]
    overrides = list(first.overrides)
    for position in first.swept:
        key = first.overrides[position].split("=", 1)[0]
        values = dict.fromkeys(cell.overrides[position].split("=", 1)[1] for cell in cells)
        overrides[position] = f"{key}={','.join(values)}"
    return overrides


def _number(text: Any) -> Any:
    text = str(text).strip("'\"")
    # Hydra takes True and true alike; overrides.yaml keeps the one typed
    if text.lower() in ("true", "false"):
        return text.lower()
    try:
        return float(text)
    except ValueError:
        return text


def _sweeper_params(hydra_yaml: Path) -> set[str]:
    """The keys of hydra.sweeper.params in a run's .hydra/hydra.yaml (as OmegaConf writes it: two spaces
    a level), the overrides that its experiment added to the command line's."""
    keys, inside = set(), False
    for line in hydra_yaml.read_text().splitlines():
        if line == "    params:":
            inside = True
        elif inside and line.startswith("      ") and ":" in line:
            keys.add(line.strip().split(":", 1)[0])
        elif inside:
            break
    return keys


def _n_jobs(hydra_yaml: Path) -> int:
    """How many runs shared its GPU: its launcher's hydra.launcher.n_jobs (the runs at once; ours ran on one
    GPU), else its jobs_per_gpu; 1 for a launcher with neither."""
    found = {}
    for line in hydra_yaml.read_text().splitlines():
        for key in (N_JOBS_KEY, PER_GPU_KEY):
            if line.startswith(f"    {key}: ") and line.split(": ", 1)[1].strip().isdigit():
                found[key] = int(line.split(": ", 1)[1])
    return found.get(N_JOBS_KEY, found.get(PER_GPU_KEY, 1))


def _override_lines(run: Path) -> list[str]:
    """A run directory's overrides as .hydra/overrides.yaml records them (`key=value`, as typed, in order);
    OSError without the file."""
    lines = (run / ".hydra" / "overrides.yaml").read_text().splitlines()
    return [line[2:] for line in lines if line.startswith("- ") and "=" in line]


def _recorded(run: Path, src: Path) -> dict[str, Any] | None:
    """A run directory's recorded overrides (values as numbers where they are), the keys of its own command
    line (`given`: those less its experiment's sweeper params), n_jobs and its directory under `src`; None
    without a readable .hydra/."""
    try:
        lines = _override_lines(run)
        params = _sweeper_params(run / ".hydra" / "hydra.yaml")
        n_jobs = _n_jobs(run / ".hydra" / "hydra.yaml")
    except OSError:
        return None
    overrides = {key: _number(value) for key, value in (line.split("=", 1) for line in lines)}
    return {"overrides": overrides, "given": set(overrides) - params, "n_jobs": n_jobs,
            "dir": str(run.relative_to(src))}


def partial_runs(src: Path) -> list[dict[str, Any]]:
    """The runs of the work copy that train.py would resume (a checkpoint, no final summary), as
    `_recorded` gives them, with `steps`: those their summary or metrics say they hold."""
    found = []
    for run in run_dirs(src):
        summary = _summary(run) or {}
        if summary.get("status") in FINISHED_STATUSES or not (run / "checkpoint.pt").is_file():
            continue
        entry = _recorded(run, src)
        if entry is None:
            continue
        entry["steps"] = _held_step(run)[0]
        found.append(entry)
    return found


def _held_step(run: Path) -> tuple[int, str]:
    """The step the checkpoint of `run` (a run not finished) holds, and how it is known: as its summary
    records it, or else as far as its metrics are logged (the last checkpoint is at most
    trainer.checkpoint_every steps behind)."""
    summary = run / "summary.json"
    step = _checkpoint_step(_summary(run) or {})
    # A resumed run trains on under the summary its stopped launch wrote; once it checkpoints again that
    # summary is older than the checkpoint and names a step the run has long passed.
    if step is not None and summary.stat().st_mtime >= (run / "checkpoint.pt").stat().st_mtime:
        return step, f"at step {step}"
    logged = _last_step(run) or 0
    return logged, f"logged to step {logged}"


def _checkpoint_step(summary: dict[str, Any]) -> int | None:
    """The step an interrupted run's checkpoint holds, as its summary records it (None without one)."""
    step = summary.get("checkpoint_step", summary.get("steps"))
    return step if isinstance(step, int) else None


def finished_runs(src: Path) -> list[dict[str, Any]]:
    """Every run of the work copy that train.py would not train again, as `_recorded` gives them, with
    its speed where its summary gives one: seconds a step after the first, the first step's seconds
    (compilation, warm-up), mixer, length and max_steps."""
    found = []
    for run in run_dirs(src):
        summary = _summary(run) or {}
        if summary.get("status") not in FINISHED_STATUSES:
            continue
        entry = _recorded(run, src)
        if entry is None:
            continue
        entry["step_s"] = None
        steps, wall = summary.get("steps"), summary.get("wall_time_s")
        first = summary.get("first_step_s") or 0.0
        if isinstance(steps, int) and steps >= 2 and isinstance(wall, (int, float)) \
                and summary.get("seq_len"):
            config = summary.get("config") or {}
            entry.update(mixer=summary.get("mixer"), seq_len=int(summary["seq_len"]), first_s=first,
                         step_s=max(0.0, wall - first) / (steps - 1), n_params=summary.get("n_params"),
                         max_steps=config.get("trainer.max_steps"), layers=config.get("model.num_layers"),
                         gpu=(summary.get("gpu") or {}).get("name"))
        found.append(entry)
    return found


def _alike(cell: Cell, run: dict[str, Any]) -> bool:
    """The run was launched with no override beyond the cell's keys: runs of other command lines into the
    same results (a pilot with fewer steps, a check with compilation off) neither finish nor time it."""
    return run["given"] <= set(cell.values)


def run_of(cell: Cell, runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run of `runs` that is the cell's: the one in the directory the cell's stage names
    (Cell.run_dir), or, where it names none, one of the cell's kind that recorded every override of it."""
    where = cell.run_dir()
    if where is not None:
        return next((run for run in runs if run.get("dir") == where), None)
    mine = {k: _number(v) for k, v in cell.run_values.items()}
    return next((run for run in runs if _alike(cell, run)
                 and all(run["overrides"].get(k) == v for k, v in mine.items())), None)


def is_finished(cell: Cell, runs: list[dict[str, Any]]) -> bool:
    """`runs` (finished_runs) holds the cell's run."""
    return run_of(cell, runs) is not None


def estimate(cell: Cell, measured: list[dict[str, Any]], done: int = 0, gpus: int = 1,
             gpu: str | None = None) -> float | None:
    """Seconds the cell's run should take at most (max_steps less the `done` steps its checkpoint holds,
    no early stop): from finished runs of its
    mixer and length, else of its mixer at the nearest length scaled by length, else of any mixer at its
    length, else of any mixer at the nearest length scaled; None when no run is measured. Of those, the runs
    of its task where there are any. Runs packed as the
    cell will be (per_gpu: its stage's runs at once over the machine's `gpus`) come first: one of
    three sharing a GPU steps about three times slower than one alone, and scaled by length that would keep
    a lone run postponed forever. The measured runs of an n_jobs launcher count as run on one GPU (all of
    ours were); those of jobs_per_gpu as that many a GPU. max_steps: the cell's override, else the measured
    runs'. `gpu` (the machine's GPU, harness.gpus.gpu_name): of the runs that time the cell, those measured
    on that GPU where there are any (an H100 steps a KDA run at 2,048 about 1.3x slower than an H200, and a
    run the hold cannot finish is lost)."""
    mixer = cell.values.get("mixer")
    try:
        length = int(float(cell.values["task.seq_len"]))
    except (KeyError, ValueError):
        return None
    measured = [m for m in measured if m["step_s"] is not None and _alike(cell, m)]
    # the model's shape comes from the experiment and its group choices (a hybrid's ratio, Mamba2 without its
    # conv): runs of the cell's own choices time it first, then runs of its experiment, then any
    shape = {k: _number(v) for k, v in cell.run_values.items() if k == "experiment" or "/" in k}
    for keys in (shape, {k: v for k, v in shape.items() if k == "experiment"}):
        mine = [m for m in measured if all(m["overrides"].get(k) == v for k, v in keys.items())]
        if mine:
            measured = mine
            break
    packed = per_gpu(cell, gpus)
    measured = [m for m in measured if m.get("n_jobs", 1) == packed] or measured
    same = [m for m in measured if m["mixer"] == mixer]
    runs, scale = [m for m in same if m["seq_len"] == length], 1.0
    if not runs and same:
        nearest = min({m["seq_len"] for m in same}, key=lambda n: (abs(n - length), -n))
        runs, scale = [m for m in same if m["seq_len"] == nearest], length / nearest
    if not runs:
        runs = [m for m in measured if m["seq_len"] == length]
    if not runs and measured:
        # a mixer not measured yet would otherwise count as fitting and be cut off by the deadline
        nearest = min({m["seq_len"] for m in measured}, key=lambda n: (abs(n - length), -n))
        runs, scale = [m for m in measured if m["seq_len"] == nearest], length / nearest
    if not runs:
        return None
    # the task's vocabulary sizes the LM head and loss: an MQAR step (8,192 ids) is slower than a Stack one
    task = _number(cell.values["task"]) if "task" in cell.values else None
    runs = [m for m in runs if task is not None and m["overrides"].get("task") == task] or runs
    runs = [m for m in runs if gpu is not None and m.get("gpu") == gpu] or runs
    try:
        max_steps = int(float(cell.values["trainer.max_steps"]))
    except (KeyError, ValueError):
        known = [m["max_steps"] for m in runs if isinstance(m["max_steps"], int)]
        if not known:
            return None
        max_steps = max(known)
    # a deeper stack (a hybrid's 8 layers timed from 2-layer runs) steps slower in proportion: an upper
    # bound, as the LM head and loss do not grow with it
    layers, timed = cell_layers(cell), [m.get("layers") for m in runs]
    if layers and all(isinstance(n, int) and n > 0 for n in timed):
        scale *= layers / (sum(timed) / len(timed))
    # the first step (compilation) hardly depends on the length; the steps after it grow with it
    step_s = scale * sum(m["step_s"] for m in runs) / len(runs)
    return step_s * max(0, max_steps - done) + sum(m["first_s"] for m in runs) / len(runs)


def cell_layers(cell: Cell, conf: Path = ROOT / "conf") -> int | None:
    """The cell's number of layers where its overrides set it: model.num_layers, a model.pattern's length
    (`kda*3` counts 3), or an experiment/hybrid group's num_layers; None where they leave it to the
    experiment (read without Hydra, so only these)."""
    values = cell.values
    if "model.num_layers" in values:
        return _int_or_none(values["model.num_layers"])
    if "model.pattern" in values:
        names = [n.strip() for n in str(values["model.pattern"]).strip("[]").split(",") if n.strip()]
        counts = [_int_or_none(n.split("*", 1)[1]) if "*" in n else 1 for n in names]
        return sum(counts) if counts and all(counts) else None
    group = values.get("experiment/hybrid")
    if group is None:
        return None
    try:
        text = (conf / "experiment" / "hybrid" / f"{group}.yaml").read_text()
    except OSError:
        return None
    found = re.search(r"^\s+num_layers:\s*(\d+)\s*$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def _int_or_none(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def estimates_of(cells: list[Cell], pending: list[int], measured: list[dict[str, Any]],
                 partial: list[dict[str, Any]], gpus: int = 1,
                 gpu: str | None = None) -> dict[int, float | None]:
    """estimate() of each pending cell, less the steps of its run's checkpoint where it has one."""
    found = {}
    for i in pending:
        run = run_of(cells[i], partial)
        found[i] = estimate(cells[i], measured, done=run["steps"] if run else 0, gpus=gpus, gpu=gpu)
    return found


def checkpoint_bytes(cell: Cell, measured: list[dict[str, Any]]) -> int | None:
    """About the bytes of the cell's checkpoint (CHECKPOINT_BYTES_PER_PARAM a parameter), from the finished
    runs of its model: the same values of every key that shapes it (task, mixer, model, experiment; not
    the length, lr or seed), the largest where several match; None where none is measured."""
    shape = {k: _number(v) for k, v in cell.run_values.items() if not k.startswith(NOT_SHAPE)}
    sizes = [m["n_params"] for m in measured if isinstance(m.get("n_params"), int) and _alike(cell, m)
             and all(m["overrides"].get(k) == v for k, v in shape.items())]
    return max(sizes) * CHECKPOINT_BYTES_PER_PARAM if sizes else None


def hold_bound(cells: list[Cell], pending: list[int], measured: list[dict[str, Any]],
               partial: list[dict[str, Any]], calls: int = 1) -> set[int]:
    """The pending cells whose checkpoint is over what `calls` calls carry (CARRY_BYTES each): a run of one
    that a hold's end cuts off is lost whole, so it must start and finish within one hold. A cell whose run
    holds a checkpoint (`partial`) was carried, so it is not one."""
    found = set()
    for i in pending:
        if run_of(cells[i], partial) is not None:
            continue
        size = checkpoint_bytes(cells[i], measured)
        if size is not None and size > calls * CARRY_BYTES:
            found.add(i)
    return found


def hold_bound_first(pending: list[int], bound: set[int], estimates: dict[int, float | None],
                     left_s: float, resumed: int = 0) -> list[int]:
    """`pending` (resumed_first's order, its first `resumed` cells those with a checkpoint) with the
    hold-bound cells that fit in `left_s` moved up behind the resumed ones, the longest first: a long one
    only a hold this long can take, where a carried run spans holds."""
    fits = [i for i in pending[resumed:] if i in bound and estimates.get(i) is not None
            and fits_in(estimates[i], left_s)]
    ahead = sorted(fits, key=lambda i: -(estimates[i] or 0.0))  # stable: plan order among equals
    return pending[:resumed] + ahead + [i for i in pending[resumed:] if i not in fits]


def fits_in(estimate_s: float | None, left_s: float) -> bool:
    """A run of that estimate ends a margin before `left_s` is up; an unknown estimate counts as fitting."""
    return estimate_s is None or estimate_s + MARGIN_S <= left_s


def beyond_hold(pending: list[int], bound: set[int], estimates: dict[int, float | None],
                hold_s: float) -> set[int]:
    """The pending cells no hold of `hold_s` fits that a stop can carry (not in `bound`): postponed while
    shorter cells fit, one would wait behind every later stage, so with --fill they keep their plan order."""
    return {i for i in pending if i not in bound and estimates.get(i) is not None
            and not fits_in(estimates[i], hold_s)}


def _carried_note(cell: Cell, partial: list[dict[str, Any]], state: dict[str, Any]) -> str:
    """Why a postponed cell whose run was carried in waits ("" for a fresh cell): its steps left outlast the
    hold, and only --fill starts such a run, for the stop to carry again."""
    if run_of(cell, partial) is None:
        return ""
    if state.get("fill"):
        return (f"carried in; --fill starts it once no other cell runs or fits, {FILL_MIN_S / 60:g} min or "
                "more left")
    return "carried in; without --fill a run that outlasts the hold waits for a longer one"


def resumed_first(cells: list[Cell], pending: list[int], partial: list[dict[str, Any]]) -> list[int]:
    """`pending` with the cells whose run holds a checkpoint first, each group in plan order: training
    already paid for goes on before a fresh run takes the hold (and, with --fill, its end)."""
    return sorted(pending, key=lambda i: run_of(cells[i], partial) is None)


def choose(cells: list[Cell], pending: list[int], left_s: float, estimates: dict[int, float | None],
           free: int | None = None, gpus: int = 1,
           anyway: frozenset[int] | set[int] = frozenset()) -> tuple[list[int], list[int]]:
    """The next launch (indices into `cells`) and the pending cells postponed now. The first pending cell
    in plan order that fits in `left_s` (or is one of `anyway`) leads; a stage that runs more than one at
    once (at_once) adds its other fitting cells, up to that many, as a block one multirun runs
    (product_block). An unknown estimate counts as fitting. With `free` of the machine's `gpus` idle, the
    block is at most what they hold at the stage's runs per GPU."""
    fitting, postponed = [], []
    for i in pending:
        (fitting if i in anyway or fits_in(estimates.get(i), left_s) else postponed).append(i)
    if not fitting:
        return [], postponed
    lead = cells[fitting[0]]
    same_stage = [i for i in fitting if cells[i].stage == lead.stage]
    limit = at_once(lead, gpus) if free is None else min(at_once(lead, gpus), free * per_gpu(lead, gpus))
    return product_block(cells, same_stage, limit), postponed


def at_once(cell: Cell, gpus: int) -> int:
    """How many of its stage's runs one multirun runs at once on a machine of `gpus` GPUs (the launcher's
    runs_at_once)."""
    return runs_at_once(None if cell.n_jobs is None else max(1, cell.n_jobs), cell.jobs_per_gpu, gpus)


def per_gpu(cell: Cell, gpus: int) -> int:
    """How many of its stage's runs share one GPU: jobs_per_gpu, or n_jobs spread over the machine's GPUs."""
    if cell.n_jobs is None:
        return cell.jobs_per_gpu or 1
    return -(-at_once(cell, gpus) // max(1, gpus))


def product_block(cells: list[Cell], candidates: list[int], n_jobs: int) -> list[int]:
    """The largest block of `candidates` (cells of one stage, the first leading) that one multirun can run:
    a cartesian product of values of the stage's swept keys, at most n_jobs cells, grown from the lead's
    values key by key, the last (fastest) key first, each key's values in plan order. On a machine of G
    GPUs the launcher spreads the block over all of them (jobs_per_gpu a GPU, or n_jobs = G x runs per
    GPU)."""
    lead = cells[candidates[0]]
    swept = lead.swept
    if not swept or n_jobs <= 1:
        return [candidates[0]]
    index = {tuple(cells[i].overrides[p] for p in swept): i for i in candidates}
    chosen = [[lead.overrides[p]] for p in swept]
    for j in reversed(range(len(swept))):
        for value in dict.fromkeys(key[j] for key in index):
            if value in chosen[j]:
                continue
            trial = chosen[:j] + [chosen[j] + [value]] + chosen[j + 1:]
            block = list(itertools.product(*trial))
            if len(block) <= n_jobs and all(key in index for key in block):
                chosen = trial
    return sorted(index[key] for key in itertools.product(*chosen))


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (ended, not yet reaped by its parent) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON file the campaign writes, or {} where it is missing or half-written."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _state(work: Path) -> dict[str, Any]:
    return _read_json(work / "state.json")


def _write_json(path: Path, data: Any, indent: int = 0) -> None:
    """Write `path` whole or not at all: another process (wait, a start in another work directory) may
    read it at any moment. The temporary file is this process's own, so two writers never share one."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    os.replace(tmp, path)


def _write_state(work: Path, state: dict[str, Any]) -> None:
    _write_json(work / "state.json", state, indent=1)


def runs_under(root: Path) -> list[Path]:
    """Every run directory (one holding a summary.json or a metrics.jsonl) below `root`."""
    return sorted({path.parent for name in ("summary.json", "metrics.jsonl") for path in root.rglob(name)})


def run_dirs(src: Path) -> list[Path]:
    """Every run directory under the checkout's run roots."""
    return sorted({run for root in RUN_ROOTS for run in runs_under(src / root)})


def _summary(run: Path) -> dict[str, Any] | None:
    try:
        return RunDir(run).read_summary()
    except (OSError, FileUnreadable):
        return None


def _last_step(run: Path) -> int | None:
    try:
        records, _ = read_metrics(run / "metrics.jsonl")
    except OSError:
        return None
    return records[-1]["step"] if records else None


def _fingerprint(run: Path) -> str:
    """What a run directory's summary says, to tell a run finished here from one the checkout brought."""
    try:
        return (run / "summary.json").read_text()
    except OSError:
        return ""


def snapshot(work: Path, source: Path) -> Path:
    """Copy the checkout `source` to work/src and record which run directories it already holds. The
    stages run from the copy, so a later sync of the checkout cannot change code under a running sweep.

    A second `start` on a machine still held replaces an earlier copy: the runs that finished there and
    that the checkout does not hold are kept (moved into the new copy, not counted as brought), so they are
    skipped by the new stages and packed by the next `wait` or `stop` even if no archive took them yet.
    The runs that the machine's campaigns in other work directories finished are copied in the same way
    (take_finished), since their archives may not have reached the checkout yet."""
    src = work / "src"
    kept = work / "kept"
    if src.exists():
        shutil.rmtree(kept, ignore_errors=True)
        for name, _ in classify(work)["finished"]:
            (kept / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(src / name, kept / name)
        shutil.rmtree(src)
    # a start in another work directory reads this one's finished runs by its brought.json: none until
    # the new copy's is written, or it would take the checkout's runs, half copied, for finished here
    (work / "brought.json").unlink(missing_ok=True)

    def ignore(directory: str, names: list[str]) -> list[str]:
        # runs/ holds only this machine's scratch runs (it is not committed); the rest is caches
        top = Path(directory).resolve() == source.resolve()
        return [n for n in names if n in SKIP or (top and n == "runs")]

    shutil.copytree(source, src, symlinks=True, ignore=ignore)
    brought = {str(run.relative_to(src)): _fingerprint(run) for run in run_dirs(src)}
    _write_json(work / "brought.json", brought)
    taken: dict[str, str] = {}
    if kept.exists():
        for run in run_dirs(kept):
            name = str(run.relative_to(kept))
            if name not in brought:  # the checkout's copy of a run (unpacked, committed) wins
                if (src / name).exists():
                    shutil.rmtree(src / name)
                (src / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(run, src / name)
                taken[name] = _fingerprint(src / name)
        shutil.rmtree(kept)
        if taken:
            print(f"kept {len(taken)} run(s) that the earlier campaign in {work} finished (packed again by "
                  "the next wait or stop)")
    taken.update(take_finished(work, brought, set(taken)))
    _write_json(work / KEPT_FILE, taken)
    return src


def registry_path() -> Path:
    """The machine's record of campaign work directories: $KDA_CAMPAIGN_REGISTRY where set, else REGISTRY
    beside the compile caches (~/.cache/kda_harness, or under $XDG_CACHE_HOME)."""
    return Path(os.environ.get(REGISTRY_VARIABLE) or default_root().parent / REGISTRY)


def _registered(path: Path) -> list[Path]:
    """The work directories the record lists; none where it is missing or unreadable (it is written anew)."""
    try:
        listed = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        print(f"campaign: the record of this machine's campaigns {path} is unreadable ({error}); written "
              "anew", file=sys.stderr)
        return []
    if not isinstance(listed, list):
        print(f"campaign: the record of this machine's campaigns {path} is not a list; written anew",
              file=sys.stderr)
        return []
    return [Path(entry) for entry in listed if isinstance(entry, str) and Path(entry).is_absolute()]


def register(work: Path) -> list[Path]:
    """Add `work` to the machine's record of campaign work directories (registry_path), dropping those
    that no longer exist; returns the others, oldest first. A record that cannot be written is named and
    left as it was: the campaign runs without it."""
    path, here = registry_path(), work.resolve()
    dirs: list[Path] = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            # two starts at once (two work directories side by side) must not drop each other's entry
            fcntl.flock(lock, fcntl.LOCK_EX)
            dirs = [d for d in dict.fromkeys(_registered(path)) if d.is_dir()]
            dirs += [] if here in dirs else [here]
            _write_json(path, [str(d) for d in dirs])
    except OSError as error:
        print(f"campaign: the record of this machine's campaigns {path} cannot be written ({error}); the "
              "runs finished in other --work directories are not taken", file=sys.stderr)
    return [d for d in dirs if d != here]


def take_finished(work: Path, brought: dict[str, str], held: set[str]) -> dict[str, str]:
    """Copy into work/src the runs that the machine's campaigns in other work directories finished
    (completed or diverged, so train.py skips them) and that the copy does not hold (`brought` from the
    checkout, whose copy wins, or `held`, kept from this directory's earlier campaign), and register
    `work`. Their directories stay as they are; a run in flight there is not taken (a stop with
    --out and start --resume carry it). Returns each run taken with its summary."""
    src = work / "src"
    taken: dict[str, str] = {}
    for other in register(work):
        if not (other / "brought.json").is_file():  # its copy is being made, or it holds no campaign
            continue
        count = 0
        for name, _ in classify(other)["finished"]:
            run = other / "src" / name
            # a failed run trains again anyway, and would read here as this checkout failing (broken)
            if (name in brought or name in held or name in taken
                    or (_summary(run) or {}).get("status") not in FINISHED_STATUSES):
                continue
            try:
                if (src / name).exists():  # not a run (no summary, no metrics): as the kept runs replace it
                    shutil.rmtree(src / name)
                shutil.copytree(run, src / name, symlinks=True)
            except (OSError, shutil.Error) as error:
                shutil.rmtree(src / name, ignore_errors=True)
                print(f"campaign: {name} of the campaign in {other} not taken ({error})", file=sys.stderr)
                continue
            taken[name] = _fingerprint(src / name)
            count += 1
        if count:
            print(f"kept {count} run(s) that the campaign in {other} finished (packed again by the next wait "
                  "or stop)")
    return taken


def classify(work: Path) -> dict[str, list[tuple[str, str]]]:
    """Run directories of the work copy by what happened to them since the copy: `finished` (a final or
    failed summary written here), `running` (no summary yet, or `incomplete`), `carried` (put back by
    `start --resume` and not launched here since) and `brought` (untouched)."""
    src = work / "src"
    brought, carried = (_read_json(work / name) for name in ("brought.json", CARRIED_FILE))
    groups: dict[str, list[tuple[str, str]]] = {"finished": [], "running": [], "carried": [], "brought": []}
    for run in run_dirs(src):
        name = str(run.relative_to(src))
        if brought.get(name) == _fingerprint(run) and (run / "summary.json").exists():
            groups["brought"].append((name, ""))
            continue
        summary = _summary(run) or {}
        status = summary.get("status")
        if status in ("completed", "diverged", "failed"):
            acc = summary.get("best_train_acc")
            detail = f"{status} at step {summary.get('steps')}" + (
                f", peak train acc {acc:.3f}" if isinstance(acc, (int, float)) else "")
            groups["finished"].append((name, detail))
        elif name in carried and carried[name] == _log_size(run):
            groups["carried"].append((name, f"carried in {_held_step(run)[1]}, not launched here"))
        else:
            step = _last_step(run)
            groups["running"].append((name, f"{status or 'training'}, step {step if step else 0}"))
    return groups


def _log_size(run: Path) -> int:
    """The size of a run's train.log (0 where it has none): train.py writes to it as soon as it starts."""
    try:
        return (run / "train.log").stat().st_size
    except OSError:
        return 0


def broken(work: Path) -> str | None:
    """Why the campaign cannot train: BROKEN_AFTER or more runs finished here and every one failed before
    its first step (the last one's error named); None once any run here took a step. The runs snapshot
    took from earlier campaigns (KEPT_FILE) do not count, unless trained again here."""
    kept = _read_json(work / KEPT_FILE)
    summaries = [_summary(work / "src" / name) or {} for name, _ in classify(work)["finished"]
                 if kept.get(name) != _fingerprint(work / "src" / name)]
    if len(summaries) < BROKEN_AFTER or any(s.get("status") != "failed" or s.get("steps") for s in summaries):
        return None
    error = str(summaries[-1].get("error") or "no error recorded").splitlines()[0][:200]
    return (f"the {len(summaries)} runs of this campaign all failed before their first step ({error}); "
            f"stopped, the plan's other cells not launched: see {work}/stage-*.log, fix the cause and start "
            "again (the failed runs train again)")


def pack(work: Path, out: Path | None, running: bool = False) -> Path | None:
    """Archive every run finished since the copy (with `running`, the unfinished ones too, to look at,
    never to commit) into out/campaign-<time>.tar.gz; print the status table."""
    groups = classify(work)
    if running:
        groups["finished"] += groups.pop("running") + groups.pop("carried")
        groups["running"], groups["carried"] = [], []
    state = _state(work)
    stage = state.get("stage")
    print(f"campaign {work}: stage {stage if stage is not None else '-'} of {len(state.get('stages', []))}, "
          f"supervisor {'running' if _alive(state.get('pid')) else 'stopped'}; finished here "
          f"{len(groups['finished'])}, in flight {len(groups['running'])}, "
          + (f"carried in and not launched {len(groups['carried'])}, " if groups["carried"] else "")
          + f"brought {len(groups['brought'])}")
    for kind in ("finished", "running", "carried"):
        for name, detail in groups[kind]:
            print(f"  {kind:8s} {name}: {detail}")
    if state.get("deadline"):
        print(f"  deadline in {(_deadline(work, state) - time.time()) / 60:.1f} min; cells run "
              f"{state.get('cells_run', 0)}, skipped as finished {state.get('cells_skipped', 0)}, pending "
              f"{state.get('cells_pending', '-')}")
        for name, est, *why in state.get("postponed", []):
            note = f" ({why[0]})" if why and why[0] else ""
            print(f"  postponed {name}: about {est / 60:.1f} min{note}")
        for name, why in state.get("waiting", []):
            print(f"  waiting   {name}: {why}")
    if state.get("broken"):
        print(f"  BROKEN: {state['broken']}")
    if out is None or not groups["finished"]:
        return None
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"campaign-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
    src = work / "src"
    with tarfile.open(archive, "w:gz") as tar:
        for name, _ in groups["finished"]:
            run = src / name
            paths = [run / f for f in RUN_FILES] + [run / ".hydra" / f for f in HYDRA_FILES]
            for path in paths:
                if path.is_file():
                    tar.add(path, arcname=str(path.relative_to(src)))
        for log in sorted(work.glob("stage-*.log")) + [work / "campaign.log"]:
            if log.is_file():
                data = log.read_bytes()[-2_000_000:]
                info = tarfile.TarInfo(f"campaign-logs/{log.name}")
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
    print(f"packed {len(groups['finished'])} finished run(s) into {archive} ({archive.stat().st_size} bytes)")
    return archive


def supervise(work: Path) -> int:
    """Run the stages one after another (each a multirun in its own process group), or with a deadline
    the cells that fit before it; SIGTERM stops the multirun in flight the way a killed sweep stops (its
    runs checkpoint) and ends the campaign."""
    state = _state(work)
    src = work / "src"
    child: list[subprocess.Popen] = []
    stopping: list[int] = []

    def on_term(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        for process in child:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)

    def launch(index: int, overrides: list[str], label: str, devices: list[int] | None = None) -> int:
        command = [sys.executable, "train.py", "-m", *overrides]
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {shlex.join(command[1:])}", flush=True)
        # a group on some of the machine's GPUs sees only those: its launcher spreads its jobs over them
        env = None if devices is None else {**os.environ, "CUDA_VISIBLE_DEVICES": visible_subset(devices)}
        with open(work / f"stage-{index + 1:02d}.log", "ab") as log:
            process = subprocess.Popen(command, cwd=src, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
            child.append(process)
            if stopping:  # the stop came while this group was starting
                os.killpg(process.pid, signal.SIGTERM)
            return process.wait()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if state.get("deadline"):
        ending = run_cells(work, state, launch, stopping)
    else:
        for index, overrides in enumerate(state["stages"]):
            if stopping:
                break
            state.update(stage=index + 1, stage_started=time.time())
            _write_state(work, state)
            rc = launch(index, overrides, f"stage {index + 1}/{len(state['stages'])}")
            print(f"[{time.strftime('%H:%M:%S')}] stage {index + 1} exited {rc}", flush=True)
            state.setdefault("exits", []).append(rc)
            state["broken"] = broken(work)
            _write_state(work, state)
            if state["broken"]:
                break
        ending = f"stopped: {state['broken']}" if state.get("broken") else "done"
    state.update(done=time.time(), stopped=bool(stopping))
    _write_state(work, state)
    print(f"[{time.strftime('%H:%M:%S')}] campaign {'stopped' if stopping else ending}", flush=True)
    return 0


def run_cells(work: Path, state: dict[str, Any], launch: Any, stopping: list[int]) -> str:
    """The deadline's loop: launch the next cell (or group) that fits until none pending does; says why
    it ended. On a machine of several GPUs (state["gpus"]) a group takes the GPUs its runs need (`launch`
    gets their indices) and the next group starts on the idle ones, from any stage, while it runs."""
    src = work / "src"
    cells = expand(state["stages"], src / LAUNCHERS)
    finished = finished_runs(src)
    pending = [i for i, cell in enumerate(cells) if not is_finished(cell, finished)]
    state.update(cells_skipped=len(cells) - len(pending), cells_run=0)
    gpus = max(1, int(state.get("gpus", 1)))
    free = list(range(gpus))
    running: dict[futures.Future, tuple[list[int], list[int]]] = {}
    waiting: dict[int, str] = {}
    ending = "stopped"
    with futures.ThreadPoolExecutor(max_workers=gpus) as pool:
        while not stopping:
            group: list[int] = []
            state["deadline"] = _deadline(work, state)
            if free and not state.get("broken"):
                left = state["deadline"] - time.time()
                # re-read each time: a run finished in this stretch measures its mixer and length best, and
                # a cell that an earlier stage also held (a plan that runs a claim's cells first) is done
                measured = finished_runs(src)
                pending = [i for i in pending if not is_finished(cells[i], measured)]
                waiting = resolve_best(cells, pending, src)
                pending = [i for i in pending if not is_finished(cells[i], measured)]  # lr set: held?
                partial = partial_runs(src)
                ready = resumed_first(cells, [i for i in pending if i not in waiting], partial)
                estimates = estimates_of(cells, ready, measured, partial, gpus, state.get("gpu"))
                resumed = sum(run_of(cells[i], partial) is not None for i in ready)
                bound = hold_bound(cells, ready, measured, partial, int(state.get("carry_calls", 1)))
                ready = hold_bound_first(ready, bound, estimates, left, resumed)
                hold = state["deadline"] - state.get("started", state["deadline"])
                anyway = (beyond_hold(ready, bound, estimates, hold) if state.get("fill") and hold > 0
                          and left >= max(FILL_MIN_S, BEYOND_HOLD_SHARE * hold) else set())
                group, postponed = choose(cells, ready, left, estimates, len(free), gpus, anyway)
                carryable = [i for i in ready if i not in bound]
                if not group and not running and carryable and state.get("fill") and left >= FILL_MIN_S:
                    # the stop checkpoints it and packs it for the next machine
                    group, _ = choose(cells, carryable, float("inf"), estimates, len(free), gpus)
                    postponed = [i for i in postponed if i not in group]
                state.update(cells_pending=len(pending),
                             postponed=[(repr(cells[i]), estimates[i],
                                         _carried_note(cells[i], partial, state)) for i in postponed],
                             waiting=[(repr(cells[i]), why) for i, why in waiting.items()])
            if group:
                lead = cells[group[0]]
                need = -(-len(group) // per_gpu(lead, gpus))
                devices, free = free[:need], free[need:]
                # a later stage's copy of a cell in flight must not start beside it on another GPU
                launched = {cells[i].run_key for i in group}
                pending = [i for i in pending if cells[i].run_key not in launched]
                state.update(stage=lead.stage + 1, stage_started=time.time())
                _write_state(work, state)
                known = [estimates[i] for i in group if estimates[i] is not None]
                guess = f"about {max(known) / 60:.1f} min" if len(known) == len(group) else "estimate unknown"
                where = f", GPU {','.join(map(str, devices))}" if gpus > 1 else ""
                label = (f"{', '.join(map(repr, (cells[i] for i in group)))} ({guess}, {left / 60:.1f} min "
                         f"left{where})")
                running[pool.submit(launch, lead.stage, group_overrides([cells[i] for i in group]), label,
                                    devices if gpus > 1 else None)] = (group, devices)
                continue
            if not running:
                _write_state(work, state)
                if state.get("broken"):
                    ending = f"stopped: {state['broken']}"
                elif not pending:
                    ending = "done: every cell has run"
                else:
                    held = [i for i in pending if i in waiting]
                    ending = (f"done for this hold: none of the {len(pending)} pending cell(s) fits in the "
                              f"{left / 60:.1f} min left" + (f" ({len(held)} wait to pick their lr: "
                                                             f"{waiting[held[0]]})" if held else "")
                              + "; they run next stretch")
                break
            done, _ = futures.wait(list(running), timeout=5.0, return_when=futures.FIRST_COMPLETED)
            for future in done:
                group, devices = running.pop(future)
                rc = future.result()
                print(f"[{time.strftime('%H:%M:%S')}] exited {rc}", flush=True)
                state.setdefault("exits", []).append(rc)
                state["cells_run"] += len(group)
                free = sorted(free + devices)
                # a broken machine launches nothing more; what runs still ends (it may be the one that trains)
                state["broken"] = state.get("broken") or broken(work)
                _write_state(work, state)
    return ending


def carried_runs(archives: list[Path]) -> list[dict[str, Any]]:
    """partial_runs of the runs that resume archives (a stop with --out; whole or in .partNN files)
    carry, as a work copy that `start --resume` restored them into would hold them."""
    with tempfile.TemporaryDirectory() as tmp:
        for data in read_archives(archives, "--resume"):
            _extract_runs(data, Path(tmp))
        runs = partial_runs(Path(tmp))
    for run in runs:
        print(f"  carried: {run['dir']} from step {run['steps']}")
    return runs


def left(plans: list[Path], source: Path, gpus: int = 1, gpu: str | None = None,
         carried: list[Path] | None = None, calls: int = 1) -> float:
    """What the plans still have to run against the checkout `source`: each pending cell with its estimate
    (from the checkout's finished runs; at most max_steps, so early stopping only shortens it; a run that
    the resume archives `carried` hold is priced for the steps its checkpoint has left) and the minute its
    group ends, counted from the first launch (what a hold of that length would finish), and the device
    minutes of them all, launched as a hold would group them (side by side on a machine of several GPUs,
    each group on the first GPUs to come free); returns those seconds."""
    partial = partial_runs(source) + (carried_runs(carried) if carried else [])
    cells = expand([stage for plan in plans for stage in read_plan(plan)], source / LAUNCHERS)
    runs = finished_runs(source)
    # a cell an earlier stage also holds runs once (the same overrides, the same run directory)
    first: dict[tuple, int] = {}
    for i, cell in enumerate(cells):
        first.setdefault(cell.run_key, i)
    pending = [i for i in sorted(first.values()) if not is_finished(cells[i], runs)]
    # a cell of optim.lr=best is priced whether or not its lr can be picked yet (the lr does not time it)
    waiting = resolve_best(cells, pending, source)
    pending = resumed_first(cells, [i for i in pending if not is_finished(cells[i], runs)], partial)
    estimates = estimates_of(cells, pending, runs, partial, gpus, gpu)
    bound = hold_bound(cells, pending, runs, partial, calls)
    unknown, todo = 0, list(pending)
    free_at = [0.0] * max(1, gpus)
    while todo:
        now = min(free_at)
        idle = [g for g, at in enumerate(free_at) if at <= now]
        group, _ = choose(cells, todo, float("inf"), estimates, len(idle), len(free_at))
        known = [estimates[i] for i in group if estimates[i] is not None]
        unknown += len(group) - len(known)
        # when the group ends, counted from the first launch: where a hold of that many minutes cuts the plan
        end = now + max(known, default=0.0)
        for g in idle[:-(-len(group) // per_gpu(cells[group[0]], len(free_at)))]:
            free_at[g] = end
        done_by = f"  done by {end / 60:5.1f}"
        for i in group:
            est = estimates[i]
            print(f"  {cells[i]!r:60s} {'unknown' if est is None else f'{est / 60:5.1f} min'}{done_by}"
                  + (f"  (with {len(group) - 1} other(s) at once)" if len(group) > 1 else "")
                  + (f"  (lr: {waiting[i]})" if i in waiting else "")
                  + ("  (in one hold: checkpoint too large to carry)" if i in bound else ""))
        todo = [i for i in todo if i not in group]
    total = max(free_at)
    print(f"{len(pending)} of {len(first)} cells left in {', '.join(map(str, plans))}: at most "
          f"{total / 60:.0f} min of device time" + (f" on an {gpu}" if gpu else "")
          + (f", {unknown} cell(s) without an estimate" if unknown else "") + " (early stopping shortens it)")
    if bound:
        longest = max((estimates[i] or 0.0) for i in bound)
        print(f"{len(bound)} of them hold a checkpoint over the {calls * CARRY_BYTES / 2**20:.0f} MiB "
              f"{_calls(calls)} carr{'y' if calls > 1 else 'ies'}: each must finish within one hold (the "
              f"longest {longest / 60:.1f} min); a hold runs those that fit it first, the longest first"
              + ("" if calls > 1 else " (or give --carry-calls N: a stop then brings them back in N calls)"))
    return total


# What tells the runs of one cell apart: `extend` trains a cell again at the best of its runs.
RUN_OF_CELL = ("optim.lr", "seed", "trainer.max_steps")


def _cell_runs(results: Path, metric: str) -> dict[tuple, list[dict[str, Any]]]:
    """The finished runs under `results`, by cell (their recorded overrides less RUN_OF_CELL), each with
    its overrides in recorded order and by key (values as numbers), its `metric` (None where it has none),
    max_steps and seq_len."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for run in runs_under(results):
        summary = _summary(run) or {}
        if summary.get("status") not in FINISHED_STATUSES:
            continue
        try:
            # as typed: a directory is named by the text (use_short_conv=False), not by its value
            ordered = _override_lines(run)
        except OSError:
            continue
        key = tuple(sorted(o for o in ordered if o.split("=", 1)[0] not in RUN_OF_CELL))
        value = summary.get(metric)
        values = {k: _number(v) for k, v in (o.split("=", 1) for o in ordered)}
        cells.setdefault(key, []).append({
            "overrides": ordered, "dir": run, "values": values,
            "metric": float(value) if isinstance(value, (int, float)) and value == value else None,
            "has_metric": metric in summary,
            "to_threshold": summary.get("steps_to_threshold"),
            # the run's seed, also where the sweep left it at the experiment's default
            "seed": summary.get("seed", values.get("seed")),
            "max_steps": (summary.get("config") or {}).get("trainer.max_steps", summary.get("steps")),
            "seq_len": summary.get("seq_len") or 0,
        })
    return cells


def _identity(cell: Cell) -> dict[str, Any]:
    """What makes the cell's runs one cell's (analysis.report's): its values less RUN_OF_CELL."""
    return {k: _number(v) for k, v in cell.run_values.items() if k not in RUN_OF_CELL}


def resolve_best(cells: list[Cell], pending: list[int], source: Path,
                 metric: str = "best_train_acc") -> dict[int, str]:
    """Set, in `cells`, the lr of each pending cell of optim.lr=best that no other pending cell of the
    plan (of a given lr, at the same trainer.max_steps) shares its cell with: the cell's lr by
    analysis.lr_rule, as analysis.report takes it, from the finished runs of the cell under the stage's
    hydra.sweep.dir (relative to `source`) at the cell's grid budget (its smallest trainer.max_steps).
    Returns {index: why it waits} for the rest; a waiting cell is not launched."""
    waiting: dict[int, str] = {}
    given = [j for j in pending if cells[j].values.get(BEST_KEY) != BEST]
    found: dict[str, list[dict[str, Any]]] = {}
    for i in pending:
        cell = cells[i]
        if cell.values.get(BEST_KEY) != BEST:
            continue
        mine = _identity(cell)
        # (at its own budget: a longer run of the cell, planned later, does not pick the lr)
        own_steps = _number(cell.values.get("trainer.max_steps"))
        if any(_identity(cells[j]) == mine and _number(cells[j].values.get("trainer.max_steps")) == own_steps
               for j in given):
            waiting[i] = "waits for the plan's other runs of its cell"
            continue
        place = cell.values[SWEEP_PLACE[0]]
        if place not in found:
            root = source / place
            found[place] = ([r for runs in _cell_runs(root, metric).values() for r in runs] if root.is_dir()
                            else [])
        runs = [r for r in found[place] if all(r["values"].get(k) == v for k, v in mine.items())]
        # (by value: two launches that typed an override apart are still one cell)
        kinds = {tuple(sorted((k, str(v)) for k, v in r["values"].items() if k not in RUN_OF_CELL))
                 for r in runs}
        if len(kinds) > 1:
            waiting[i] = (f"its overrides match the runs of {len(kinds)} cells under {place}: name the keys "
                          "that tell them apart")
            continue
        picked = _best_run(_at_grid_budget(runs), metric, []) if runs else None
        lr = next((o.split("=", 1)[1] for o in picked[0]["overrides"] if o.startswith(f"{BEST_KEY}=")),
                  None) if picked else None
        if lr is None:
            waiting[i] = f"no finished run of its cell under {place} with {metric} and its {BEST_KEY}"
            continue
        cells[i] = cell.with_value(BEST_KEY, lr)
    return waiting


def _merge(stages: list[dict[str, list[str]]]) -> list[dict[str, list[str]]]:
    """Stages (key -> values) merged where they differ in one key's values only, until none do: each result
    is still a product of its values, so one multirun runs its cells, several at once; each keeps the place
    of the first stage merged into it."""
    changed = True
    while changed:
        changed = False
        # hydra.* settings are not swept: two results directories stay two stages
        for key in sorted({k for stage in stages for k in stage if not k.startswith("hydra")}):
            out: list[dict[str, list[str]]] = []
            into: dict[tuple, dict[str, list[str]]] = {}
            for stage in stages:
                rest = tuple(sorted((k, tuple(v)) for k, v in stage.items() if k != key))
                if key in stage and rest in into:
                    into[rest][key] += [v for v in stage[key] if v not in into[rest][key]]
                    continue
                copy = {k: list(v) for k, v in stage.items()}
                if key in stage:
                    into[rest] = copy
                out.append(copy)
            if len(out) < len(stages):
                stages, changed = out, True
    return stages


def _cells_of(results: list[Path], source: Path, metric: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(the results directory as a plan names it, the finished runs of one cell) for every cell of
    `results`, checked to be directories first."""
    for root in results:
        if not root.is_dir():
            raise CampaignError(f"results {root} is not a directory: give the directory a sweep wrote its "
                                "runs into (e.g. results/kimi_fig4_h200)")
    found = []
    for root in results:
        place = str(root.resolve().relative_to(source.resolve())) if root.resolve().is_relative_to(
            source.resolve()) else str(root)
        found += [(place, runs) for runs in _cell_runs(root, metric).values()]
    # a misspelt metric is in no summary: every cell would read as "all diverged" and the plan stay empty
    if found and not any(run["has_metric"] for _, runs in found for run in runs):
        raise CampaignError(f"--metric {metric}: no finished run's summary.json under "
                            f"{', '.join(map(str, results))} has it; give a summary field such as "
                            "best_train_acc (the default), best_eval_acc or final_eval_acc")
    yield from found


def _best_run(runs: list[dict[str, Any]], metric: str,
              notes: list[str]) -> tuple[dict[str, Any], float] | None:
    """(the best run of `runs` at the cell's best lr, the mean metric there): the lr analysis.report and
    the figures take for the cell (analysis.lr_rule: the highest mean over the seeds every lr ran, the
    fewest steps to the threshold among means within lr_rule.TIE of it), so that seeds and longer runs
    land where the report counts them; None, with a line in `notes`, where no run has a metric."""
    def lr_of(run: dict[str, Any]) -> float:
        lr = run["values"].get("optim.lr")
        return float(lr) if isinstance(lr, (int, float)) else math.inf

    picked = cell_lr((lr_of(run), run["metric"], run["to_threshold"], run["seed"]) for run in runs)
    if picked is None:
        notes.append(f"# no run with {metric} (all diverged?): {runs[0]['dir']}")
        return None
    lr, mean = picked
    return max((run for run in runs if run["metric"] is not None and lr_of(run) == lr),
               key=lambda run: run["metric"]), mean


def _at_grid_budget(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of a cell at its grid's budget, its smallest trainer.max_steps: a longer run, such as
    extend's, does not pick the cell's lr."""
    budget = min((run["max_steps"] for run in runs if isinstance(run["max_steps"], int)), default=None)
    return [run for run in runs if run["max_steps"] == budget]


def _plan_lines(stages: list[tuple[int, float, dict[str, list[str]]]], launcher: list[str]) -> list[str]:
    """Stages (seq_len, metric, key -> values) as plan lines: longest sequences first, then the lowest
    metric; cells that differ in one key's values share a line; the experiment, then `launcher`, lead."""
    stages = sorted(stages, key=lambda entry: (-entry[0], entry[1]))
    lines = []
    for stage in _merge([stage for _, _, stage in stages]):
        keys = list(stage)
        head = [k for k in keys if k == "experiment"]
        args = [f"{k}={','.join(stage[k])}" for k in head] + launcher
        args += [f"{k}={','.join(stage[k])}" for k in keys if k not in head]
        lines.append(" ".join(shlex.quote(arg) for arg in args))
    return lines


def _stage_of(overrides: list[str], drop: tuple[str, ...], place: str) -> dict[str, list[str]]:
    """A run's overrides less the keys in `drop`, experiment first, into results directory `place`."""
    kept = [o for o in overrides if o.split("=", 1)[0] not in drop]
    kept.sort(key=lambda o: not o.startswith("experiment="))
    stage = {o.split("=", 1)[0]: [o.split("=", 1)[1]] for o in kept}
    stage["hydra.sweep.dir"] = [place]
    return stage


def extend(results: list[Path], source: Path, max_steps: int, below: float, metric: str,
           launcher: list[str]) -> str:
    """A plan that trains every cell of `results` whose finished runs at its best lr (_best_run) at the
    grid's budget stayed below `below` on `metric`, their mean, again with trainer.max_steps=`max_steps` at
    that lr: each of its seeds there below `below` (a seed that solved the task at the shorter budget has
    nothing left to learn; the others are no sample of the longer budget until they run it, so a point of
    n seeds is n runs of one budget), into the same results directory. A seed that holds a run of at least
    that budget is left out; a cell where one seed does is extended whatever its mean, so that seeds added
    later follow it. Longest sequences first; cells that differ in one key's values share a stage."""
    stages, notes = [], []
    for place, runs in _cells_of(results, source, metric):
        picked = _best_run(runs, metric, notes)
        if picked is None:
            continue
        lr = picked[0]["values"].get("optim.lr")
        at_lr = [run for run in runs if run["values"].get("optim.lr") == lr and run["metric"] is not None]
        grid = [run["metric"] for run in _at_grid_budget(at_lr)]
        mean = math.fsum(grid) / len(grid) if grid else picked[1]
        longest: dict[Any, dict[str, Any]] = {}
        for run in at_lr:
            held = longest.get(run["seed"])
            if held is None or (run["max_steps"] or 0) > (held["max_steps"] or 0):
                longest[run["seed"]] = run
        extended = any(isinstance(run["max_steps"], int) and run["max_steps"] >= max_steps
                       for run in longest.values())
        if not extended and mean >= below:
            continue
        for run in longest.values():
            long_enough = isinstance(run["max_steps"], int) and run["max_steps"] >= max_steps
            if run["metric"] >= below or long_enough:
                continue
            stage = _stage_of(run["overrides"], ("trainer.max_steps",), place)
            stage["trainer.max_steps"] = [str(max_steps)]
            stages.append((run["seq_len"], mean, stage))
    head = (f"# extend: every cell of {', '.join(map(str, results))} whose mean {metric} at its best lr "
            f"is < {below:g}, again with trainer.max_steps={max_steps} at that lr, each of its seeds below "
            f"{below:g} there ({len(stages)} run(s))")
    return "\n".join([head, *notes, *_plan_lines(stages, launcher)]) + "\n"


def parse_n_jobs(text: str, flag: str = "--n-jobs", least: int = 0) -> dict[int, str]:
    """'2048=8,256=24' -> {2048: '8', 256: '24'}: hydra.launcher.n_jobs (or, for --jobs-per-gpu,
    jobs_per_gpu) for the cells of each length, each at least `least`."""
    table = {}
    for item in filter(None, text.split(",")):
        length, _, jobs = item.partition("=")
        if not (length.strip().isdigit() and jobs.strip().isdigit()) or int(jobs) < least:
            at_least = f", JOBS >= {least}" if least else ""
            raise CampaignError(f"{flag} {text!r}: each item is LENGTH=JOBS{at_least}, e.g. 2048=8,256=24")
        table[int(length)] = jobs.strip()
    return table


def seeds(results: list[Path], source: Path, wanted: list[int], metric: str, launcher: list[str],
          n_jobs: dict[int, str], jobs_per_gpu: dict[int, str] | None = None) -> str:
    """A plan that trains every cell of `results` with each seed of `wanted` at its best learning rate
    (_best_run) among the runs of the grid's budget (the smallest trainer.max_steps of the cell: a longer run,
    such as extend's, does not pick the lr), into the same results directory; seeds that the cell holds at
    that lr, at any budget, are left out. A seed runs at the longest budget of the cell's runs at that lr:
    where extend took a point to 20,000 steps, a new seed at the grid's budget would join it only if it
    solved the task there, and early stopping ends a longer run that does about as soon. A cell of length
    L runs with hydra.launcher.n_jobs=n_jobs[L] where given, else with jobs_per_gpu[L] on each GPU of
    whatever machine runs the plan (n_jobs null, so that a launcher yaml's n_jobs does not win). Longest
    sequences first."""
    jobs_per_gpu = jobs_per_gpu or {}
    both = sorted(set(n_jobs) & set(jobs_per_gpu))
    if both:
        raise CampaignError(f"--n-jobs and --jobs-per-gpu both give length {both[0]}: give it one of them")
    stages, notes = [], []
    for place, runs in _cells_of(results, source, metric):
        at_budget = _at_grid_budget(runs)
        picked = _best_run(at_budget, metric, notes) if at_budget else None
        if picked is None:
            continue
        best, mean = picked
        lr = best["values"].get("optim.lr")
        at_lr = [run for run in runs if run["values"].get("optim.lr") == lr]
        held = {run["values"].get("seed") for run in at_lr}
        missing = [str(seed) for seed in wanted if float(seed) not in held]
        if not missing:
            continue
        stage = _stage_of(best["overrides"], ("seed", "trainer.max_steps"), place)
        stage["seed"] = missing
        longest = max((run["max_steps"] for run in at_lr if isinstance(run["max_steps"], int)), default=None)
        if longest is not None and longest != best["max_steps"]:
            stage["trainer.max_steps"] = [str(longest)]
        if best["seq_len"] in n_jobs:
            stage["hydra.launcher.n_jobs"] = [n_jobs[best["seq_len"]]]
        elif best["seq_len"] in jobs_per_gpu:
            stage["hydra.launcher.n_jobs"] = ["null"]
            stage[f"hydra.launcher.{PER_GPU_KEY}"] = [jobs_per_gpu[best["seq_len"]]]
        stages.append((best["seq_len"], mean, stage))
    head = (f"# seeds: every cell of {', '.join(map(str, results))} again with seed "
            f"{','.join(map(str, wanted))} at its best lr by mean {metric}, at the longest budget its runs "
            f"there had ({len(stages)} cell(s) with seeds to run)")
    return "\n".join([head, *notes, *_plan_lines(stages, launcher)]) + "\n"


def _deadline(work: Path, state: dict[str, Any]) -> float:
    """The end of the hold: as a later `--hold-minutes` moved it, else as `start` set it."""
    try:
        return float((work / HOLD_FILE).read_text())
    except (OSError, ValueError):
        return state["deadline"]


def move_hold(work: Path, minutes: float) -> None:
    """Let the running campaign launch cells that end up to `minutes` from now (instead of its start's
    --hold-minutes), e.g. once the lender says how much of the machine's time is left."""
    state = _state(work)
    if not _alive(state.get("pid")):
        # not an error: the campaign may have ended for want of time, and this call still packs its runs
        print(f"campaign: no campaign running in {work}, so no hold to move (`start` again runs what is "
              "left)", file=sys.stderr)
        return
    if not state.get("deadline"):
        raise CampaignError(f"the campaign in {work} runs its stages whole (started without --hold-minutes): "
                            "it has no hold to move")
    (work / HOLD_FILE).write_text(repr(time.time() + 60 * minutes))
    print(f"hold moved: no cell starts that would end later than {minutes:.1f} min from now")


def wait(work: Path, minutes: float) -> None:
    """Sleep up to `minutes`, or until the stages are done, printing progress once a minute."""
    deadline = time.monotonic() + 60 * minutes
    last_print = time.monotonic()
    while time.monotonic() < deadline and _alive(_state(work).get("pid")):
        # a second: the check is a file read and a signal 0, and on a lent machine every second after the
        # stages end is device time spent waiting
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if time.monotonic() - last_print >= 60:
            groups = classify(work)
            print(f"[{time.strftime('%H:%M:%S')}] finished {len(groups['finished'])}, in flight: "
                  + "; ".join(f"{n} ({d})" for n, d in groups["running"]), flush=True)
            last_print = time.monotonic()


def start(plans: list[Path], work: Path, source: Path, hold_minutes: float | None = None,
          resume: list[bytes] | None = None, fill: bool = False, carry_calls: int = 1) -> None:
    began = time.time()
    state = _state(work)
    if _alive(state.get("pid")):
        print(f"campaign already running in {work} (pid {state['pid']}, stage {state.get('stage')}): "
              "not started again")
        if hold_minutes is not None and state.get("deadline"):
            move_hold(work, hold_minutes - (time.time() - began))
        return
    if work.resolve().is_relative_to(source.resolve()):
        raise CampaignError(f"--work {work} is inside the checkout {source}: give a directory outside it "
                            "(e.g. /tmp/campaign), where a sync of the checkout cannot reach the runs")
    stages = [stage for plan in plans for stage in read_plan(plan)]
    if hold_minutes is None and any(f"{BEST_KEY}={BEST}" in stage for stage in stages):
        raise CampaignError(f"{BEST_KEY}={BEST} in a plan needs --hold-minutes: the cell by cell supervisor "
                            "picks each cell's lr; a stage run whole would hand Hydra the word")
    check_stages(stages, source, plans)
    work.mkdir(parents=True, exist_ok=True)
    (work / HOLD_FILE).unlink(missing_ok=True)  # an earlier campaign's
    (work / CARRIED_FILE).unlink(missing_ok=True)
    snapshot(work, source)
    carried: dict[str, int] = {}
    for data in resume or []:
        for name in restore_checkpoints(data, work / "src"):
            carried[name] = _log_size(work / "src" / name)
    (work / CARRIED_FILE).write_text(json.dumps(carried, indent=0) + "\n")
    if carried and hold_minutes is not None and not fill:
        print(f"note: without --fill, a run of the {len(carried)} carried in starts only if it can end "
              f"within the {hold_minutes:g}-min hold; add --fill to train it on for the stop to carry again")
    state = {"plans": [str(plan) for plan in plans], "stages": stages, "started": time.time(), "stage": None,
             "carry_calls": carry_calls}
    if hold_minutes is not None:
        state["deadline"] = began + 60 * hold_minutes
        state["fill"] = fill
        # a stage's runs at once spread over the GPUs: each cell steps as fast as the runs per GPU let it
        state["gpus"] = max(1, visible_gpus())
        state["gpu"] = gpu_name()
    _write_state(work, state)
    log = open(work / "campaign.log", "ab")
    supervisor = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "_supervise", "--work",
                                   str(work)], cwd=work / "src", stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    state["pid"] = supervisor.pid
    _write_state(work, state)
    print(f"campaign started in {work}: {len(stages)} stage(s) of {', '.join(map(str, plans))}, supervisor "
          f"pid {supervisor.pid}" + (f", cell by cell until {hold_minutes:g} min from now" if hold_minutes
                                     is not None else ""))


def stop(work: Path, grace_s: float) -> None:
    pid = _state(work).get("pid")
    if not _alive(pid):
        print("campaign: no supervisor running")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        print(f"campaign: the supervisor did not end within {grace_s:.0f} s; killed")
    else:
        print("campaign: stopped; runs in flight checkpointed there and stay incomplete")


def save_caches(out: Path) -> list[Path]:
    """The compile caches (inductor's graphs, AOTAutograd's, Triton's binaries) as one archive under `out`,
    split into parts of PART_BYTES when larger, so that the next machine's runs start warm (`start
    --caches`); their keys hold the torch, Triton and GPU versions, so entries from another kind of
    machine are simply never hit. Inductor's directory goes under its name for this version of kernels/
    (harness/caches.py says why), which restore_caches matches."""
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"compile-caches-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, directory in cache_dirs().items():
            if directory.is_dir():
                tar.add(directory, arcname=inductor_name() if name == "inductor" else name)
    return _split(archive, "the compile caches")


def _split(archive: Path, what: str) -> list[Path]:
    """The archive as it is, or in parts of PART_BYTES (ARCHIVE.partNN) where it is larger."""
    size = archive.stat().st_size
    if size <= PART_BYTES:
        print(f"packed {what} into {archive} ({size} bytes)")
        return [archive]
    parts = []
    with open(archive, "rb") as whole:
        while chunk := whole.read(PART_BYTES):
            parts.append(archive.with_name(f"{archive.name}.part{len(parts):02d}"))
            parts[-1].write_bytes(chunk)
    archive.unlink()
    print(f"packed {what} into {len(parts)} parts {archive.name}.partNN ({size} bytes)")
    return parts


def _add_as_opened(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    """`path` into `tar` as one open of it reads it: a run still training replaces its checkpoint by a
    rename, and tar.add's stat and read of the path could see two different files."""
    try:
        handle = open(path, "rb")
    except OSError:  # not there (yet)
        return
    with handle:
        info = tar.gettarinfo(arcname=arcname, fileobj=handle)
        tar.addfile(info, handle)


def _calls(calls: int) -> str:
    return "a call" if calls == 1 else f"{calls} calls"


def save_checkpoints(work: Path, out: Path, calls: int = 1) -> list[Path]:
    """The runs in flight that hold a checkpoint, checkpoint, metrics, log, summary and .hydra/ included, one
    archive a run (in parts where larger), for the next machine's `start --resume`; [] where none has one.
    After `stop` each holds the step it had finished; from `start` or `wait` the runs train on, and the
    archive holds each one's last checkpoint (trainer.checkpoint_every), so a machine taken back before the
    next call loses only the steps since then. The runs furthest on go first, and a run whose archive would
    take the packed ones past what `calls` calls bring back (CARRY_BYTES each) is left out, named: an
    archive cut off on its way back could not be read at all. The first call's share goes into `out` and
    is returned; the rest waits in the work dir for `fetch` (one call's share each)."""
    src = work / "src"
    staged = work / CARRY_DIR
    shutil.rmtree(staged, ignore_errors=True)  # an earlier pack's parts: this one replaces them
    runs = _checkpointed_in_flight(work)
    if not runs:
        print("no run in flight holds a checkpoint: nothing to carry")
        return []
    staged.mkdir(parents=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    steps = {run: _held_step(run) for run in runs}
    packed: list[int] = []  # the staged parts' sizes, in the order fetch brings them back
    for index, run in enumerate(sorted(runs, key=lambda run: (-steps[run][0], str(run)))):
        name = run.relative_to(src)
        archive = staged / f"resume-{stamp}-{index:02d}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for path in [run / f for f in ("checkpoint.pt", *RUN_FILES)] + [run / ".hydra" / f
                                                                            for f in HYDRA_FILES]:
                _add_as_opened(tar, path, str(path.relative_to(src)))
        size = archive.stat().st_size
        parts = -(-size // PART_BYTES)
        if len(_shares(packed + [PART_BYTES] * (parts - 1) + [size - PART_BYTES * (parts - 1)])) > calls:
            archive.unlink()
            print(f"not carried: {name} {steps[run][1]} ({size / 2**20:.1f} MiB would take the checkpoints "
                  f"past what {_calls(calls)} can bring back, {CARRY_BYTES / 2**20:.0f} MiB and "
                  f"{CARRY_FILES} files each; the next machine trains it from step 0"
                  + ("" if calls > 1 else ", unless a stop with --carry-calls N brings it back") + ")")
            continue
        packed += [path.stat().st_size for path in
                   _split(archive, f"{name} in flight ({steps[run][1]}) with its checkpoint")]
    return fetch(work, out)


def _checkpointed_in_flight(work: Path) -> list[Path]:
    """The run directories of the work copy still in flight (or stopped unfinished) that hold a checkpoint."""
    src = work / "src"
    groups = classify(work)
    return [src / name for name, _ in groups["running"] + groups["carried"]
            if (src / name / "checkpoint.pt").is_file()]


def name_unpacked(work: Path) -> None:
    """Name the runs in flight that hold a checkpoint a stop left on this machine (no --out, or
    --without-checkpoints): a cell `--fill` started for the stop to carry is otherwise lost without a word."""
    for run in _checkpointed_in_flight(work):
        print(f"not packed: {run.relative_to(work / 'src')} {_held_step(run)[1]} stays on this machine "
              f"(`stop --out DIR`, in this call or the next, packs it for the next start's --resume; else "
              f"the next machine trains it from step 0)")


def _shares(sizes: list[int]) -> list[int]:
    """How many of the files of `sizes` (in order) each call brings back: whole files, at most CARRY_BYTES
    and CARRY_FILES a call."""
    shares: list[int] = []
    used = 0
    for size in sizes:
        if not shares or used + size > CARRY_BYTES or shares[-1] == CARRY_FILES:
            shares.append(0)
            used = 0
        shares[-1] += 1
        used += size
    return shares


def _part_order(path: Path) -> tuple[str, int]:
    """The archive a file is (or is a .partNN of) and its part number, -1 for a whole archive: parts sort in
    their order (part10 after part09), archives in the order they were packed."""
    match = re.fullmatch(r"(.+)\.part(\d+)", path.name)
    return (match[1], int(match[2])) if match else (path.name, -1)


def fetch(work: Path, out: Path) -> list[Path]:
    """Move what one call brings back (CARRY_BYTES, CARRY_FILES files) of the checkpoints that a stop with
    --carry-calls staged into `out`, whole parts in packing order; returns them and says what still waits."""
    staged = work / CARRY_DIR
    waiting = sorted((p for p in staged.iterdir() if p.is_file()), key=_part_order) if staged.is_dir() else []
    if not waiting:
        print("no checkpoint waits to be fetched")
        return []
    out.mkdir(parents=True, exist_ok=True)
    share = _shares([path.stat().st_size for path in waiting])[0]
    used = sum(path.stat().st_size for path in waiting[:share])
    moved = [Path(shutil.move(str(path), str(out / path.name))) for path in waiting[:share]]
    rest = waiting[share:]
    print(f"brought back {len(moved)} checkpoint file(s) ({used / 2**20:.1f} MiB): "
          + ", ".join(path.name for path in moved))
    if rest:
        left_bytes = sum(path.stat().st_size for path in rest)
        print(f"{len(rest)} more ({left_bytes / 2**20:.1f} MiB) wait on this machine: `python "
              "tools/campaign.py fetch --out $OUT` in each next call brings one call's share back; keep each "
              "call's files in a folder of their own, and carry one folder a call to the next machine")
    return moved


def restore_checkpoints(data: bytes, src: Path) -> list[str]:
    """Put the runs of a save_checkpoints archive (read_parts' bytes) into the work copy `src`, so that
    train.py resumes them; a run the copy holds finished (its summary completed or diverged) is left as it
    is. Returns the runs put back."""
    restored, finished = _extract_runs(data, src)
    print(f"resume: {len(restored)} run(s) put back with their checkpoints; train.py resumes each")
    for run in finished:
        print(f"  not put back {run}: the checkout holds it finished")
    return restored


def _extract_runs(data: bytes, src: Path) -> tuple[list[str], list[str]]:
    """restore_checkpoints' work, unannounced: (runs put into `src`, runs left out as `src` holds them
    finished)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        _refuse_unsafe(members, "--resume", "restore", logs=False)
        restored, finished = [], []
        for run, files_of_run in sorted(_by_run(members).items()):
            if (_summary(src / run) or {}).get("status") in FINISHED_STATUSES:
                finished.append(str(run))
                continue
            _extract(tar, files_of_run, src)
            restored.append(str(run))
    return restored, finished


def read_archives(files: list[Path], flag: str) -> list[bytes]:
    """The archives that `files` make (whole archives and the .partNN files of split ones, in any order and
    in any folders: the parts of one archive may come back in two calls' folders), each read by
    read_parts; CampaignError where one file name is given twice."""
    groups: dict[str, list[Path]] = {}
    seen: dict[str, Path] = {}
    for path in files:
        if path.name in seen:
            raise CampaignError(f"{flag} {path.name} is given twice ({seen[path.name]} and {path}): give "
                                "each file once")
        seen[path.name] = path
        groups.setdefault(_part_order(path)[0], []).append(path)
    return [read_parts(group, flag) for _, group in sorted(groups.items())]


def read_parts(files: list[Path], flag: str) -> bytes:
    """The archive that `files` (one archive, or its parts in any order) make, checked readable whole;
    CampaignError naming the file and the fix otherwise."""
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise CampaignError(f"{flag} {missing[0]} does not exist: give the archive or all of its .partNN "
                            "files as the stop that wrote them left them")
    ordered = sorted(files, key=_part_order)
    data = b"".join(path.read_bytes() for path in ordered)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as error:
        names = ", ".join(path.name for path in ordered)
        raise CampaignError(f"{flag} {names}: not one whole archive ({type(error).__name__}); a part "
                            "missing or cut short? give every .partNN of one archive") from None
    return data


def restore_caches(files: list[Path]) -> int:
    """Extract a save_caches archive (its parts in any order) into the compile caches' directories, keeping
    every file already there; returns the files added. Inductor's entries of another version of kernels/
    are left out: its graphs would be reused with this version's ops."""
    dirs = cache_dirs()
    homes = {inductor_name(): dirs["inductor"], "triton": dirs["triton"]}
    data = read_parts(files, "--caches")
    added = other = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or Path(member.name).is_absolute() or ".." in parts or len(parts) < 2:
                continue
            if parts[0] not in homes:
                other += parts[0].startswith("inductor")
                continue
            target = homes[parts[0]].joinpath(*parts[1:])
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
            added += 1
    print(f"compile caches: {added} file(s) added under {', '.join(map(str, dirs.values()))}"
          + (f"; {other} of inductor's from another version of kernels/ left out" if other else ""))
    return added


def _safe_member(member: tarfile.TarInfo) -> bool:
    parts = Path(member.name).parts
    return (member.isfile() and not Path(member.name).is_absolute() and ".." not in parts and len(parts) > 1
            and parts[0] in RUN_ROOTS + ("campaign-logs",))


def _refuse_unsafe(members: list[tarfile.TarInfo], source: str, verb: str, logs: bool) -> None:
    """CampaignError naming the members outside the run roots (or the campaign's logs, unless `logs`)."""
    bad = [m.name for m in members
           if not _safe_member(m) or (not logs and m.name.startswith("campaign-logs/"))]
    if bad:
        raise CampaignError(f"{source}: refuses to {verb} {bad[:3]}: only files under {RUN_ROOTS} travel")


def _by_run(members: list[tarfile.TarInfo]) -> dict[Path, list[tarfile.TarInfo]]:
    """An archive's files grouped by their run directory (a .hydra/ file belongs to the run above it)."""
    runs: dict[Path, list[tarfile.TarInfo]] = {}
    for member in members:
        parent = Path(member.name).parent
        runs.setdefault(parent.parent if parent.name == ".hydra" else parent, []).append(member)
    return runs


def _extract(tar: tarfile.TarFile, members: list[tarfile.TarInfo], into: Path) -> None:
    for member in members:
        destination = into / member.name
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(tar.extractfile(member).read())
        # _held_step compares a summary's and a checkpoint's times: keep the ones they had when packed
        os.utime(destination, (member.mtime, member.mtime))


def check_archive(archive: Path) -> None:
    """CampaignError (one line: the file and the fix) unless `archive` is a whole gzipped tar holding only
    files under the run roots; `unpack` checks every archive so before it extracts any."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
    except FileNotFoundError:
        raise CampaignError(f"unpack: {archive} does not exist: give a campaign-*.tar.gz that start, wait or "
                            "stop packed into --out") from None
    except (tarfile.TarError, EOFError, OSError) as error:
        raise CampaignError(f"unpack: {archive} is not a whole campaign archive ({error}): give a "
                            "campaign-*.tar.gz that start, wait or stop packed into --out, as it came back")\
            from None
    _refuse_unsafe(members, str(archive), "unpack", logs=True)


def unpack(archive: Path, into: Path) -> None:
    """Extract an archive's run directories into the checkout `into`; a finished run already there with
    another summary is left as it is and named (delete it first to take the new one)."""
    check_archive(archive)
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        runs = _by_run([m for m in members if not m.name.startswith("campaign-logs/")])
        new, same, kept = 0, 0, []
        for run, files in sorted(runs.items()):
            target = into / run
            incoming = next((m for m in files if Path(m.name).name == "summary.json"), None)
            present = target / "summary.json"
            if present.exists() and incoming is not None:
                data = tar.extractfile(incoming).read()
                if present.read_bytes() == data:
                    same += 1
                    continue
                if (_summary(target) or {}).get("status") in FINISHED_STATUSES:
                    kept.append(str(run))
                    continue
            _extract(tar, files, into)
            new += 1
    print(f"{archive.name}: {new} run(s) unpacked into {into}, {same} already there")
    for run in kept:
        print(f"  kept {run}: a finished run with another summary is already there (delete it to replace)")


def check_numbers(args: argparse.Namespace) -> None:
    """CampaignError naming the first option whose number cannot mean what it says (a hold that ended
    already, a budget of no steps, an accuracy above 1), before anything is copied, started or planned."""
    # a start's hold of 0 has ended already; a wait's 0 lets the runs in flight finish and starts no more
    if args.command == "wait":
        hold = ("hold_minutes", lambda v: v >= 0, "minutes from now, >= 0 (0: start no more cells)")
    else:
        hold = ("hold_minutes", lambda v: v > 0, "minutes from now, > 0")
    rules = [hold,
             ("minutes", lambda v: v >= 0, "minutes to wait, >= 0"),
             ("grace", lambda v: v >= 0, "seconds, >= 0"),
             ("gpus", lambda v: v >= 1, "GPUs, >= 1"),
             ("carry_calls", lambda v: v >= 1, "the calls a stop's checkpoints may take, >= 1 (e.g. 2)"),
             ("max_steps", lambda v: v >= 1, "the longer budget in steps, >= 1 (e.g. 20000)"),
             ("below", lambda v: 0 < v <= 1, "an accuracy in (0, 1], e.g. 0.99")]
    for name, ok, what in rules:
        value = getattr(args, name, None)
        if value is not None and not ok(value):
            raise CampaignError(f"--{name.replace('_', '-')} {value:g}: give {what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    default_work = Path(os.environ.get("CAMPAIGN_WORK", "/tmp/campaign"))
    for name in ("start", "wait", "stop", "status", "fetch", "_supervise"):
        command = sub.add_parser(name)
        command.add_argument("--work", type=Path, default=default_work,
                             help="where the copy runs (outside the checkout: a sync of it cannot touch it)")
        if name == "start":
            command.add_argument("plans", type=Path, nargs="+", help="plan files, run in this order")
            command.add_argument("--source", type=Path, default=ROOT, help="the checkout to run (this one)")
            command.add_argument("--hold-minutes", type=float, default=None,
                                 help="the machine goes back this long after start: run cell by cell, "
                                 "only those expected to end before then")
            command.add_argument("--caches", type=Path, nargs="+", default=None,
                                 help="a compile-cache archive (or its parts) from --with-caches, restored "
                                 "before the first run")
            command.add_argument("--resume", type=Path, nargs="+", default=None,
                                 help="the resume archives (or their parts) from a stop with --out: "
                                 "their runs go back into the copy and train on from their checkpoints")
            command.add_argument("--fill", action="store_true",
                                 help="with --hold-minutes: when no pending cell fits, start the first "
                                 "anyway, and run a cell longer than the whole hold in plan order while "
                                 "half the hold is left (for the stop to carry)")
        if name in ("start", "wait"):
            command.add_argument("--minutes", type=float, default=0.0, help="wait this long, then pack")
        if name == "wait":
            command.add_argument("--hold-minutes", type=float, default=None,
                                 help="move the running campaign's hold: no cell starts that would end "
                                 "later than this many minutes from now (0: the runs in flight finish, "
                                 "no other starts)")
        if name in ("start", "wait", "stop", "status"):
            command.add_argument("--out", type=Path, default=None,
                                 help="pack finished runs here ($OUT)" + ("; a stop packs the runs in flight "
                                 "with their checkpoints there too" if name == "stop" else ""))
            command.add_argument("--with-running", action="store_true",
                                 help="pack the unfinished runs too (to look at their metrics)")
            command.add_argument("--with-caches", action="store_true",
                                 help="also pack the compile caches into --out (for the next machine's "
                                 "start --caches)")
        if name == "stop":
            command.add_argument("--grace", type=float, default=120.0,
                                 help="seconds the runs get to checkpoint before they are killed")
        if name in ("start", "stop"):
            command.add_argument("--carry-calls", type=int, default=None, metavar="N",
                                 help="the stop's checkpoints may take N calls to bring back (this call's "
                                 "--out, then `fetch` in each next one), so a run whose checkpoint is over "
                                 "what one call carries need not end within the hold (start's is the stop's "
                                 "default; 1 if neither gives it)")
        if name == "fetch":
            command.add_argument("--out", type=Path, required=True,
                                 help="bring the next call's share of the stop's checkpoints here ($OUT)")
        if name in ("start", "wait", "stop"):
            command.add_argument("--with-checkpoints", action="store_true",
                                 help="also pack the runs in flight with their checkpoints into --out (for "
                                 "the next machine's start --resume; start and wait: each one's last "
                                 "checkpoint, while it trains on; a stop with --out does it unasked)")
        if name == "stop":
            # the stop ends the runs in flight: a checkpoint it leaves behind is lost with the machine
            command.add_argument("--without-checkpoints", action="store_true",
                                 help="leave the runs in flight and their checkpoints on this machine, named "
                                 "(the next one trains them from step 0)")
    command = sub.add_parser("left", help="the cells the plans still have to run here, with estimates")
    command.add_argument("plans", type=Path, nargs="+")
    command.add_argument("--source", type=Path, default=ROOT, help="the checkout whose runs count (this one)")
    command.add_argument("--gpus", type=int, default=None,
                         help="the GPUs of the machine that will run the plans (default: this one's, at "
                         "least 1): a stage's n_jobs spread over them, its jobs_per_gpu on each")
    command.add_argument("--gpu", default=None, metavar="NAME",
                         help="the GPU that will run them, as nvidia-smi names it (default: this machine's): "
                         "each cell priced from runs on it where there are any")
    command.add_argument("--resume", type=Path, nargs="+", default=None,
                         help="the resume archives (or their parts) the next start --resume takes: their "
                         "runs priced for the steps their checkpoints have left")
    command.add_argument("--carry-calls", type=int, default=1, metavar="N",
                         help="as start's: a cell is hold-bound only where its checkpoint is over what N "
                         "calls carry")
    command = sub.add_parser("extend", help="a plan that trains the unsolved cells of results again, "
                             "longer")
    command.add_argument("results", type=Path, nargs="+", help="results directories (a sweep's dir)")
    command.add_argument("--max-steps", type=int, required=True, help="the longer budget (trainer.max_steps)")
    command.add_argument("--below", type=float, default=0.99,
                         help="a cell whose best run is below this is unsolved (default 0.99)")
    command.add_argument("--metric", default="best_train_acc",
                         help="the summary field judged (default best_train_acc, Kimi Fig. 4's)")
    command.add_argument("--with", dest="launcher", default="",
                         help="overrides put in every stage, e.g. 'hydra/launcher=joblib_gpu "
                         "hydra.launcher.jobs_per_gpu=1'")
    command.add_argument("--source", type=Path, default=ROOT, help="the checkout (this one)")
    command = sub.add_parser("seeds", help="a plan that trains every cell of results with more seeds, at "
                             "its best lr")
    command.add_argument("results", type=Path, nargs="+", help="results directories (a sweep's dir)")
    command.add_argument("--seeds", required=True, help="the seeds to add, e.g. 1,2")
    command.add_argument("--metric", default="best_train_acc",
                         help="the summary field that picks the best lr (default best_train_acc)")
    command.add_argument("--with", dest="launcher", default="",
                         help="overrides put in every stage, e.g. 'hydra/launcher=joblib_gpu'")
    command.add_argument("--n-jobs", default="",
                         help="hydra.launcher.n_jobs by length, LENGTH=JOBS,..., e.g. 2048=8,1024=8,512=24")
    command.add_argument("--jobs-per-gpu", default="",
                         help="hydra.launcher.jobs_per_gpu by length, LENGTH=JOBS,..., e.g. 2048=1,512=3: "
                         "the plan then fills any machine's GPUs")
    command.add_argument("--source", type=Path, default=ROOT, help="the checkout (this one)")
    command = sub.add_parser("unpack")
    command.add_argument("archives", type=Path, nargs="+")
    command.add_argument("--into", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    if getattr(args, "with_caches", False) and args.out is None:
        print("campaign: --with-caches packs the compile caches into --out: give --out DIR", file=sys.stderr)
        return 2
    if getattr(args, "with_checkpoints", False) and args.out is None:
        print("campaign: --with-checkpoints packs the runs in flight into --out: give --out DIR",
              file=sys.stderr)
        return 2
    if getattr(args, "with_checkpoints", False) and getattr(args, "without_checkpoints", False):
        print("campaign: --with-checkpoints and --without-checkpoints: give one of them", file=sys.stderr)
        return 2
    if args.command == "stop" and args.out is not None and not args.without_checkpoints:
        args.with_checkpoints = True
    if getattr(args, "fill", False) and args.hold_minutes is None:
        print("campaign: --fill starts cells that do not fit before the hold's end: give --hold-minutes M",
              file=sys.stderr)
        return 2
    try:
        check_numbers(args)
        if args.command in ("wait", "stop", "status", "fetch") and not (args.work / "state.json").is_file():
            # a --work that no start used (a typo, another CAMPAIGN_WORK, a fresh machine) has nothing to
            # wait for or pack, which would read as a campaign that ended with nothing finished
            raise CampaignError(f"no campaign in {args.work} (no state.json): give the --work that start "
                                "used, or start one there (start PLAN...)")
        if args.command == "_supervise":
            return supervise(args.work)
        if args.command == "left":
            left(args.plans, args.source, args.gpus or max(1, visible_gpus()), args.gpu or gpu_name(),
                 args.resume, args.carry_calls)
            return 0
        if args.command == "extend":
            print(extend(args.results, args.source, args.max_steps, args.below, args.metric,
                         shlex.split(args.launcher)), end="")
            return 0
        if args.command == "seeds":
            try:
                wanted = [int(seed) for seed in args.seeds.split(",")]
            except ValueError:
                raise CampaignError(f"--seeds {args.seeds!r}: give integers, e.g. 1,2") from None
            if any(seed < 0 for seed in wanted):
                raise CampaignError(f"--seeds {args.seeds!r}: train.py takes seeds >= 0; give e.g. 1,2")
            per_gpu = parse_n_jobs(args.jobs_per_gpu, "--jobs-per-gpu", 1)
            print(seeds(args.results, args.source, wanted, args.metric, shlex.split(args.launcher),
                        parse_n_jobs(args.n_jobs), per_gpu), end="")
            return 0
        if args.command == "unpack":
            for archive in args.archives:
                check_archive(archive)
            for archive in args.archives:
                unpack(archive, args.into)
            return 0
        if args.command == "start":
            # both read and checked before anything is copied or started
            resume = read_archives(args.resume, "--resume") if args.resume else None
            if args.caches:
                restore_caches(args.caches)
            start(args.plans, args.work, args.source, args.hold_minutes, resume, args.fill,
                  args.carry_calls or 1)
        if args.command == "wait" and args.hold_minutes is not None:
            move_hold(args.work, args.hold_minutes)
        if args.command in ("start", "wait"):
            wait(args.work, args.minutes)
        if args.command == "fetch":
            fetch(args.work, args.out)
            return 0
        if args.command == "stop":
            stop(args.work, args.grace)
        pack(args.work, args.out, args.with_running)
        if getattr(args, "with_checkpoints", False):
            # start's and wait's packs recur while the runs train on: only a stop's may span calls
            calls = (args.carry_calls or int(_state(args.work).get("carry_calls", 1))
                     if args.command == "stop" else 1)
            save_checkpoints(args.work, args.out, calls)
        elif args.command == "stop":
            name_unpacked(args.work)
        if getattr(args, "with_caches", False):
            save_caches(args.out)
    except CampaignError as error:
        print(f"campaign: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # its output piped into `head`: what was read is what was wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
