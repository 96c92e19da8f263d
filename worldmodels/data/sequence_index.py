"""`SequenceIndex`: where a ring storage holds T consecutive steps of one trajectory, kept up to
date in O(steps written) and sampled uniformly over those sequences.

Contract. A storage of `capacity` slots holds single steps, each tagged with a trajectory id and
its position in that trajectory (`Replay`: an episode and its step index, or an env's stream and
its position in it). Whoever writes steps calls `link(slots [n], trajectory [n], position [n])`
with the slots it wrote and the keys of what it wrote there (any slots, any order within a call).
A step is linked to its predecessor (same trajectory, position - 1) when that step was written in
the same call, or is the latest step written to the trajectory by an earlier call and still
stored. Trajectories are expected to arrive in position order across calls, as a collector writes
them: a step written in a call before its predecessor's stays unlinked (it starts no sequence
that reaches back past it).

`sample(count, size, trajectory_column, position_column)` returns slots [count, T] (int64, time
order along dim 1): each row T steps of one trajectory at consecutive positions, drawn uniformly
with replacement over all such sequences stored. Each sequence has exactly one last step, so the
sampler draws last slots uniformly over the filled slots [0, size) (`torch.randint`: the global
RNG, so `torch.manual_seed` makes a draw reproducible) and keeps a draw only if the T - 1 links
back from it exist and every slot of that walk still holds the expected (trajectory, position -
k), read from the storage's own trajectory / position columns [capacity]: a link to a slot that
a later step overwrote is refused there (rejection sampling, uniform over sequences, not over
trajectories). When no such sequence is stored it raises a RuntimeError that says so.
`sequences(size, trajectory_column, position_column)` lists every sequence `sample` can draw (for
checks: it walks back from every filled slot).

State (numpy arrays on the host: each small gather costs a few times less than torch's):
`prev` [capacity + 1] int64, per slot the slot of its linked predecessor, or `capacity` (a
sentinel slot that links to itself) where there is none; `run` [capacity + 1] int32, the length of
the linked chain ending at each slot when it was written, capped at T (0 at the sentinel);
`stamp` [capacity] int64, the number of the `link` call that last wrote each slot (-1: never),
which tells whether a slot still holds what an earlier call wrote; and `latest`, a dict trajectory
-> (position, slot, stamp) of the latest step written to each trajectory. `latest` is pruned of
the entries whose slot was overwritten every `capacity` steps written, so it holds at most one
entry per stored step plus one per step written since the last prune. `full` counts the slots
whose chain reached T when written and that were not overwritten since: an upper bound of the
stored sequences (a chain can lose its first steps to the ring later), 0 only when none is
stored. A round of `sample` draws about 1.9 x count candidates, then 1.25 x the missing / the
share accepted so far (4x more each round while none is): one round when most slots end a
sequence (episodes much longer than T), a few when few do.

Costs: `link` O(n log n) in the n steps written (a sort of the call's steps; Python touches each
distinct trajectory of the call once, to look up and set its `latest` entry; a call of one step, one
env's write, takes a scalar path with the same effect); `sample` T - 1
gathers of the candidate draws through `prev` and two gathers of [candidates, T] from the
columns; nothing grows with the number of steps stored (`benchmarks/replay_sample.py` measures it).
"""

from __future__ import annotations

from itertools import repeat

import numpy as np
import torch

ROUND_MAX = 1 << 14  # most candidate draws walked at once (the walk holds [ROUND_MAX, T] slots)
NO_ENTRY = (-(1 << 62), 0, -2)  # a `latest` lookup's default: a position nothing follows, a stamp no slot has


class SequenceIndex:
    """Links between the stored steps of each trajectory, and a uniform sampler of T-step sequences.

    Args:
        capacity: storage slots (ids 0 .. capacity - 1), >= 1.
        seq_len: steps per sampled sequence (T), >= 1.
    """

    def __init__(self, capacity: int, seq_len: int):
        if capacity < 1 or seq_len < 1:
            raise ValueError(f"SequenceIndex needs capacity >= 1 and seq_len >= 1, got {capacity}, {seq_len}")
        self.capacity, self.seq_len = capacity, seq_len
        self.clear()

    def clear(self) -> None:
        """Forget every link (the storage was emptied)."""
        none = self.capacity
        self.prev = np.full(none + 1, none, dtype=np.int64)
        self.run = np.zeros(none + 1, dtype=np.int32)
        self.stamp = np.full(none, -1, dtype=np.int64)
        self.latest: dict[int, tuple[int, int, int]] = {}
        self.calls = 0  # `link` calls so far: the stamp of the last one
        self.full = 0
        self._since_prune = 0

    def ready(self) -> bool:
        """False when no sequence of T linked steps is stored (True: one may be, see the module docstring)."""
        return self.full > 0

    def link(self, slots: torch.Tensor, trajectory: torch.Tensor, position: torch.Tensor) -> None:
        """Record that `slots` [n] now hold the steps (`trajectory` [n], `position` [n]), in any order;
        link each to its predecessor (module docstring). Slots written twice in one call (a ring that
        wrapped within it): the call's last `capacity` entries are the ones kept."""
        if all(isinstance(x, torch.Tensor) and x.numel() == 1 for x in (slots, trajectory, position)):
            return self._link_one(int(slots), int(trajectory), int(position))
        slots, trajectory, position = _array(slots), _array(trajectory), _array(position)
        if not slots.size == trajectory.size == position.size:
            raise ValueError(f"link: {slots.size} slots, {trajectory.size} trajectory ids and "
                             f"{position.size} positions")
        if slots.size > self.capacity:
            slots, trajectory, position = slots[-self.capacity:], trajectory[-self.capacity:], position[-self.capacity:]
        n, none, T = slots.size, self.capacity, self.seq_len
        if n == 0:
            return
        if slots.min() < 0 or slots.max() >= none:
            raise ValueError(f"link: slots must lie in [0, {none}), got {slots.min()} .. {slots.max()}")
        self.calls += 1
        self.full -= int(np.count_nonzero(self.run[slots] >= T))  # what the slots held drops out
        self.stamp[slots] = self.calls

        order = np.lexsort((position, trajectory))  # by trajectory, then position (stable)
        s, t, p = slots[order], trajectory[order], position[order]
        same = t[1:] == t[:-1]
        follows = np.zeros(n, dtype=bool)  # its predecessor is the entry before it
        follows[1:] = same & (p[1:] == p[:-1] + 1)
        prev = np.full(n, none, dtype=np.int64)
        prev[1:] = np.where(follows[1:], s[:-1], none)
        if self.latest:  # a trajectory's first entry of the call links to its latest step before, if still stored
            at = np.flatnonzero(np.concatenate(([True], ~same)))
            entry = np.array([self.latest.get(k, NO_ENTRY) for k in t[at].tolist()], dtype=np.int64).reshape(-1, 3)
            live = (entry[:, 0] == p[at] - 1) & (self.stamp[entry[:, 1]] == entry[:, 2])
            prev[at] = np.where(live, entry[:, 1], none)
        self.prev[s] = prev

        # chain lengths: within each stretch of consecutive positions, count up from the run its first step links to
        begins = np.flatnonzero(~follows)
        base = self.run[prev[begins]].astype(np.int64) + 1 - begins  # the run at entry i of a stretch: base + i
        run = np.minimum(base[np.cumsum(~follows) - 1] + np.arange(n), T)
        self.run[s] = run
        self.full += int(np.count_nonzero(run >= T))

        at = np.flatnonzero(np.concatenate((~same, [True])))  # each trajectory's last entry
        self.latest.update(zip(t[at].tolist(), zip(p[at].tolist(), s[at].tolist(), repeat(self.calls))))
        self._since_prune += n
        if self._since_prune >= self.capacity:
            self._prune()

    def _link_one(self, slot: int, trajectory: int, position: int) -> None:
        """`link` of a single step (one env's write, every agent step), in scalar code: the same state
        changes as the vectorised path, at a fraction of its host time."""
        none, T = self.capacity, self.seq_len
        if not 0 <= slot < none:
            raise ValueError(f"link: slots must lie in [0, {none}), got {slot}")
        self.calls += 1
        if self.run[slot] >= T:  # what the slot held drops out
            self.full -= 1
        self.stamp[slot] = self.calls
        at, prev, stamp = self.latest.get(trajectory, NO_ENTRY)
        if at != position - 1 or self.stamp[prev] != stamp:
            prev = none
        self.prev[slot] = prev
        run = min(int(self.run[prev]) + 1, T)
        self.run[slot] = run
        self.full += run >= T
        self.latest[trajectory] = (position, slot, self.calls)
        self._since_prune += 1
        if self._since_prune >= self.capacity:
            self._prune()

    def _prune(self) -> None:
        """Drop the `latest` entries whose slot was overwritten since (their trajectory links to nothing)."""
        self._since_prune = 0
        if not self.latest:
            return
        entries = np.array(list(self.latest.values()), dtype=np.int64)
        live = (self.stamp[entries[:, 1]] == entries[:, 2]).tolist()
        self.latest = {k: v for (k, v), keep in zip(self.latest.items(), live) if keep}

    def sample(self, count: int, size: int, trajectory_column: torch.Tensor,
               position_column: torch.Tensor) -> torch.Tensor:
        """Slots [count, T] of `count` sequences drawn uniformly among those stored in the filled slots
        [0, `size`); `trajectory_column`, `position_column` [capacity]: the keys the storage holds now."""
        if count < 1:
            raise ValueError(f"sample: count={count} must be >= 1")
        if size < 1 or self.full == 0:
            raise self._none_stored(size)
        # draws sized by this call's own acceptance so far (not by `full`, which depends on the order the
        # steps came in): the same stored steps and RNG state give the same batch, e.g. after save/load
        rate = 2 / 3
        found, missing, drawn, budget = [], count, 0, 20 * size + 1000
        while missing:
            n = min(ROUND_MAX, int(missing / rate * 1.25) + 8)
            slots, ok = self._walk(torch.randint(size, (n,)).numpy(), trajectory_column, position_column)
            kept = slots[ok][:missing]
            found.append(kept)
            missing -= kept.shape[0]
            drawn += n
            accepted = count - missing
            if missing and not accepted and drawn >= budget:  # P(no draw hits a stored sequence) < e^-20
                raise self._none_stored(size)
            rate = accepted / drawn if accepted else rate / 4
        return torch.from_numpy(np.concatenate(found))

    def sequences(self, size: int, trajectory_column: torch.Tensor, position_column: torch.Tensor) -> torch.Tensor:
        """Slots [m, T] of every sequence `sample` can draw from the filled slots [0, `size`), ordered by
        last slot (O(size x T): for checks and tests, not for a training loop)."""
        found = [np.zeros((0, self.seq_len), dtype=np.int64)]
        for start in range(0, size, ROUND_MAX):
            slots, ok = self._walk(np.arange(start, min(size, start + ROUND_MAX)), trajectory_column, position_column)
            found.append(slots[ok])
        return torch.from_numpy(np.concatenate(found))

    def _walk(self, ends: np.ndarray, trajectory_column: torch.Tensor,
              position_column: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(slots [n, T] in time order, ok [n]): the T - 1 links back from each of `ends` [n], and whether
        they all exist and the slots still hold one trajectory at consecutive positions."""
        T, none = self.seq_len, self.capacity
        walk = np.empty((T, ends.size), dtype=np.int64)  # numpy: ~4x less overhead than torch per small gather
        walk[-1] = ends
        for k in range(T - 2, -1, -1):
            walk[k] = self.prev[walk[k + 1]]
        slots = np.ascontiguousarray(walk.T)  # the sentinel past a missing link, and from there on back
        at = torch.from_numpy(np.minimum(slots, none - 1).reshape(-1))  # (a walk that met the sentinel is refused)
        traj = trajectory_column.index_select(0, at).numpy().reshape(slots.shape)
        pos = position_column.index_select(0, at).numpy().reshape(slots.shape)
        back = np.arange(T - 1, -1, -1)  # how far each step lies before the last
        ok = (slots[:, 0] != none) & (traj == traj[:, -1:]).all(1) & (pos + back == pos[:, -1:]).all(1)
        return slots, ok

    def _none_stored(self, size: int) -> RuntimeError:
        return RuntimeError(f"no sequence of {self.seq_len} consecutive steps of one trajectory is stored "
                            f"(among {size} steps): every stored episode or stream is shorter than seq_len, "
                            f"or has lost its first steps to the ring buffer")


def _array(values) -> np.ndarray:
    """The values of a tensor (any device, any integer dtype) as a flat int64 numpy array on the host."""
    if isinstance(values, torch.Tensor):
        return values.detach().reshape(-1).to("cpu", torch.long).numpy()
    return np.asarray(values, dtype=np.int64).reshape(-1)


__all__ = ["SequenceIndex"]
