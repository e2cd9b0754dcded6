"""Benchmarks, one script per question, run as modules from the repository root (`python -m benchmarks.X`).

    speed      how fast are the ops: ours against FLA, torch and SDPA (`ops`), per kernel (`kernels`), the
               LM head + loss (`loss`), the torch op on the CPU (`cpu`), two trees' timings (`compare`)
    step       how fast is a whole training step, and where its GPU time goes
    memory     what a training step keeps for its backward, by module and autograd node
    launches   what the kernels launch and compile to, against a git revision (`diff`, `ptx`), and how many
               programs fit an SM (`occupancy`); no GPU needed
    solve_precision  how much error the UT transform's TF32 products add (a CPU emulation)
    sweep_packing    what packing several training runs on one GPU buys against a serial sweep
    gpu.sh     the run-sheet of a GPU session: `bash benchmarks/gpu.sh OUT [STEPS]`

`common` is the toolkit they share (inputs, shapes, recorded launches, provenance). Results and their
index: benchmarks/results/; FLA's and earlier figures to compare against: benchmarks/anchors/.
"""
