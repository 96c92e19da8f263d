"""The benchmark behind `scripts/bench.py`: one process times our backends next to the peers.

- `timing`: warm-up, CUDA-event / perf_counter repeats, median, peak memory;
- `parity`: first-call checks against the `loop` reference, refusal of degenerate data;
- `autodiff`: the timed call of each mode (fwd, fwd+bwd with random cotangents, no-grad);
- `runner`: groups (one shape and mode) of candidates -> rows; `report`: table, JSON, docs;
- suites: `gru_suite`, `unroll_suite` (+ `shapes`, the `seed` peer, `torchrl_peers`),
  `learner_suite` (+ `torchrl_learner`).
"""
