"""A replay on a GPU allocates its whole storage at the first add (or `load`): where that would leave
less than `GPU_HEADROOM` of the GPU's memory free, counting what other processes hold, it is refused
with the settings to change, before the storage is built and before a frameless load renders its
frames. On CPU the GPU's memory counts are faked (the check raises before anything touches CUDA);
the last test asks a real GPU."""

from __future__ import annotations

import pytest
import torch

from tests.data.test_replay import steps
from tests.data.test_replay_frames_rendered import filled, render, stored
from worldmodels.data import Replay
from worldmodels.data.replay import GPU_HEADROOM, check_gpu_room

GIB = 2**30


def fake_gpu(monkeypatch, free: float, total: float = 80, reserved: float = 0, allocated: float = 0) -> None:
    """CUDA's memory counts (GiB) as a GPU shared with other processes would give them."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free * GIB), int(total * GIB)))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int(reserved * GIB))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: int(allocated * GIB))


def bytes_per_step(steps) -> int:
    """What one stored step of these steps takes, counted here rather than by the replay's own code."""
    return sum(v.element_size() * v[0].numel() for v in steps.values(True, True))


def test_a_storage_is_refused_where_it_leaves_less_than_the_headroom_free(monkeypatch):
    fake_gpu(monkeypatch, free=40)
    room = 40 - GPU_HEADROOM * 80  # 32 GiB
    check_gpu_room(int(room * GIB) - 1, torch.device("cuda"))
    with pytest.raises(RuntimeError) as refused:
        check_gpu_room(int(room * GIB) + 1, torch.device("cuda"))
    message = str(refused.value)
    for part in ("replay.on_device=true", "32.0 GiB of cuda", "40.0 of its 80.0 GiB free", "replay.memory_gb",
                 "replay.on_device=false", "fewer runs"):
        assert part in message, (part, message)


def test_blocks_this_process_cached_but_does_not_use_count_as_free(monkeypatch):
    fake_gpu(monkeypatch, free=30, reserved=12, allocated=2)  # 10 GiB cached for reuse: 40 free in all
    check_gpu_room(31 * GIB, torch.device("cuda"))
    with pytest.raises(RuntimeError, match="40.0 of its 80.0 GiB free"):
        check_gpu_room(33 * GIB, torch.device("cuda"))


def test_the_first_add_is_refused_before_the_storage_is_built(monkeypatch):
    step = steps(0, 0, 8)
    step_bytes = bytes_per_step(step)
    fake_gpu(monkeypatch, free=1, total=1)  # 0.9 GiB of room
    replay = Replay(capacity=GIB // step_bytes, batch_size=2, seq_len=4, device="cuda")
    with pytest.raises(RuntimeError, match=r"replay\.on_device=true: the replay's storage takes 1\.0 GiB"):
        replay.add(step)
    assert replay.buffer is None
    fake_gpu(monkeypatch, free=0.5, total=1)  # 0.4 GiB of room
    capped = Replay(capacity=GIB // step_bytes, batch_size=2, seq_len=4, memory_gb=0.5, device="cuda")
    with pytest.raises(RuntimeError, match=r"takes 0\.5 GiB of cuda, which has 0\.5 of its 1\.0 GiB free"):
        capped.add(step)  # the capacity that replay.memory_gb leaves is what is asked for


def test_a_frameless_load_is_refused_before_it_renders_the_frames(monkeypatch, tmp_path):
    replay = filled()
    replay.save(tmp_path / "frameless", frames="obs", render=render)
    rendered = []
    fake_gpu(monkeypatch, free=0.001, total=1)
    back = Replay(capacity=500, batch_size=4, seq_len=5, device="cuda")
    with pytest.raises(RuntimeError, match="replay.on_device=false"):
        back.load(tmp_path / "frameless", example=stored(replay)[:1], size=len(replay),
                  render=lambda bits: rendered.append(len(bits)) or render(bits))
    assert rendered == [] and back.buffer is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="asks a real GPU how much of its memory is free "
                                                         "(the check itself runs on CPU above, the counts faked)")
def test_a_storage_larger_than_the_gpus_free_memory_is_refused_on_a_real_gpu():
    step = steps(0, 0, 8).to("cuda")
    step_bytes = bytes_per_step(step)
    free, _ = torch.cuda.mem_get_info()
    too_big = Replay(capacity=free // step_bytes + 1, batch_size=2, seq_len=4, device="cuda")
    with pytest.raises(RuntimeError, match=r"replay\.on_device=true"):
        too_big.add(step)
    small = Replay(capacity=64, batch_size=2, seq_len=4, device="cuda")
    small.add(step)
    assert len(small) == 8 and small.buffer.storage._storage["obs"].is_cuda
