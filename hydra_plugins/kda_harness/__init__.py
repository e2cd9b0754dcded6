"""The harness's Hydra plugins: a local launcher that survives a killed run, and a sweeper that ends every
sweep with a status summary (and a non-zero exit when a run did not finish)."""
