"""Benchmarks of the recurrent core: a client of `worldmodels`, run from the repository root and
not installed with the package (as fla's, mamba's and nanoGPT's `benchmarks/`).

    python -m benchmarks [--suite gru|unroll|learner|all] ...   # our backends next to the peers (__main__.py)
    python -m benchmarks.compile_time [--steps 32,64,128,256]   # loop vs scan under torch.compile
    python -m benchmarks.<name>                                  # triton_rssm, triton_rnn, tf32_rounding: the kernels;
                                                                 # update_profile, loop_pace: the update and the loop
    python -m benchmarks.profile.<name>                          # profilers: where a kernel call's time goes

The kernel benchmarks' CLIs share `_cli` (`--out` JSON, `--device`, the GPU line of their output).

The table behind `python -m benchmarks`:
- `timing`: warm-up, CUDA-event / perf_counter repeats, median, peak memory;
- `parity`: first-call checks against the `loop` reference, refusal of degenerate data;
- `autodiff`: the timed call of each mode (fwd, fwd+bwd with random cotangents, no-grad);
- `runner`: groups (one shape and mode) of candidates -> rows, our backends read from the
  registry; `report`: table, JSON, docs;
- suites: `gru_suite`, `unroll_suite` (+ `shapes`, the `seed` peer, `torchrl_peers`),
  `learner_suite` (+ `torchrl_learner`).
"""
