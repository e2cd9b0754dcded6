"""The training harness behind `python train.py` (docs/design.md §2): a run from its config to its run
directory.

    config.py   the typed config schema (Hydra's `base_config`), its checks, what a relaunch may change
    check.py    what a launch is checked against before anything is written (config, run directory)
    data.py     the task's data: its generator, the batch order, batches on the device
    step.py     the pieces of a training step and of an evaluation
    run.py      a run built from its config, its progress and its summary
    trainer.py  `train`: one run, start to end; `Trainer`: its training loop
    rundir.py   a run directory: lock, checkpoint, metrics, summary
    log.py      what a run reports: its progress lines, train.log, W&B
    signals.py  SIGTERM as an interrupt; a sweep's workers ending with it
    cli.py      the Hydra application (`python train.py`, `kda-train`)

Nothing is imported here: tools/campaign.py reads run directories through `harness.rundir` with the
standard library alone.
"""
