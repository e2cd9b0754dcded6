"""Train one mixer on one synthetic task: the Hydra entry point (docs/design.md §7).

    python train.py                                    # the default: MQAR, small enough for a laptop CPU
    python train.py task=palindrome mixer=attention task.seq_len=256 optim.lr=1e-3
    python train.py -m mixer=attention,linear_attn seed=0,1   # a sweep

The trunk config is typed (harness/config.py: dataclasses stored in Hydra's ConfigStore as `base_config`),
so a misspelt key is an error; the mixer group is free-form (`_target_` + the mixer's own kwargs, checked
against its constructor). Every run writes into its Hydra run directory:

    metrics.jsonl   one JSON object per logged step (train/loss, train/acc, lr, time_s; eval/* on eval steps)
    summary.json    status (completed | diverged | failed | incomplete: interrupted, resumable), accuracies,
                    steps_to_threshold, throughput, sizes
    checkpoint.pt   model + optimizer + scheduler + progress; re-running in the same directory resumes
    train.log       the log, with the traceback if the run failed

The application is harness/cli.py; the training loop harness/trainer.py.
"""

from harness.cli import main

if __name__ == "__main__":
    main()
