"""Logger: metrics.jsonl always; torchrl's csv / tensorboard / wandb loggers get the same scalars
and the videos; media/ GIFs for every backend; clear errors for a missing tensorboard or bad frames."""

from __future__ import annotations

import importlib.util
import json
import warnings

import imageio.v3 as iio
import pytest
import torch
from omegaconf import OmegaConf

from worldmodels.train.logger import Logger
from worldmodels.train.video import save_gif


def logger_cfg(kind: str):
    return OmegaConf.create({"kind": kind, "project": "worldmodels-tests", "mode": "offline", "run_id": None})


def frames(t: int = 6, c: int = 3) -> torch.Tensor:
    return torch.randint(0, 256, (t, c, 16, 16), dtype=torch.uint8)


def log_some(logger: Logger) -> None:
    logger.log(100, {"train/return": -5.0, "updates": 3})
    logger.log(200, {"eval/return": -1.5, "eval/return_std": 0.5})
    logger.log(300, {"eval/return": 2.5, "eval/return_std": 0.25})


def read_jsonl(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_csv_backend_writes_step_value_files_and_the_jsonl(tmp_path):
    logger = Logger(logger_cfg("csv"), tmp_path, {"seed": 0})
    log_some(logger)
    logger.close()
    assert read_jsonl(tmp_path) == [{"step": 100, "train/return": -5.0, "updates": 3},
                                    {"step": 200, "eval/return": -1.5, "eval/return_std": 0.5},
                                    {"step": 300, "eval/return": 2.5, "eval/return_std": 0.25}]
    scalars = tmp_path / "csv" / "scalars"  # torchrl's CSVLogger: one file per key, "step,value" lines
    assert (scalars / "eval" / "return.csv").read_text().split() == ["200,-1.5", "300,2.5"]
    assert (scalars / "updates.csv").read_text().split() == ["100,3.0"]


def test_none_backend_still_writes_jsonl_and_gifs(tmp_path):
    logger = Logger(logger_cfg("none"), tmp_path, {})
    log_some(logger)
    path = logger.video(300, "eval_episode", frames(c=1))  # grayscale too
    logger.close()
    assert [r["step"] for r in read_jsonl(tmp_path)] == [100, 200, 300]
    assert path == tmp_path / "media" / "eval_episode-0000000300.gif"
    assert iio.imread(path).shape[:3] == (6, 16, 16)  # all six frames


def test_gifs_keep_distinct_frames_grey_levels_exactly_and_colours_closely(tmp_path):
    grey = frames(c=1)
    assert (iio.imread(save_gif(grey, tmp_path / "grey.gif"))[..., 0] == grey[:, 0].numpy()).all()
    y, x = torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij")
    colour = torch.stack([torch.stack([(x * 3 + t) % 256, (x // 8 + y // 8) % 2 * 200, y * 4]) for t in range(20)])
    back = torch.from_numpy(iio.imread(save_gif(colour.to(torch.uint8), tmp_path / "colour.gif"))[..., :3])
    assert back.shape == (20, 64, 64, 3)  # [T, H, W, C]: no frame merged or dropped
    error = (back.permute(0, 3, 1, 2).int() - colour).abs()
    assert error.float().mean() < 5 and error.max() < 40  # one 256-colour palette per frame


def test_csv_video_goes_to_media_and_to_torchrl_or_warns_once(tmp_path):
    logger = Logger(logger_cfg("csv"), tmp_path, {})
    if importlib.util.find_spec("torchcodec") is None:  # torchrl's CSVLogger encodes mp4 with torchcodec
        with pytest.warns(RuntimeWarning, match="without torchcodec: pip install torchcodec"):
            logger.video(10, "openloop", frames())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once, not at every video
            logger.video(20, "openloop", frames())
    else:
        logger.video(10, "openloop", frames())
        logger.video(20, "openloop", frames())
        assert sorted(p.name for p in (tmp_path / "csv" / "videos").iterdir()) == ["openloop_10.mp4", "openloop_20.mp4"]
    logger.close()
    assert sorted(p.name for p in (tmp_path / "media").iterdir()) == ["openloop-0000000010.gif",
                                                                      "openloop-0000000020.gif"]


def test_bad_frames_are_refused_naming_the_layout(tmp_path):
    logger = Logger(logger_cfg("none"), tmp_path, {})
    with pytest.raises(ValueError, match=r"uint8 \[T, C, H, W\]"):
        logger.video(1, "x", frames().float())
    with pytest.raises(ValueError, match=r"uint8 \[T, C, H, W\]"):
        logger.video(1, "x", torch.zeros(6, 16, 16, 3, dtype=torch.uint8))  # channels last
    logger.close()


def test_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"logger\.kind='carrier_pigeon'"):
        Logger(logger_cfg("carrier_pigeon"), tmp_path, {})


def test_tensorboard_missing_names_the_install(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install tensorboard"):
        Logger(logger_cfg("tensorboard"), tmp_path, {})
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before anything is written


def test_tensorboard_backend_gets_scalars_and_videos(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = Logger(logger_cfg("tensorboard"), tmp_path, {})
    log_some(logger)
    has_moviepy = importlib.util.find_spec("moviepy") is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.video(300, "eval_episode", frames())
    assert any("moviepy" in str(w.message) for w in caught) != has_moviepy
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"images": 0}).Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/return")] == [(200, -1.5), (300, 2.5)]
    assert ("eval_episode" in events.Tags()["images"]) == has_moviepy  # tensorboard stores videos as GIF images


def test_wandb_offline_backend_keeps_its_files_in_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = Logger(logger_cfg("wandb"), tmp_path, {"seed": 3})
    assert logger.backend.experiment.settings.mode == "offline"
    log_some(logger)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.video(300, "eval_episode", frames())
    has_moviepy = importlib.util.find_spec("moviepy") is not None
    assert any("moviepy" in str(w.message) for w in caught) != has_moviepy
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    if has_moviepy:
        assert list(runs[0].glob("files/media/videos/eval_episode_*.gif"))
    assert len(read_jsonl(tmp_path)) == 3


def test_pixel_run_logs_episode_and_openloop_videos_and_shows_eval_progress(tmp_path, capsys):
    from tests._train_config import run_config
    from worldmodels.train import Trainer

    cfg = run_config(tmp_path, "model=tiny", "env=pendulum", "env.pixels=true", "env.time_limit=20", "steps=96",
                     "prefill=48", "eval_every=96", "logger=csv", "progress=true")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no torchcodec: no mp4 copy in csv/videos
        Trainer(cfg).train()
    media = tmp_path / "run" / "media"
    episode = sorted(media.glob("eval_episode-*.gif"))
    assert [p.name for p in episode] == ["eval_episode-0000000096.gif"]
    assert iio.imread(episode[0]).shape == (21, 64, 64, 3)  # the reset frame, then 20 steps of eval env 0
    assert sorted(media.glob("openloop-*.gif"))
    assert "episodes running" in capsys.readouterr().err  # the eval progress line
