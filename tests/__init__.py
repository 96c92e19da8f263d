"""The tests: one folder per package layer (core, ops, models, algos, data, envs, train) and the benchmarks;
shared helpers (`_train_config`, `_graphs`, `_triton`, `custom_envs`) and the fixtures (`conftest.py`) here."""
