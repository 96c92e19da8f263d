"""`python -m benchmarks.compile_time`: a row past `--row-timeout` is reported as timed out (its
process group killed), and the larger T of the same (model, compiler, backend) are not run."""

from __future__ import annotations

from benchmarks import compile_time


def test_row_timeout_reports_and_skips_larger_steps(capsys):
    status = compile_time.main(["--steps", "4,8", "--models", "v1", "--backends", "scan", "--device", "cpu",
                                "--row-timeout", "0.5"])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0  # a timeout is not a failure
    assert "| v1 | 4 | inductor | `scan` | > 0.5 s (timed out) | - | - |" in lines
    assert "| v1 | 8 | inductor | `scan` | not run (T=4 timed out) | - | - |" in lines
