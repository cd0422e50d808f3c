"""Tests of agent/replay/prioritized.py and prioritized sampling in both buffers: the sum
tree against brute force, sampling in proportion to priority, importance weights, new
transitions at the largest priority, state, devices."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from agent.replay import FrameReplayBuffer, PrioritizedSampler, ReplayBuffer, SumTree
from agent.replay.prioritized import annealed_beta
from conftest import DEVICES

# --------------------------------------------------------------------------- sum tree


@pytest.mark.parametrize("capacity,branching", [(1, 2), (7, 2), (100, 4), (1000, 64), (4097, 16)])
def test_sum_tree_totals_and_finds_as_brute_force_does(capacity: int, branching: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity, branching)
    values = np.zeros(capacity)
    for _ in range(20):  # random writes, some of them zeros, some indices repeated
        idx = rng.integers(0, capacity, size=rng.integers(1, 40))
        new = rng.random(len(idx)) * (rng.random(len(idx)) > 0.2)
        tree.set(idx, new)
        for i, v in zip(idx, new, strict=True):  # the last write of a repeated index wins
            values[i] = v
        assert tree.total == pytest.approx(values.sum(), rel=1e-12, abs=1e-12)
        np.testing.assert_array_equal(tree.leaves, values)
        if values.sum() == 0:
            continue
        targets = rng.random(64) * values.sum()
        found = tree.find(targets)
        # Brute force: the first leaf whose cumulative sum passes the target.
        expected = np.searchsorted(np.cumsum(values), targets, side="right")
        np.testing.assert_array_equal(found, expected)
        assert (values[found] > 0).all()


def test_sum_tree_never_finds_an_empty_leaf_at_the_edges() -> None:
    tree = SumTree(10, 2)
    tree.set(np.array([2, 5]), np.array([1.0, 3.0]))
    # The total itself and beyond (rounding can carry a target there) land on the last
    # leaf with mass; zero lands on the first.
    found = tree.find(np.array([0.0, 4.0, 4.0 + 1e-9, 1.0]))
    np.testing.assert_array_equal(found, [2, 5, 5, 5])


def test_sum_tree_state_round_trip() -> None:
    tree = SumTree(300, 8)
    tree.set(np.arange(0, 300, 3), np.linspace(0.1, 2.0, 100))
    other = SumTree(300, 8)
    other.load_state_dict(tree.state_dict())
    assert other.total == tree.total
    targets = np.linspace(0, tree.total * 0.999, 50)
    np.testing.assert_array_equal(other.find(targets), tree.find(targets))
    with pytest.raises(ValueError, match="leaves"):
        SumTree(200).load_state_dict(tree.state_dict())


# --------------------------------------------------------------------------- the sampler


def test_sampling_frequencies_are_proportional_to_priority_to_the_alpha() -> None:
    sampler = PrioritizedSampler(8, alpha=0.5, eps=1e-6)
    sampler.store(np.arange(8))
    errors = torch.tensor([1.0, 4.0, 9.0, 16.0, 0.0, 25.0, 36.0, 49.0], dtype=torch.float64)
    sampler.update(np.arange(8), errors)
    p = (errors.numpy() + 1e-6) ** 0.5
    expected = p / p.sum()
    generator = torch.Generator().manual_seed(0)
    draws = 4000
    counts = np.zeros(8)
    for _ in range(draws // 32):
        slots, _ = sampler.sample(32, generator, beta=1.0)
        counts += np.bincount(slots, minlength=8)
    freq = counts / counts.sum()
    # Binomial standard errors: every frequency within 4 of them (seeded: no flakes).
    se = np.sqrt(expected * (1 - expected) / counts.sum())
    assert (np.abs(freq - expected) <= 4 * se + 1e-9).all(), (freq, expected)
    assert counts[4] < 0.002 * counts.sum()  # |error| 0: practically never drawn


def test_importance_weights_are_normalised_by_the_batch_maximum() -> None:
    sampler = PrioritizedSampler(4, alpha=1.0)
    sampler.store(np.arange(4))
    sampler.update(np.arange(4), torch.tensor([1.0, 2.0, 4.0, 8.0]))
    generator = torch.Generator().manual_seed(1)
    slots, weights = sampler.sample(64, generator, beta=0.5)
    p = sampler.tree.leaves[slots]
    # (N P(i))^-beta / max_j (N P(j))^-beta
    n, total = 4, sampler.tree.total
    raw = (n * p / total) ** -0.5
    np.testing.assert_allclose(weights, raw / raw.max(), rtol=1e-12)
    assert weights.max() == 1.0 and (weights > 0).all()
    _, flat = sampler.sample(64, generator, beta=0.0)
    assert (flat == 1.0).all()


def test_new_transitions_enter_at_the_largest_priority_seen() -> None:
    sampler = PrioritizedSampler(6, alpha=0.5, eps=0.01)
    sampler.store(np.array([0, 1]))
    assert sampler.tree.leaves[0] == 1.0  # the start: priority 1
    sampler.update(np.array([0, 1]), torch.tensor([3.0, 0.5]))
    assert sampler.max_priority == pytest.approx(3.01)
    sampler.store(np.array([2]))
    assert sampler.tree.leaves[2] == pytest.approx(3.01**0.5)
    sampler.drop(np.array([1]))
    assert sampler.tree.leaves[1] == 0.0


def test_non_finite_errors_do_not_poison_the_tree() -> None:
    sampler = PrioritizedSampler(3, alpha=0.5)
    sampler.store(np.arange(3))
    sampler.update(np.arange(3), torch.tensor([float("nan"), float("inf"), 2.0]))
    assert np.isfinite(sampler.tree.total)
    slots, weights = sampler.sample(16, torch.Generator().manual_seed(0), beta=1.0)
    assert np.isfinite(weights).all() and set(slots) <= {0, 1, 2}


def test_sampler_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="alpha"):
        PrioritizedSampler(4, alpha=0.0)
    with pytest.raises(ValueError, match="eps"):
        PrioritizedSampler(4, alpha=0.5, eps=0.0)
    empty = PrioritizedSampler(4, alpha=0.5)
    with pytest.raises(ValueError, match="no stored transition"):
        empty.sample(2, None, beta=1.0)


def test_beta_is_annealed_linearly_to_one() -> None:
    assert annealed_beta(0.4, 0.0) == 0.4
    assert annealed_beta(0.4, 0.5) == pytest.approx(0.7)
    assert annealed_beta(0.4, 1.0) == 1.0
    assert annealed_beta(0.4, 3.0) == 1.0


# --------------------------------------------------------------------------- in the buffers


def _fill(buf: ReplayBuffer, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    e = buf.num_envs
    for _ in range(steps):
        obs = rng.standard_normal((e, 3)).astype(np.float32)
        buf.add(obs, rng.integers(0, 2, e), rng.standard_normal(e).astype(np.float32),
                obs + 1, np.zeros(e, bool), np.zeros(e, bool))  # fmt: skip


def test_a_prioritized_buffer_samples_stored_slots_with_weights_and_learns_priorities() -> None:
    buf = ReplayBuffer(50, (3,), np.float32, device="cpu", num_envs=2, alpha=1.0)
    assert buf.prioritized and buf.generator_device.type == "cpu"
    _fill(buf, 10)  # 20 of 50 slots written
    batch = buf.sample(16, torch.Generator().manual_seed(0), beta=0.4)
    assert batch.weights is not None and batch.weights.dtype == torch.float32
    assert (batch.indices < 20).all()
    # Everything at the same (largest) priority so far: uniform, every weight 1.
    assert torch.equal(batch.weights, torch.ones(16))
    # One transition's error dwarfs the rest: it dominates the next batch.
    chosen = batch.indices[0]
    errors = torch.where(batch.indices == chosen, 100.0, 1e-3)
    buf.update_priorities(batch.indices, errors)
    buf.update_priorities(torch.arange(20), torch.where(torch.arange(20) == chosen, 100.0, 1e-3))
    again = buf.sample(16, torch.Generator().manual_seed(1), beta=0.4)
    assert (again.indices == chosen).float().mean() > 0.9
    assert (again.weights[again.indices == chosen] == again.weights.min()).all()  # common: least
    # The rows are the stored rows at those slots.
    plain = buf.gather(again.indices)
    assert torch.equal(again.obs, plain.obs) and torch.equal(again.rewards, plain.rewards)


def test_overwritten_slots_come_back_at_the_largest_priority() -> None:
    buf = ReplayBuffer(8, (3,), np.float32, device="cpu", alpha=1.0)
    _fill(buf, 8)
    buf.update_priorities(torch.arange(8), torch.full((8,), 1e-3))
    buf.update_priorities(torch.tensor([3]), torch.tensor([5.0]))
    _fill(buf, 2, seed=1)  # overwrites slots 0 and 1
    leaves = buf.priorities.tree.leaves
    assert leaves[0] == leaves[1] == pytest.approx(5.0, rel=1e-5)
    assert leaves[2] == pytest.approx(1e-3 + 1e-6, rel=1e-6)  # |error| + eps


def test_a_uniform_buffer_ignores_priorities_and_returns_no_weights() -> None:
    buf = ReplayBuffer(50, (3,), np.float32, device="cpu")
    _fill(buf, 10)
    batch = buf.sample(8, torch.Generator().manual_seed(0))
    assert batch.weights is None and not buf.prioritized
    buf.update_priorities(batch.indices, torch.ones(8))  # a no-op
    assert "priorities" not in buf.state_dict()


def test_priorities_resume_exactly() -> None:
    def build() -> ReplayBuffer:
        return ReplayBuffer(40, (3,), np.float32, device="cpu", n_step=2, alpha=0.6)

    a = build()
    _fill(a, 30)
    batch = a.sample(16, torch.Generator().manual_seed(0), beta=0.5)
    a.update_priorities(batch.indices, torch.linspace(0, 3, 16))
    blob = io.BytesIO()
    torch.save(a.state_dict(), blob)
    blob.seek(0)
    b = build()
    b.load_state_dict(torch.load(blob, weights_only=True))
    for _ in range(3):
        x = a.sample(16, torch.Generator().manual_seed(5), beta=0.5)
        y = b.sample(16, torch.Generator().manual_seed(5), beta=0.5)
        assert torch.equal(x.indices, y.indices) and torch.equal(x.weights, y.weights)
        a.update_priorities(x.indices, x.rewards.abs())
        b.update_priorities(y.indices, y.rewards.abs())
    assert b.priorities.max_priority == a.priorities.max_priority
    uniform = ReplayBuffer(40, (3,), np.float32, device="cpu", n_step=2)
    with pytest.raises(ValueError, match="saved with priorities"):
        uniform.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="alpha"):
        ReplayBuffer(40, (3,), np.float32, device="cpu", n_step=2, alpha=0.5).load_state_dict(
            a.state_dict()
        )


def test_frame_replay_never_samples_a_dropped_transition() -> None:
    from envs.testing import make_frames_env

    env = make_frames_env(stack=4, size=12)
    env.reset(seed=0)
    buf = FrameReplayBuffer(120, (4, 12, 12), np.uint8, device="cpu", n_step=2, alpha=0.5)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(400):  # the ring wraps several times
        action = int(rng.integers(0, env.action_space.n))
        nxt, r, term, trunc, _ = env.step(action)
        buf.add(obs[None], np.array([action]), np.array([r], np.float32), nxt[None],
                np.array([term]), np.array([trunc]))  # fmt: skip
        obs = env.reset()[0] if term or trunc else nxt
        if len(buf) >= 8:
            batch = buf.sample(8, torch.Generator().manual_seed(len(buf)), beta=0.5)
            assert np.isin(batch.indices.numpy(), buf.stored_slots().numpy()).all()
            buf.update_priorities(batch.indices, torch.rand(8))
    # Exactly the slots that hold a transition have a priority.
    with_priority = np.flatnonzero(buf.priorities.tree.leaves > 0)
    np.testing.assert_array_equal(with_priority, buf.stored_slots().numpy())


@pytest.mark.parametrize("device", [*DEVICES, "meta"])
@pytest.mark.parametrize("float_dtype", [torch.float32, torch.float64])
def test_weights_arrive_on_the_batch_device_in_the_float_dtype(
    device: str, float_dtype: torch.dtype
) -> None:
    buf = ReplayBuffer(20, (3,), np.float32, device=device, alpha=0.5, float_dtype=float_dtype)
    _fill(buf, 6)
    batch = buf.sample(4, torch.Generator().manual_seed(0))
    assert batch.weights.device.type == device and batch.weights.dtype == float_dtype
    assert batch.indices.device.type == "cpu"  # where the sum tree drew them


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("storage", ["cpu", "cuda"])
def test_cuda_errors_reach_the_tree_without_a_host_read_in_update(storage: str) -> None:
    buf = ReplayBuffer(20, (3,), np.float32, device="cuda", storage_device=storage, alpha=1.0)
    _fill(buf, 10)
    batch = buf.sample(8, torch.Generator().manual_seed(0))
    assert batch.obs.device.type == "cuda" and batch.weights.device.type == "cuda"
    errors = torch.full((8,), 7.0, device="cuda")
    buf.update_priorities(batch.indices, errors)  # enqueued, read at the next sample
    buf.sample(8, torch.Generator().manual_seed(1))
    assert buf.priorities.max_priority == pytest.approx(7.0, rel=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_many_cuda_updates_before_a_sample_are_all_applied_in_order() -> None:
    sampler = PrioritizedSampler(8, alpha=1.0, eps=1e-9)
    sampler.store(np.arange(8))
    for value in range(1, 6):  # more updates in flight than staging sets
        sampler.update(np.array([value % 8]), torch.tensor([float(value)], device="cuda"))
    sampler.update(np.array([1]), torch.tensor([9.0], device="cuda"))  # slot 1 again: last wins
    sampler.flush()
    np.testing.assert_allclose(sampler.tree.leaves[1:6], [9.0, 2.0, 3.0, 4.0, 5.0], rtol=1e-6)
