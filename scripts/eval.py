"""Evaluate a trained run: `python scripts/eval.py run_dir=<run> [episodes=10] [video=true] [sample=false]`.

Loads the run's newest complete checkpoint (`worldmodels.load`, on `device`, cpu by default: a
run trained on a GPU evaluates on a CPU), runs `episodes` episodes at once on fresh env seeds
(never the training or in-training eval seeds) with the greedy policy (`sample=true`: sampled
actions), prints the mean and std of the returns, and writes into the run's `media/`:
- `eval.json`: the returns, their mean and std, the env, the checkpoint and its env step, the settings;
- with `video=true`, `eval-<checkpoint>.mp4` (where an mp4 encoder, imageio-ffmpeg or PyAV, is
  installed; else `.gif`): every episode in a grid, rendered frames for state envs, the
  observed frames for pixel envs. Finished episodes hold their last frame.
A progress bar on stderr counts the agent steps (out of an episode's, where the env's time limit
tells), then a line says the video is being written; torchrl's INFO lines and gymnasium's
"precision lowered" warnings are silenced (worldmodels/train/logger.py: `quiet_third_party`).

Arguments are key=value (as for scripts/train.py): run_dir (required), episodes, video, sample,
seed (default: the run's seed + 20000), device, fps, trust_code.

A run directory runs no code it names: where its config names code to build the env (a custom
`env.entry`), eval refuses it unless given `trust_code=true` (worldmodels/train/trust.py).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

ARGS = {"run_dir": None, "episodes": 10, "video": True, "sample": False, "seed": None, "device": "cpu", "fps": 15,
        "trust_code": False}
"""key -> default (None for run_dir: required; for seed: the run's seed + 20000)."""
FRESH_SEED = 20_000  # training envs use the run's seed, its in-training eval envs seed + 10000


class ArgError(ValueError):
    """A bad command-line argument; the message names it."""


def _bool(key: str, text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise ArgError(f"{key}={text!r} must be true or false")


def _int(key: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgError(f"{key}={text!r} must be an int >= {minimum}") from None
    if value < minimum:
        raise ArgError(f"{key}={value} must be an int >= {minimum}")
    return value


def parse_args(argv: list[str]) -> dict:
    """key=value arguments -> settings (ARGS' defaults filled in); raises ArgError naming the argument."""
    given = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep:
            raise ArgError(f"argument {arg!r} must be key=value, e.g. run_dir=runs/my-run")
        if key not in ARGS:
            close = difflib.get_close_matches(key, ARGS, n=3)
            hint = f"did you mean {close}? " if close else ""
            raise ArgError(f"unknown argument {key!r}; {hint}valid: {sorted(ARGS)}")
        given[key] = value
    if "run_dir" not in given:
        raise ArgError("run_dir=<run directory> is required")
    args = {**ARGS, **given}
    args["episodes"] = _int("episodes", str(args["episodes"]), 1)
    args["fps"] = _int("fps", str(args["fps"]), 1)
    args["video"] = _bool("video", str(args["video"]))
    args["sample"] = _bool("sample", str(args["sample"]))
    args["trust_code"] = _bool("trust_code", str(args["trust_code"]))
    if args["seed"] is not None:
        args["seed"] = _int("seed", str(args["seed"]), 0)
    return args


def _mp4_encoder() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in ("imageio_ffmpeg", "av"))


def video_grid(frames: list[torch.Tensor], running: list[torch.Tensor]) -> np.ndarray:
    """Per-step frames [N, C, H, W] uint8 with running masks [N] -> [T, rows*H', cols*W', 3]
    uint8: the N episodes tiled, each holding its last frame once it ended (grayscale -> RGB;
    tiles smaller than 128 px are enlarged by pixel repetition when there are few)."""
    last = frames[0].clone()
    out = []
    for frame, alive in zip(frames, running):
        last[alive] = frame[alive]
        out.append(last.clone())
    video = torch.stack(out)  # [T, N, C, H, W]
    if video.shape[2] == 1:
        video = video.expand(-1, -1, 3, -1, -1)
    t, n, c, h, w = video.shape
    scale = max(1, 128 // h) if n <= 4 else 1
    video = video.repeat_interleave(scale, -2).repeat_interleave(scale, -1)
    h, w = h * scale, w * scale
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    pad = torch.zeros(t, rows * cols - n, c, h, w, dtype=video.dtype)
    grid = torch.cat([video, pad], 1).reshape(t, rows, cols, c, h, w)
    return grid.permute(0, 1, 4, 2, 5, 3).reshape(t, rows * h, cols * w, c).numpy()


def write_video(video: np.ndarray, stem: Path, fps: int) -> Path:
    """[T, H, W, 3] uint8 -> `stem`.mp4 (with an mp4 encoder installed) or `stem`.gif."""
    import imageio.v3 as iio

    from worldmodels.train.video import save_gif

    stem.parent.mkdir(parents=True, exist_ok=True)
    if _mp4_encoder():
        path = stem.with_suffix(".mp4")
        iio.imwrite(path, video, fps=fps, codec="libx264", macro_block_size=1)
    else:
        path = save_gif(torch.from_numpy(video).permute(0, 3, 1, 2), stem.with_suffix(".gif"), fps=fps)
    return path


def _frame_key(td, obs_key) -> str | None:
    """Where the video frames are: rendered "pixels", else the first image observation."""
    keys = obs_key if isinstance(obs_key, list) else [obs_key]
    for key in ["pixels", *keys]:
        if key in td.keys(True, True) and td[key].dtype == torch.uint8 and td[key].dim() == 4:
            return key
    return None


def episode_steps(env_cfg) -> int | None:
    """An episode's agent steps and its reset (`env.time_limit`, else the task's frames / action repeat),
    None where neither tells: the progress bar's total."""
    from worldmodels.envs import resolve_env, suites

    if env_cfg.get("time_limit") is not None:
        return env_cfg.time_limit + 1
    suite, task = resolve_env(env_cfg)
    frames = suites.get(suite).episode_frames(task)
    return None if frames is None else frames // env_cfg.get("action_repeat", 1) + 1


def evaluate_run(run_dir: str | Path, episodes: int = 10, video: bool = True, sample: bool = False,
                 seed: int | None = None, device: str = "cpu", fps: int = 15, trust_code: bool = False) -> dict:
    """Evaluate the newest checkpoint of `run_dir` (see the module docstring); returns what
    eval.json holds. Raises `UntrustedCodeError` where the run's env names code and not `trust_code`."""
    import worldmodels
    from worldmodels.data import evaluate
    from worldmodels.envs import make_env
    from worldmodels.train.checkpoint import Checkpoints, step_of
    from worldmodels.train.trust import check_trusted

    run_dir = Path(run_dir)
    agent = worldmodels.load(run_dir, device=device, trust_code=trust_code)
    cfg, info = agent.run_config, agent.env_info
    checkpoint = Checkpoints(run_dir / "checkpoints").latest()
    check_trusted(cfg, trust_code, str(checkpoint / "state.pt"), "trust_code=true to scripts/eval.py")
    seed = cfg.seed + FRESH_SEED if seed is None else seed
    torch.manual_seed(seed)
    env = None
    if video:
        try:
            env = make_env(cfg.env, seed=seed, num_envs=episodes, render=True)
        except Exception as err:  # e.g. a custom env without rgb_array rendering: evaluate without rendering
            warnings.warn(f"rendering is not available for this env ({err.__class__.__name__}: {err}); "
                          "the video shows image observations only, if any", stacklevel=2)
    if env is None:
        env = make_env(cfg.env, seed=seed, num_envs=episodes)
    frames, running = [], []

    def record(td, alive):
        key = _frame_key(td, info["obs_key"])
        if key is not None:
            frames.append(td[key].cpu())
            running.append(alive)

    # on CUDA each step replays a CUDA graph, as in training (the run's `cuda_graphs` setting)
    policy = agent.policy("explore" if sample else "eval", graphed=bool(cfg.get("cuda_graphs", True)))
    with tqdm(desc=f"eval ({episodes} episodes)", total=episode_steps(cfg.env), unit="step",
              dynamic_ncols=True) as bar:
        def on_step(td, alive):
            bar.update()
            if video:
                record(td, alive)

        returns = evaluate(env, info["obs_key"], policy, on_step=on_step)
    env.close()
    media = run_dir / "media"
    name = checkpoint.name if checkpoint is not None else "latest"
    video_path = None
    if video and frames:
        print(f"writing the video of {len(frames)} frames to {media}", file=sys.stderr, flush=True)
        video_path = write_video(video_grid(frames, running), media / f"eval-{name}", fps)
    elif video:
        warnings.warn("no video: the env has no image observations and could not be rendered", stacklevel=2)
    result = {
        "run_dir": str(run_dir), "env": cfg.env.name, "checkpoint": name,
        "env_steps": step_of(checkpoint) if checkpoint else None,
        "episodes": episodes, "sample": sample, "seed": seed, "device": device,
        "returns": [float(r) for r in returns], "mean": float(np.mean(returns)), "std": float(np.std(returns)),
        "video": str(video_path) if video_path else None,
    }
    media.mkdir(parents=True, exist_ok=True)
    (media / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


USAGE = ("usage: python scripts/eval.py run_dir=<run> [episodes=10] [video=true] [sample=false] [seed=N] "
         "[device=cpu] [fps=15] [trust_code=false]")


def main(argv: list[str]) -> int:
    from worldmodels.train.checkpoint import CheckpointError
    from worldmodels.train.logger import quiet_third_party

    if any(arg in ("-h", "--help") for arg in argv):
        print(f"{__doc__}\n{USAGE}")
        return 0
    try:
        args = parse_args(argv)
    except ArgError as err:
        print(f"eval: {err}\n{USAGE}", file=sys.stderr)
        return 2
    quiet_third_party()
    try:
        result = evaluate_run(**args)
    except (FileNotFoundError, CheckpointError) as err:  # CheckpointError: unreadable, unsafe, untrusted code
        print(f"eval: {err}", file=sys.stderr)
        return 1
    mode = "sampled" if result["sample"] else "greedy"
    print(f"{result['episodes']} {mode} episodes of {result['run_dir']} ({result['checkpoint']}): "
          f"return {result['mean']:.1f} +- {result['std']:.1f}")
    video = f" and {result['video']}" if result["video"] else ""
    print(f"wrote {Path(result['run_dir']) / 'media' / 'eval.json'}{video}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
