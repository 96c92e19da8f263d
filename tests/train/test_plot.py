"""scripts/plot.py: seeds of one config become one curve (mean, min, max), a resumed run's repeated
steps count once, different configs are labelled by what differs, a PNG is written, and bad
input fails naming the run directory or the key."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "plot.py"
spec = importlib.util.spec_from_file_location("plot_script", SCRIPT)
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)


def make_run(root: Path, name: str, seed: int, evals: dict[int, float], horizon: int = 15) -> Path:
    run = root / name
    run.mkdir()
    config = {"seed": seed, "run_dir": str(run), "threads": 1, "steps": 3000, "env": {"name": "pendulum"},
              "algo": {"name": "dreamer_v3", "horizon": horizon}, "logger": {"kind": "csv"}}
    OmegaConf.save(OmegaConf.create(config), run / "config.yaml")
    lines = [{"step": 500, "train/return": -1300.0}]
    lines += [{"step": step, "eval/return": value, "updates": step // 4} for step, value in evals.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_seeds_group_into_one_curve_with_mean_min_max(tmp_path):
    a = make_run(tmp_path, "a", 0, {1000: -1200.0, 2000: -800.0, 3000: -300.0})
    b = make_run(tmp_path, "b", 1, {1000: -1000.0, 2000: -600.0})  # stopped early: no step 3000
    with (b / "metrics.jsonl").open("a") as f:  # resumed from step 1000: step 2000 logged again
        f.write(json.dumps({"step": 2000, "eval/return": -400.0}) + "\n")
    other = make_run(tmp_path, "c", 0, {1000: -900.0}, horizon=10)
    groups = plot.group_runs([a, b, other], "eval/return")
    assert [len(g["runs"]) for g in groups] == [2, 1]
    assert [g["label"] for g in groups] == ["pendulum dreamer_v3 algo.horizon=15",
                                            "pendulum dreamer_v3 algo.horizon=10"]
    steps, mean, low, high, count = plot.seed_stats(groups[0]["runs"])
    np.testing.assert_array_equal(steps, [1000, 2000, 3000])
    np.testing.assert_allclose(mean, [-1100.0, -600.0, -300.0])  # seed b's step 2000: the resumed value
    np.testing.assert_allclose(low, [-1200.0, -800.0, -300.0])
    np.testing.assert_allclose(high, [-1000.0, -400.0, -300.0])
    np.testing.assert_array_equal(count, [2, 2, 1])


def test_labels_name_the_curves_and_group_runs_whatever_their_configs(tmp_path):
    """Runs that differ outside their configs (an env var) are told apart by `--labels`; equal
    labels are seeds of one curve even when configs differ; a count mismatch names the option."""
    a = make_run(tmp_path, "a", 0, {1000: -1200.0})
    b = make_run(tmp_path, "b", 0, {1000: -1000.0})
    c = make_run(tmp_path, "c", 1, {1000: -900.0}, horizon=10)
    groups = plot.group_runs([a, b, c], "eval/return", labels=["core tf32", "core ieee", "core tf32"])
    assert [(g["label"], len(g["runs"])) for g in groups] == [("core tf32", 2), ("core ieee", 1)]
    with pytest.raises(ValueError, match="--labels gives 1 labels for 3 run directories"):
        plot.group_runs([a, b, c], "eval/return", labels=["x"])
    # one label over runs of two envs: one curve per env (each in its own panel with --reference)
    d = make_run(tmp_path, "d", 0, {1000: -500.0})
    OmegaConf.save(OmegaConf.merge(OmegaConf.load(d / "config.yaml"), {"env": {"name": "cartpole_swingup"}}),
                   d / "config.yaml")
    groups = plot.group_runs([a, c, d], "eval/return", labels=["ours", "ours", "ours"])
    assert [(g["label"], g["config"]["env.name"], len(g["runs"])) for g in groups] == [
        ("ours", "pendulum", 2), ("ours", "cartpole_swingup", 1)]


def test_command_writes_a_png_and_prints_the_table(tmp_path):
    a = make_run(tmp_path, "a", 0, {1000: -1200.0, 2000: -800.0})
    b = make_run(tmp_path, "b", 1, {1000: -1000.0, 2000: -600.0})
    out = tmp_path / "docs" / "curves.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "step     2000  mean    -700.0  min    -800.0  max    -600.0  seeds 2" in proc.stdout


def test_help_exits_0_and_without_out_the_image_goes_into_the_run(tmp_path, monkeypatch, capsys):
    """`plot.py --help` prints its usage (naming the default image); `plot.py <run>` writes
    <run>/curves.png, several runs ./curves.png, and --make-reference still needs --out."""
    with pytest.raises(SystemExit) as exit_:
        plot.main(["--help"])
    assert exit_.value.code == 0 and "default: curves.png in the one run" in " ".join(capsys.readouterr().out.split())
    a = make_run(tmp_path, "a", 0, {1000: -1200.0, 2000: -800.0})
    b = make_run(tmp_path, "b", 1, {1000: -1000.0, 2000: -600.0})
    assert plot.main([str(a)]) == 0
    assert (a / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {a / 'curves.png'}" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path / "b")
    assert plot.main([str(a), str(b)]) == 0 and (b / "curves.png").is_file()
    with pytest.raises(SystemExit) as exit_:
        plot.main(["--make-reference", str(tmp_path)])
    assert exit_.value.code == 2 and "--make-reference needs --out" in capsys.readouterr().err


def test_marks_draw_published_scores_and_bad_marks_fail_naming_the_form(tmp_path, monkeypatch, capsys):
    """--mark STEP:VALUE:LABEL draws a point with its label (the paper's number beside a curve)."""
    import matplotlib.axes

    a = make_run(tmp_path, "a", 0, {1000: -1200.0, 2000: -800.0})
    drawn = []
    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *args, **kw: drawn.append((args, kw.get("label"))) or real_plot(self, *args, **kw))
    out = tmp_path / "marked.png"
    assert plot.main([str(a), "--out", str(out), "--mark", "2000:-500:paper at 2K", "--mark", "1500:-900"]) == 0
    marks = {label: args for args, label in drawn if label in ("paper at 2K", "-900 at 1500")}
    assert marks == {"paper at 2K": ([2000.0], [-500.0]), "-900 at 1500": ([1500.0], [-900.0])}
    with pytest.raises(SystemExit):
        plot.main([str(a), "--out", str(out), "--mark", "500K:475"])
    assert "expected STEP:VALUE:LABEL" in capsys.readouterr().err


def test_bin_averages_each_runs_values_before_the_seeds_are_combined(tmp_path, capsys):
    a = make_run(tmp_path, "a", 0, {1000: -1200.0, 2000: -800.0, 3000: -300.0, 5000: -100.0})
    b = make_run(tmp_path, "b", 1, {1500: -1000.0, 2000: -600.0})
    assert plot.main([str(a), str(b), "--out", str(tmp_path / "binned.png"), "--bin", "2000"]) == 0
    table = capsys.readouterr().out
    assert "step     2000  mean    -900.0  min   -1000.0  max    -800.0  seeds 2" in table  # a: -1000, b: -800
    assert "step     4000  mean    -300.0" in table and "step     6000  mean    -100.0" in table
    assert "step     3000" not in table
    with pytest.raises(SystemExit):
        plot.main([str(a), "--out", str(tmp_path / "x.png"), "--bin", "0"])


def test_missing_run_and_missing_key_fail_naming_them(tmp_path):
    a = make_run(tmp_path, "a", 0, {1000: -1200.0})
    with pytest.raises(FileNotFoundError, match="nowhere"):
        plot.group_runs([tmp_path / "nowhere"], "eval/return")
    with pytest.raises(ValueError, match=r"--key='eval/retrun'.*'eval/return'"):
        plot.group_runs([a], "eval/retrun")
    assert plot.main([str(a), "--out", str(tmp_path / "x.png"), "--key", "eval/retrun"]) == 2
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------- --reference

def make_dmc_run(root: Path, name: str, seed: int, lines: list[dict]) -> Path:
    run = root / name
    run.mkdir()
    config = {"seed": seed, "run_dir": str(run), "steps": 500_000, "algo": {"name": "dreamer_v3"},
              "env": {"suite": "dmc", "task": "walker/walk", "name": "walker_walk", "action_repeat": 2}}
    OmegaConf.save(OmegaConf.create(config), run / "config.yaml")
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_bins_average_the_returns_that_end_in_them():
    ends, means = plot.bin_mean(np.array([1000.0, 10_000, 12_000, 18_000, 35_000]),
                                np.array([1.0, 3.0, 10.0, 20.0, 7.0]), 10_000)
    np.testing.assert_array_equal(ends, [10_000, 20_000, 30_000, 40_000])
    np.testing.assert_allclose(means, [2.0, 15.0, np.nan, 7.0])  # a return at 10K counts for the bin ending there


def test_reference_plot_compares_training_returns_with_the_reference(tmp_path):
    reference = json.loads(plot.REFERENCE.read_text())
    assert reference["source"]["repo"] == "danijar/dreamerv3" and len(reference["source"]["commit"]) == 40
    assert len(reference["tasks"]) == 18 and reference["source"]["read_at"].startswith("423291a")
    episodes = [{"step": frames, "env_steps": frames, "episode/return": frames / 1000, "episode/length": 500}
                for frames in range(1000, 210_001, 1000)]
    a = make_dmc_run(tmp_path, "a", 0, episodes + [{"step": 100_000, "eval/return": 5.0}])
    b = make_dmc_run(tmp_path, "b", 1, [dict(e, **{"episode/return": e["episode/return"] + 100}) for e in episodes])
    out = tmp_path / "ref.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), "--reference", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    walker = reference["tasks"]["walker_walk"]
    i = walker["x"].index(100_000)
    ref = f"{walker['mean'][i]:.1f} ({walker['min'][i]:.1f}-{walker['max'][i]:.1f})"
    # bin (90K, 100K]: returns 91..100 (mean 95.5) and +100 for seed b: mean 145.5, min 95.5, max 195.5
    assert "(episode/return) vs DreamerV3 DMC proprio (2023 scores) (5 seeds), walker_walk:" in proc.stdout
    assert re.search(rf"\n +100K +145\.5 \(95\.5-195\.5\) +{re.escape(ref)}  below the band\n", proc.stdout), \
        proc.stdout
    assert re.search(r"\n +20K +65\.5 \(15\.5-115\.5\) +88\.5 \([0-9.-]+\)\n", proc.stdout), proc.stdout  # inside
    assert re.search(r"\n +200K +245\.5 ", proc.stdout) and re.search(r"\n +490K +not reached\n", proc.stdout)


def test_a_bin_a_run_stopped_inside_says_where(tmp_path):
    """A run stopped at 46K frames fills the (40K, 50K] bin with 6K frames of returns: its row says so."""
    episodes = [{"step": f, "env_steps": f, "episode/return": f / 1000} for f in range(2000, 46_001, 2000)]
    run = make_dmc_run(tmp_path, "a", 0, episodes)
    groups = plot.group_runs([run], "eval/return", references=plot.run_references([run]))
    assert groups[0]["last"] == [46_000] and groups[0]["task"] == "walker_walk"
    rows = plot.reference_table(groups, frames=(40_000, 50_000))
    assert rows[2].split()[0] == "40K" and "partial" not in rows[2]
    assert rows[3].split()[:2] == ["50K", "44.0"] and rows[3].endswith("partial: a run ends at 46K")


def test_reference_falls_back_to_eval_returns(tmp_path):
    run = make_dmc_run(tmp_path, "a", 0, [{"step": s, "eval/return": s / 1000} for s in (50_000, 100_000)])
    groups = plot.group_runs([run], "eval/return", references=plot.run_references([run]))
    assert groups[0]["keys"] == {"eval/return"}
    np.testing.assert_array_equal(groups[0]["runs"][0][1], [50_000, 100_000])
    table = plot.reference_table(groups)
    assert table[0].startswith("walker_walk dreamer_v3 (eval/return) vs DreamerV3 DMC proprio")
    assert [" ".join(row.split()[:3]) for row in table[2:5]] == [
        "20K no return", "50K 50.0 (50.0-50.0)", "100K 100.0 (100.0-100.0)"]
    assert table[5].split() == ["200K", "not", "reached"]
    rows = plot.reference_table(groups, frames=(100_000,))
    assert len(rows) == 3 and rows[2].split()[0] == "100K"


def test_a_run_kept_as_bin_means_is_drawn_with_the_reference_only(tmp_path):
    """A run whose metrics.jsonl was lost keeps its training returns' bin means (binned_returns.json):
    --reference reads them as they are; a plain plot, or bins of another width, fail naming the file."""
    run = make_dmc_run(tmp_path, "kept", 1, [])
    (run / "metrics.jsonl").unlink()
    kept = {"binsize": 10_000, "bin_ends": [10_000, 20_000, 30_000], "means": [90.0, 300.0, 380.0],
            "last_frame": 29_000}
    (run / plot.BINNED).write_text(json.dumps(kept))
    assert plot.run_dirs([tmp_path]) == [run]
    references = plot.run_references([run])
    groups = plot.group_runs([run], "eval/return", references=references)
    (_, ends, means), = groups[0]["runs"]
    np.testing.assert_array_equal(ends, kept["bin_ends"])
    np.testing.assert_array_equal(means, kept["means"])
    assert groups[0]["keys"] == {"episode/return"} and groups[0]["last"] == [29_000]
    rows = plot.reference_table(groups, frames=(20_000, 30_000))
    assert rows[2].split()[:2] == ["20K", "300.0"] and rows[3].endswith("partial: a run ends at 29K")
    with pytest.raises(ValueError, match="binned_returns.json.*bins of 10000 frames"):
        plot.group_runs([run], "eval/return", references=[{**references[0], "binsize": 5_000}])
    with pytest.raises(ValueError, match="keeps only binned_returns.json.*one episode per step"):
        plot.group_runs([run], "eval/return", references=references, one_per_step=True)
    with pytest.raises(ValueError, match="keeps only binned_returns.json.*--reference"):
        plot.group_runs([run], "eval/return")
    (run / plot.BINNED).unlink()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl does not exist"):
        plot.group_runs([run], "eval/return", references=references)


def test_bins_with_an_offset_end_where_danijar_dreamers_do():
    """danijar/dreamer's plotting.py bins from its first test at 5K: (-inf, 5K], (5K, 105K], ..."""
    ends, means = plot.bin_mean(np.array([5_000.0, 10_000, 105_000, 110_000, 330_000]),
                                np.array([1.0, 2.0, 4.0, 8.0, 16.0]), 100_000, offset=5_000)
    np.testing.assert_array_equal(ends, [5_000, 105_000, 205_000, 305_000, 405_000])
    np.testing.assert_allclose(means, [1.0, 3.0, 8.0, np.nan, 16.0])
    with pytest.raises(ValueError, match="offset 100000: expected 0 <= offset < binsize"):
        plot.bin_mean(np.array([1.0]), np.array([1.0]), 100_000, offset=100_000)


def make_score_repo(root: Path, path: str, data: bytes) -> Path:
    repo = root / "scores-repo"
    (repo / path).parent.mkdir(parents=True)
    (repo / path).write_bytes(data)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "scores"], check=True)
    return repo


def test_dreamer_v1_reference_compares_greedy_evals_in_its_offset_bins(tmp_path):
    """--make-reference on a danijar/dreamer checkout keeps, per task, the x grid every seed reached
    (5K, 105K, ...) with the seeds' mean/min/max; --reference with that file bins a run's eval/return
    (not its training returns) into those bins and tables it at the file's frames."""
    grid = [5_000.0 + 100_000 * i for i in range(7)]
    records = [{"task": "dmc_walker_walk", "method": "dreamer", "seed": str(seed), "xs": grid[:6 + (seed == 1)],
                "ys": [10.0 * (seed + 1), 40.0 * (seed + 1), 300.0 + seed, 400, 500, 600, 999][:6 + (seed == 1)]}
               for seed in range(3)]
    records.append({"task": "atari_pong", "method": "dreamer", "seed": "0", "xs": [1.0], "ys": [1.0]})
    repo = make_score_repo(tmp_path, plot.DREAMER_SCORES, json.dumps(records).encode())
    out = tmp_path / "v1.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--make-reference", str(repo), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    made = json.loads(out.read_text())
    assert (made["key"], made["binsize"], made["offset"]) == ("eval/return", 100_000, 5_000)
    assert made["source"]["repo"] == "danijar/dreamer" and len(made["source"]["commit"]) == 40
    walker = made["tasks"]["walker_walk"]
    assert list(made["tasks"]) == ["walker_walk"] and walker["seeds"] == 3
    assert walker["x"] == grid[:6]  # seed 1's seventh bin is cut: not every seed reached it
    assert walker["mean"][:3] == [20.0, 80.0, 301.0] and walker["min"][:3] == [10.0, 40.0, 300.0]
    assert walker["max"][:3] == [30.0, 120.0, 302.0] and walker["mean"][3:] == [400.0, 500.0, 600.0]

    lines = [{"step": f, "env_steps": f, "episode/return": 5000.0} for f in range(1000, 150_001, 1000)]
    lines += [{"step": f, "eval/return": f / 1000} for f in range(10_000, 150_001, 10_000)]
    run = make_dmc_run(tmp_path, "a", 0, lines)
    png = tmp_path / "v1.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(run), "--reference", str(out), "--out", str(png)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "(eval/return) vs Dreamer V1 (danijar/dreamer) test returns (3 seeds), walker_walk:" in proc.stdout
    # (5K, 105K]: evals 10..100 (mean 55); (105K, 205K]: 110..150 (mean 130), the run ends inside it
    assert re.search(r"\n +105K +55\.0 \(55\.0-55\.0\) +80\.0 \(40\.0-120\.0\)\n", proc.stdout), proc.stdout
    assert re.search(r"\n +205K +130\.0 \(130\.0-130\.0\) +301\.0 \(300\.0-302\.0\)  below the band  "
                     r"partial: a run ends at 150K\n", proc.stdout), proc.stdout
    # the file's frames: 505K is its last bin, so 1005K (at or before: 505K again) adds no row
    assert re.search(r"\n +505K +not reached\n", proc.stdout) and "1005K" not in proc.stdout


def test_make_reference_refuses_a_checkout_without_a_known_score_file(tmp_path):
    repo = make_score_repo(tmp_path, "scores/other.json", b"[]")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--make-reference", str(repo), "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--make-reference=" in proc.stderr and "danijar/dreamer (scores/dreamer.json)" in proc.stderr


# ---------------------------------------------------------------------------- one episode per step

def test_one_episode_per_step_keeps_the_last_episode_written_on_each_frame():
    """Four envs ending episodes on frame 4000 and three on 8000: the 2023 reference's logger kept one
    line per step, each name's last value, so only the last episode written on a frame survives."""
    episodes = [(4000, 10.0), (4000, 20.0), (4000, 30.0), (4000, 40.0), (6000, 5.0),
                (8000, 1.0), (8000, 2.0), (8000, 4.0), (12_000, 7.0)]
    assert plot.one_episode_per_step(episodes) == [(4000, 40.0), (6000, 5.0), (8000, 4.0), (12_000, 7.0)]


def test_one_episode_per_step_rebins_a_run_before_its_bins_are_averaged(tmp_path, capsys):
    lines = [{"step": 4000, "episode/return": r} for r in (10.0, 20.0, 30.0, 40.0)]
    lines += [{"step": 8000, "episode/return": r} for r in (1.0, 2.0, 4.0)]
    lines += [{"step": 12_000, "episode/return": 7.0}, {"step": 12_000, "episode/return": 9.0}]
    run = make_dmc_run(tmp_path, "a", 0, lines)
    references = plot.run_references([run])
    (_, every_ends, every), = plot.group_runs([run], "eval/return", references=references)[0]["runs"]
    (_, kept_ends, kept), = plot.group_runs([run], "eval/return", references=references,
                                            one_per_step=True)[0]["runs"]
    np.testing.assert_array_equal(every_ends, [10_000, 20_000])
    np.testing.assert_array_equal(every, [107 / 7, 8.0])  # all seven episodes of (0, 10K], both of (10K, 20K]
    np.testing.assert_array_equal(kept_ends, [10_000, 20_000])
    np.testing.assert_array_equal(kept, [22.0, 9.0])  # 40 on 4000, 4 on 8000; 9 on 12000
    out = tmp_path / "one.png"
    assert plot.main([str(run), "--reference", "--one-episode-per-step", "--out", str(out), "--at", "10000"]) == 0
    assert re.search(r"\n +10K +22\.0 \(22\.0-22\.0\) ", capsys.readouterr().out)
    with pytest.raises(SystemExit):
        plot.main([str(run), "--one-episode-per-step", "--out", str(out)])
    assert "give --reference too" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the reference by task

def make_task_run(root: Path, name: str, env: dict, returns: dict[int, float]) -> Path:
    run = root / name
    run.mkdir()
    config = {"seed": 0, "run_dir": str(run), "algo": {"name": "dreamer_v3"}, "env": env}
    OmegaConf.save(OmegaConf.create(config), run / "config.yaml")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": frame, "episode/return": value}) + "\n"
                                               for frame, value in returns.items()))
    return run


def test_each_run_gets_the_reference_of_its_suite_observations_and_task(tmp_path):
    """DMC proprio, DMC from pixels and Atari runs each get their own DreamerV3 reference and task in
    it, whatever the task's spelling; --reference FILE overrides the pick for every run."""
    returns = {f: 1.0 for f in range(10_000, 100_001, 10_000)}
    turn = make_task_run(tmp_path, "turn", {"suite": "dmc", "task": "finger/turn_hard", "name": "dmc-finger-turn_hard",
                                            "pixels": False}, returns)
    cup = make_task_run(tmp_path, "cup", {"suite": "dmc", "task": "ball_in_cup/catch", "name": "dmc-cup",
                                          "pixels": True}, returns)
    pacman = make_task_run(tmp_path, "pacman", {"suite": "atari", "task": "MsPacman", "name": "atari-MsPacman",
                                                "pixels": True}, returns)
    runs = [turn, cup, pacman]
    groups = plot.group_runs(runs, "eval/return", references=plot.run_references(runs))
    assert [(g["reference"]["name"], g["task"]) for g in groups] == [
        ("DreamerV3 DMC proprio (2023 scores)", "finger_turn_hard"),
        ("DreamerV3 DMC vision (2024 scores)", "ball_in_cup_catch"),
        ("DreamerV3 Atari 100K (2024 scores)", "ms_pacman")]
    atari_2023 = plot.REFERENCE_DIR / "dreamerv3_atari100k_2023.json"
    (group,) = plot.group_runs([pacman], "eval/return", references=plot.run_references([pacman], atari_2023))
    assert (group["reference"]["name"], group["task"]) == ("DreamerV3 Atari 100K (2023 scores)", "ms_pacman")


def test_a_task_outside_the_first_six_is_tabled_against_its_band(tmp_path):
    reference = json.loads(plot.REFERENCE.read_text())["tasks"]["finger_turn_hard"]
    i = reference["x"].index(100_000)
    returns = {f: 1.0 for f in range(10_000, 100_001, 10_000)}
    run = make_task_run(tmp_path, "turn", {"suite": "dmc", "task": "finger/turn_hard", "name": "turn"}, returns)
    rows = plot.reference_table(plot.group_runs([run], "eval/return", references=plot.run_references([run])),
                                frames=(100_000,))
    assert rows[0] == ("turn dreamer_v3 (episode/return) vs DreamerV3 DMC proprio (2023 scores) (5 seeds), "
                       "finger_turn_hard:")
    assert rows[2].split()[:3] == ["100K", "1.0", "(1.0-1.0)"]
    assert f"{reference['mean'][i]:.1f} ({reference['min'][i]:.1f}-{reference['max'][i]:.1f})" in rows[2]


def test_a_task_no_reference_holds_says_so_and_the_command_still_draws_every_run(tmp_path):
    returns = {f: 1.0 for f in range(10_000, 50_001, 10_000)}
    quadruped = make_task_run(tmp_path, "quadruped", {"suite": "dmc", "task": "quadruped/run", "name": "quad"}, returns)
    pendulum = make_task_run(tmp_path, "pendulum", {"suite": "gym", "task": "Pendulum-v1", "name": "pendulum"}, returns)
    pong = make_task_run(tmp_path, "pong", {"suite": "atari", "task": "pong", "name": "pong", "pixels": True}, returns)
    out = tmp_path / "mixed.png"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(quadruped), str(pendulum), str(pong), "--reference",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ("quad dreamer_v3: no reference for task 'quadruped/run' in DreamerV3 DMC proprio (2023 scores) "
            "(it has acrobot_swingup, ") in proc.stdout
    assert "pendulum dreamer_v3: no reference for task 'Pendulum-v1' in DreamerV3 DMC proprio" in proc.stdout
    assert "pong dreamer_v3 (episode/return) vs DreamerV3 Atari 100K (2024 scores) (5 seeds), pong:" in proc.stdout


def test_make_reference_writes_one_file_per_dreamerv3_score_file_in_its_bins(tmp_path):
    """A 2023 file of 10K-frame bins (an empty bin carries the one before) and a 2024 file of one x
    per episode (binned here, carried past a seed's last episode, from the first bin every seed has)."""
    binned = [{"task": "dmc_cup_catch", "method": "dreamerv3", "seed": str(seed),
               "xs": [10_000.0, 20_000.0, 30_000.0], "ys": [1.0 + seed, float("nan"), 5.0]} for seed in range(2)]
    repo = make_score_repo(tmp_path, "scores/data/dmcproprio_dreamerv3.json.gz",
                           gzip.compress(json.dumps(binned).encode()))
    episodes = [{"task": "atari_up_n_down", "method": "dreamerv3", "seed": 0, "xs": [5000, 15_000, 38_000],
                 "ys": [1, 3, 9]},
                {"task": "atari_up_n_down", "method": "dreamerv3", "seed": 1, "xs": [12_000, 25_000], "ys": [2, 4]}]
    (repo / "scores" / "atari100k-dreamerv3.json.gz").write_bytes(gzip.compress(json.dumps(episodes).encode()))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    first = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([*git, "rm", "-q", "scores/data/dmcproprio_dreamerv3.json.gz"], check=True)  # as 2411f7d moved it
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "2024 scores"], check=True)
    out = tmp_path / "refs"
    assert plot.main(["--make-reference", str(repo), "--commit", first, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["dreamerv3_dmc_proprio.json"]  # the 2024 file is not at `first`
    assert plot.main(["--make-reference", str(repo), "--out", str(out)]) == 0
    proprio = json.loads((out / "dreamerv3_dmc_proprio.json").read_text())
    assert proprio["source"]["read_at"] == first and proprio["binsize"] == 10_000
    assert proprio["tasks"] == {"ball_in_cup_catch": {"seeds": 2, "x": [10_000, 20_000, 30_000],
                                                      "mean": [1.5, 1.5, 5.0], "min": [1.0, 1.0, 5.0],
                                                      "max": [2.0, 2.0, 5.0]}}
    atari = json.loads((out / "dreamerv3_atari100k.json").read_text())
    assert atari["name"] == "DreamerV3 Atari 100K (2024 scores)" and atari["at"] == [100_000, 200_000, 400_000]
    # seed 0: 1 | 3 | (3) | 9; seed 1: - | 2 | 4 | (4): from 20K, where both have a return
    assert atari["tasks"] == {"up_n_down": {"seeds": 2, "x": [20_000, 30_000, 40_000], "mean": [2.5, 3.5, 6.5],
                                            "min": [2.0, 3.0, 4.0], "max": [3.0, 4.0, 9.0]}}
    with pytest.raises(SystemExit):
        plot.main(["--make-reference", str(repo), "--out", str(tmp_path / "one.json")])
