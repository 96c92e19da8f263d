"""`python -m benchmarks.replay_sample`: a tiny run times every size and prints the table."""

from __future__ import annotations

import json

from benchmarks import replay_sample


def test_tiny_run_times_each_size_and_prints_the_table(capsys, tmp_path):
    out = tmp_path / "replay.json"
    rows = replay_sample.main(["--sizes", "300", "1000", "--envs", "3", "--episode", "40", "--batch", "4",
                               "--seq-len", "8", "--repeats", "3", "--cross-episodes", "--out", str(out)])
    assert [r["size"] for r in rows] == [300, 1000]
    assert all(r["add_sample_ms"] > 0 and r["sample_alone_ms"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert "add+sample ms" in printed and "1,000" in printed
    assert json.loads(out.read_text())["rows"] == rows
