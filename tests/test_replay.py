"""Tests of agent/replay/flat.py: ring storage, n-step returns, dtypes, devices, state, bad
input."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import DEVICES

from agent.replay import Batch, FrameReplayBuffer, ReplayBuffer


def _layouts() -> list:
    """(device, storage_device) pairs: a host ring for every device, plus a GPU-resident one."""
    layouts = []
    for entry in DEVICES:
        device, marks = (entry, ()) if isinstance(entry, str) else (entry.values[0], entry.marks)
        layouts.append(pytest.param(device, "cpu", marks=marks, id=f"{device}-host"))
        if device != "cpu":
            layouts.append(pytest.param(device, device, marks=marks, id=f"{device}-resident"))
    return layouts


LAYOUTS = _layouts()


def gen(storage_device: str, seed: int = 0) -> torch.Generator:
    """A generator where the buffer draws its indices."""
    return torch.Generator(device=storage_device).manual_seed(seed)


def everything(buf: ReplayBuffer) -> Batch:
    """Every stored transition, on the CPU."""
    batch = buf.gather(torch.arange(len(buf)))
    return batch.to("cpu")


# --------------------------------------------------------------------------- random episodes
@dataclass
class Steps:
    """T steps of a num_envs vector env; obs[t, e] = (e, t, noise) makes every obs unique."""

    obs: np.ndarray  # (T, E, 3) float32
    actions: np.ndarray  # (T, E) int64
    rewards: np.ndarray  # (T, E) float64
    next_obs: np.ndarray  # (T, E, 3) float32
    terminated: np.ndarray  # (T, E) bool
    truncated: np.ndarray  # (T, E) bool


def random_steps(num_envs: int, steps: int, seed: int, p_term=0.08, p_trunc=0.06) -> Steps:
    rng = np.random.default_rng(seed)
    env = np.broadcast_to(np.arange(num_envs), (steps, num_envs))
    t = np.broadcast_to(np.arange(steps)[:, None], (steps, num_envs))
    obs = np.stack([env, t, rng.normal(size=(steps, num_envs))], -1).astype(np.float32)
    next_obs = np.stack([env, t + 0.5, rng.normal(size=(steps, num_envs))], -1).astype(np.float32)
    return Steps(
        obs=obs,
        actions=rng.integers(0, 5, size=(steps, num_envs)),
        rewards=rng.normal(size=(steps, num_envs)),
        next_obs=next_obs,
        # Independent draws: some steps are both terminated and truncated.
        terminated=rng.random((steps, num_envs)) < p_term,
        truncated=rng.random((steps, num_envs)) < p_trunc,
    )


def feed(
    buf: ReplayBuffer,
    s: Steps,
    start: int = 0,
    stop: int | None = None,
    explored: np.ndarray | None = None,
) -> None:
    for t in range(start, len(s.obs) if stop is None else stop):
        buf.add(
            s.obs[t], s.actions[t], s.rewards[t], s.next_obs[t], s.terminated[t], s.truncated[t],
            None if explored is None else explored[t],
        )  # fmt: skip


def reference(
    s: Steps, n: int, gamma: float, explored: np.ndarray | None = None
) -> dict[tuple[int, int], tuple]:
    """Brute force: (env, t) -> (action, n-step return, next_obs, done, discount).

    Only windows that are finished (n steps seen, the episode ended, or the next step's
    action was ``explored``: the window then bootstraps from that step's obs) are included.
    """
    steps, num_envs = s.actions.shape
    out = {}
    for e in range(num_envs):
        ended = s.terminated[:, e] | s.truncated[:, e]
        for t in range(steps):
            k, last, cut = 0, None, False
            while k < n and t + k < steps:
                if k > 0 and explored is not None and explored[t + k, e]:
                    cut = True
                    break
                last = t + k
                k += 1
                if ended[last]:
                    break
            if cut:
                ret = sum(gamma**j * s.rewards[t + j, e] for j in range(k))
                out[(e, t)] = (s.actions[t, e], ret, s.obs[t + k, e], 0.0, gamma**k)
                continue
            if k < n and not ended[last]:
                continue  # data ran out before the window finished: still pending
            ret = sum(gamma**j * s.rewards[t + j, e] for j in range(k))
            done = float(ended[last] and s.terminated[last, e])
            out[(e, t)] = (s.actions[t, e], ret, s.next_obs[last, e], done, gamma**k)
    return out


def as_dict(batch: Batch) -> dict[tuple[int, int], tuple]:
    out = {}
    for i in range(len(batch.actions)):
        key = (int(batch.obs[i, 0]), int(batch.obs[i, 1]))
        assert key not in out, f"transition {key} stored twice"
        out[key] = (
            int(batch.actions[i]),
            float(batch.rewards[i]),
            batch.next_obs[i].numpy(),
            float(batch.dones[i]),
            float(batch.discounts[i]),
        )
    return out


# --------------------------------------------------------------------------- n-step
@pytest.mark.parametrize(("device", "storage"), LAYOUTS)
@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_nstep_matches_brute_force(device, storage, n_step, num_envs):
    gamma = 0.9
    s = random_steps(num_envs, steps=200, seed=n_step * 10 + num_envs)
    buf = ReplayBuffer(
        10_000,
        (3,),
        np.float32,
        device=device,
        storage_device=storage,
        n_step=n_step,
        gamma=gamma,
        num_envs=num_envs,
        float_dtype=torch.float64,
    )
    feed(buf, s)
    want = reference(s, n_step, gamma)
    got = as_dict(everything(buf))
    assert len(buf) == len(want)
    assert got.keys() == want.keys()
    for key, (action, ret, next_obs, done, discount) in want.items():
        g_action, g_ret, g_next_obs, g_done, g_discount = got[key]
        assert g_action == action, key
        assert g_ret == pytest.approx(ret, rel=1e-12, abs=1e-12), key
        np.testing.assert_array_equal(g_next_obs, next_obs, err_msg=str(key))
        assert g_done == done, key
        assert g_discount == pytest.approx(discount, rel=1e-12), key
    # Both kinds of ending happened, and windows of every length were emitted.
    assert s.terminated.any() and s.truncated.any()
    assert {round(d, 9) for d in everything(buf).discounts.tolist()} == {
        round(gamma**k, 9) for k in range(1, n_step + 1)
    }


@pytest.mark.parametrize(("device", "storage"), LAYOUTS)
@pytest.mark.parametrize("num_envs", [1, 3])
def test_nstep_windows_end_before_an_explored_action(device, storage, num_envs):
    # Random actions on 15% of steps: every window that would run into one ends just
    # before it and bootstraps from the obs where the random action was taken.
    gamma = 0.9
    s = random_steps(num_envs, steps=300, seed=7 + num_envs)
    explored = np.random.default_rng(1).random(s.actions.shape) < 0.15
    buf = ReplayBuffer(
        10_000, (3,), np.float32, device=device, storage_device=storage, n_step=3,
        gamma=gamma, num_envs=num_envs, float_dtype=torch.float64,
    )  # fmt: skip
    feed(buf, s, explored=explored)
    want = reference(s, 3, gamma, explored)
    got = as_dict(everything(buf))
    assert got.keys() == want.keys() and len(buf) == len(want)
    for key, (action, ret, next_obs, done, discount) in want.items():
        g_action, g_ret, g_next_obs, g_done, g_discount = got[key]
        assert g_action == action, key
        assert g_ret == pytest.approx(ret, rel=1e-12, abs=1e-12), key
        np.testing.assert_array_equal(g_next_obs, next_obs, err_msg=str(key))
        assert (g_done, g_discount) == (done, pytest.approx(discount, rel=1e-12)), key
    # The cut made a difference: some windows end before an explored step.
    plain = reference(s, 3, gamma)
    assert sum(want[k][4] != plain[k][4] for k in want if k in plain) > 10


def test_nstep_cut_by_hand():
    # Rewards 1..6, n = 3, gamma = 0.5; the action at step 3 was a random one.
    buf = ReplayBuffer(16, (1,), np.int64, device="cpu", n_step=3, gamma=0.5)
    for t in range(6):
        buf.add([[t]], [0], [t + 1.0], [[t + 1]], [False], [t == 5], np.array([t == 3]))
    b = everything(buf)
    order = b.obs[:, 0].argsort()
    assert b.obs[order, 0].tolist() == [0, 1, 2, 3, 4, 5]
    # Step 0's window (steps 0-2) never reached step 3; steps 1 and 2 stop before it.
    assert b.rewards[order].tolist() == [2.75, 2 + 0.5 * 3, 3, 4 + 0.5 * 5 + 0.25 * 6, 5 + 3, 6]
    assert b.next_obs[order, 0].tolist() == [3, 3, 3, 6, 6, 6]
    assert b.discounts[order].tolist() == [0.125, 0.25, 0.5, 0.125, 0.25, 0.5]
    with pytest.raises(ValueError, match="explored: expected a bool array of shape"):
        buf.add([[6]], [0], [0.0], [[7]], [False], [False], np.array([1]))


@pytest.mark.parametrize("terminated", [True, False])
def test_nstep_by_hand(terminated):
    # One episode of 4 steps, rewards 1, 2, 3, 4, ended at step 3; n = 3, gamma = 0.5.
    buf = ReplayBuffer(16, (1,), np.int64, device="cpu", n_step=3, gamma=0.5)
    for t in range(4):
        end = t == 3
        buf.add([[t]], [0], [t + 1.0], [[10 + t]], [end and terminated], [end and not terminated])
    b = everything(buf)
    order = b.obs[:, 0].argsort()
    final = float(terminated)
    assert b.obs[order, 0].tolist() == [0, 1, 2, 3]
    assert b.rewards[order].tolist() == [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3 + 0.25 * 4, 3 + 2, 4]
    assert b.next_obs[order, 0].tolist() == [12, 13, 13, 13]
    assert b.dones[order].tolist() == [0.0, final, final, final]
    assert b.discounts[order].tolist() == [0.125, 0.125, 0.25, 0.5]


def test_pending_windows_are_not_stored():
    buf = ReplayBuffer(16, (1,), np.float32, device="cpu", n_step=3, num_envs=2)
    obs = np.zeros((2, 1), np.float32)
    no = np.zeros(2, bool)
    buf.add(obs, [0, 0], [1.0, 1.0], obs, no, no)
    buf.add(obs, [0, 0], [1.0, 1.0], obs, no, no)
    assert len(buf) == 0  # two steps of each env: both windows still open
    buf.add(obs, [0, 0], [1.0, 1.0], obs, no, np.array([False, True]))
    # env 0: its first 3-step window; env 1 truncated: all three of its windows.
    assert len(buf) == 1 + 3


# --------------------------------------------------------------------------- ring
@pytest.mark.parametrize(("device", "storage"), LAYOUTS)
@pytest.mark.parametrize("num_envs", [1, 3])
def test_ring_keeps_newest(device, storage, num_envs):
    capacity = 7  # not a multiple of num_envs: some adds wrap around the end
    buf = ReplayBuffer(
        capacity, (1,), np.int32, device=device, storage_device=storage, num_envs=num_envs
    )
    total = 0
    for t in range(20):
        ids = np.arange(total, total + num_envs, dtype=np.int32)[:, None]  # (E, 1)
        no = np.zeros(num_envs, bool)
        buf.add(ids, np.zeros(num_envs, np.int64), ids[:, 0] * 1.0, ids + 1000, no, no)
        total += num_envs
        assert len(buf) == min(total, capacity), t
        stored = sorted(everything(buf).obs[:, 0].tolist())
        assert stored == list(range(max(0, total - capacity), total)), t
    b = everything(buf)
    assert torch.equal(b.next_obs[:, 0], b.obs[:, 0] + 1000)  # rows stay aligned
    assert torch.equal(b.rewards, b.obs[:, 0].float())


@pytest.mark.parametrize(("device", "storage"), LAYOUTS)
def test_sample_never_reads_unwritten_slots(device, storage):
    buf = ReplayBuffer(1000, (2,), np.uint8, device=device, storage_device=storage, num_envs=2)
    no = np.zeros(2, bool)
    for t in range(3):  # 6 of 1000 slots written
        obs = np.full((2, 2), 200 + t, np.uint8)
        buf.add(obs, [1, 2], [1.0, 1.0], obs, no, no)
    g = gen(storage)
    for _ in range(100):
        b = buf.sample(6, generator=g)  # with replacement, so slots repeat
        assert set(b.obs.cpu().flatten().tolist()) <= {200, 201, 202}
        assert set(b.actions.cpu().tolist()) <= {1, 2}
        assert torch.all(b.discounts == 0.99)


def test_capacity_smaller_than_one_add():
    # 3 envs ending together with full 3-step windows finish 9 transitions at once.
    buf = ReplayBuffer(4, (1,), np.float32, device="cpu", n_step=3, num_envs=3)
    obs = np.zeros((3, 1), np.float32)
    no, yes = np.zeros(3, bool), np.ones(3, bool)
    for t in range(3):
        buf.add(obs + t, [0, 1, 2], [1.0] * 3, obs, no, yes if t == 2 else no)
    assert len(buf) == 4
    b = everything(buf)
    assert b.discounts.tolist().count(0.99**3) <= 3


# --------------------------------------------------------------------------- dtypes, devices
@pytest.mark.parametrize(("device", "storage"), LAYOUTS)
def test_dtypes_and_devices(device, storage):
    buf = ReplayBuffer(
        64, (4, 5, 5), np.uint8, device=device, storage_device=storage, n_step=2, num_envs=2
    )
    rng = np.random.default_rng(0)
    for _ in range(10):
        obs = rng.integers(0, 256, (2, 4, 5, 5), dtype=np.uint8)
        buf.add(
            obs,
            np.array([1, 0], np.int32),
            np.array([0.5, 1.0]),
            obs,
            [False, True],
            [False, False],
        )
    assert buf.obs_dtype == torch.uint8
    assert buf.bytes_per_transition == 2 * 4 * 5 * 5 + 8 + 3 * 4
    b = buf.sample(8, generator=gen(storage))
    assert isinstance(b, Batch)
    want = {
        "obs": (torch.uint8, (8, 4, 5, 5)),
        "actions": (torch.int64, (8,)),
        "rewards": (torch.float32, (8,)),
        "next_obs": (torch.uint8, (8, 4, 5, 5)),
        "dones": (torch.float32, (8,)),
        "discounts": (torch.float32, (8,)),
    }
    for name, (dtype, shape) in want.items():
        field = getattr(b, name)
        assert field.dtype == dtype, name
        assert tuple(field.shape) == shape, name
        assert field.device.type == torch.device(device).type, name


@pytest.mark.parametrize(("device", "storage"), LAYOUTS)
@pytest.mark.parametrize("float_dtype", [torch.float32, torch.float64])
def test_float_dtype(device, storage, float_dtype):
    buf = ReplayBuffer(
        32,
        (3,),
        np.float32,
        device=device,
        storage_device=storage,
        float_dtype=float_dtype,
        n_step=2,
    )
    obs = np.array([[0.1, 0.2, 0.3]], np.float32)
    for t in range(5):
        buf.add(obs, [1], [0.1], obs, [t == 4], [False])
    b = buf.sample(4, generator=gen(storage))
    for field in (b.obs, b.next_obs, b.rewards, b.dones, b.discounts):
        assert field.dtype == float_dtype
    assert b.actions.dtype == torch.int64
    # float32 observations cast to float64 exactly, not re-rounded.
    assert torch.equal(b.obs[0].cpu(), torch.from_numpy(obs[0]).to(float_dtype))


def test_tensor_inputs_equal_numpy_inputs():
    s = random_steps(2, steps=40, seed=3)
    a = ReplayBuffer(200, (3,), np.float32, device="cpu", n_step=3, num_envs=2)
    b = ReplayBuffer(200, (3,), torch.float32, device="cpu", n_step=3, num_envs=2)
    feed(a, s)
    for t in range(40):
        b.add(
            *(torch.as_tensor(x[t]) for x in (s.obs, s.actions, s.rewards, s.next_obs)),
            torch.as_tensor(s.terminated[t]),
            torch.as_tensor(s.truncated[t].astype(np.int64)),
        )
    assert_same(everything(a), everything(b))


def test_same_generator_same_batch():
    buf = ReplayBuffer(100, (3,), np.float32, device="cpu", num_envs=2)
    feed(buf, random_steps(2, steps=30, seed=0))
    b1, b2 = buf.sample(16, generator=gen("cpu", 7)), buf.sample(16, generator=gen("cpu", 7))
    assert_same(b1, b2)
    b3 = buf.sample(16, generator=gen("cpu", 8))
    assert not torch.equal(b1.obs, b3.obs)


def test_batch_lands_on_device_not_a_fixed_one():
    # meta: no data, but every op runs; a batch built on a hard-coded device would fail.
    buf = ReplayBuffer(8, (4,), np.float32, device="meta", n_step=2)
    one_env = {name: value[:1] for name, value in GOOD.items()}
    for _ in range(3):
        buf.add(**one_env)
    assert all(t.device.type == "meta" for t in buf.sample(2).learned)


def test_storage_device_must_hold_data():
    with pytest.raises(ValueError, match="storage_device must be 'cpu' or a CUDA device, got meta"):
        ReplayBuffer(8, (4,), np.float32, device="cpu", storage_device="meta")


# --------------------------------------------------------------------------- state_dict
@pytest.mark.parametrize(("device", "storage"), LAYOUTS)
@pytest.mark.parametrize("capacity", [1000, 50])  # partly filled, and wrapped around
def test_state_dict_round_trip(device, storage, capacity):
    s = random_steps(3, steps=120, seed=5)
    kwargs = dict(device=device, storage_device=storage, n_step=4, gamma=0.95, num_envs=3)
    a = ReplayBuffer(capacity, (3,), np.float32, **kwargs)
    feed(a, s, stop=77)

    state = a.state_dict()
    for value in state.values():
        assert isinstance(value, (torch.Tensor, int, float, list)), type(value)
    blob = io.BytesIO()
    torch.save(state, blob)
    blob.seek(0)
    b = ReplayBuffer(capacity, (3,), np.float32, **kwargs)
    b.load_state_dict(torch.load(blob, weights_only=True))

    assert len(b) == len(a)
    assert_same(a.sample(32, gen(storage, 1)), b.sample(32, gen(storage, 1)))
    # The open n-step windows carry on exactly: the same future gives the same ring.
    feed(a, s, start=77)
    feed(b, s, start=77)
    assert_same(everything(a), everything(b))
    if capacity == 1000:  # nothing overwritten: the resumed buffer matches brute force
        assert as_dict(everything(b)).keys() == reference(s, 4, 0.95).keys()


def test_load_state_dict_rejects_other_config():
    a = ReplayBuffer(10, (3,), np.float32, device="cpu", n_step=2)
    with pytest.raises(ValueError, match="n_step is 2, this buffer has 3"):
        ReplayBuffer(10, (3,), np.float32, device="cpu", n_step=3).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match=r"obs is torch\.float32"):
        ReplayBuffer(
            10, (3,), np.float32, device="cpu", n_step=2, float_dtype=torch.float64
        ).load_state_dict(a.state_dict())


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, "capacity must be a positive int, got 0"),
        ({"capacity": -5}, "capacity must be a positive int, got -5"),
        ({"n_step": 0}, r"n_step must be an int >= 1, got 0"),
        ({"gamma": 0.0}, r"gamma must be in \(0, 1\], got 0.0"),
        ({"gamma": 1.01}, r"gamma must be in \(0, 1\], got 1.01"),
        ({"gamma": -0.5}, r"gamma must be in \(0, 1\], got -0.5"),
        ({"num_envs": 0}, "num_envs must be an int >= 1, got 0"),
        ({"float_dtype": torch.int32}, "float_dtype must be one of"),
        ({"obs_shape": (4, 0)}, "obs_shape must have positive sizes"),
    ],
)
def test_bad_construction(kwargs, match):
    args = {"capacity": 10, "obs_shape": (4,), "obs_dtype": np.float32, "device": "cpu"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ReplayBuffer(**args)


def test_gamma_one_is_allowed():
    assert ReplayBuffer(10, (4,), np.float32, device="cpu", gamma=1.0).gamma == 1.0


GOOD = {
    "obs": np.zeros((2, 4), np.float32),
    "actions": np.zeros(2, np.int64),
    "rewards": np.zeros(2),
    "next_obs": np.zeros((2, 4), np.float32),
    "terminated": np.zeros(2, bool),
    "truncated": np.zeros(2, bool),
}


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("obs", np.zeros((2, 5), np.float32), r"obs: expected shape \(2, 4\) .*got \(2, 5\)"),
        ("obs", np.zeros((3, 4), np.float32), r"obs: expected shape \(2, 4\) .*got \(3, 4\)"),
        ("obs", np.zeros(4, np.float32), r"obs: expected shape \(2, 4\) .*got \(4,\)"),
        ("obs", np.zeros((2, 4), np.float64), "obs: expected dtype float32, got float64"),
        ("obs", np.zeros((2, 4), np.uint8), "obs: expected dtype float32, got uint8"),
        ("next_obs", np.zeros((1, 4), np.float32), r"next_obs: expected shape \(2, 4\)"),
        ("next_obs", torch.zeros(2, 4, dtype=torch.float64), "next_obs: expected dtype float32"),
        ("actions", np.zeros(3, np.int64), r"actions: expected shape \(2,\) .*got \(3,\)"),
        ("actions", np.zeros((2, 1), np.int64), r"actions: expected shape \(2,\)"),
        ("actions", np.zeros(2, np.float32), "actions: expected an integer dtype, got float32"),
        ("rewards", np.zeros(1), r"rewards: expected shape \(2,\) .*got \(1,\)"),
        ("terminated", np.zeros(4, bool), r"terminated: expected shape \(2,\)"),
        ("truncated", np.zeros(2, np.float64), "truncated: expected a bool or integer dtype"),
    ],
)
def test_bad_add(field, value, match):
    buf = ReplayBuffer(10, (4,), np.float32, device="cpu", num_envs=2, n_step=2)
    with pytest.raises(ValueError, match=match):
        buf.add(**{**GOOD, field: value})
    assert len(buf) == 0
    buf.add(**GOOD)  # a rejected add leaves the buffer usable


def test_uint8_buffer_rejects_float_frames():
    buf = ReplayBuffer(10, (4, 84, 84), np.uint8, device="cpu")
    frames = np.zeros((1, 4, 84, 84), np.float32)
    with pytest.raises(ValueError, match="obs: expected dtype uint8, got float32"):
        buf.add(frames, [0], [0.0], frames, [False], [False])


def test_sample_needs_enough_transitions():
    buf = ReplayBuffer(10, (4,), np.float32, device="cpu", num_envs=2)
    with pytest.raises(ValueError, match=r"batch_size=1.*holds 0"):
        buf.sample(1)
    buf.add(**GOOD)
    with pytest.raises(ValueError, match=r"batch_size=3.*holds 2"):
        buf.sample(3)
    with pytest.raises(ValueError, match=r"batch_size=0"):
        buf.sample(0)
    assert len(buf.sample(2).actions) == 2


# --------------------------------------------------------------------------- CUDA only
def _filled_pair(device: str, storage: str, n_step: int = 3) -> tuple[ReplayBuffer, ReplayBuffer]:
    """A CPU buffer and a (device, storage) buffer fed the same steps (uint8 frames)."""
    rng = np.random.default_rng(0)
    kwargs = dict(n_step=n_step, num_envs=2, gamma=0.97)
    cpu = ReplayBuffer(600, (4, 8, 8), np.uint8, device="cpu", **kwargs)
    other = ReplayBuffer(600, (4, 8, 8), np.uint8, device=device, storage_device=storage, **kwargs)
    for _ in range(400):  # wraps around the 600-slot ring
        obs, next_obs = rng.integers(0, 256, (2, 2, 4, 8, 8), dtype=np.uint8)
        step = (
            obs,
            rng.integers(0, 6, 2),
            rng.normal(size=2),
            next_obs,
            rng.random(2) < 0.05,
            rng.random(2) < 0.05,
        )
        cpu.add(*step)
        other.add(*step)
    return cpu, other


def assert_same(a: Batch, b: Batch) -> None:
    for name, x, y in zip(Batch._fields, a, b, strict=True):
        assert (x is None and y is None) or torch.equal(x.cpu(), y.cpu()), name


@pytest.mark.gpu
def test_pinned_path_matches_cpu():
    cpu, pinned = _filled_pair("cuda", "cpu")
    assert pinned.pinned and not cpu.pinned
    for seed in range(3):
        b = pinned.sample(128, generator=gen("cpu", seed))
        assert b.obs.is_cuda
        assert_same(cpu.sample(128, generator=gen("cpu", seed)), b)
    assert pinned.transfer is not None and not cpu.transfer
    staged = pinned.transfer.slots
    assert staged is not None
    assert all(t.is_pinned() for group in staged.tensors for t in group)
    assert not pinned._fields[0].is_pinned()  # the staging is pinned, not the whole ring


@pytest.mark.gpu
def test_resident_path_matches_cpu():
    cpu, resident = _filled_pair("cuda", "cuda")
    assert resident._fields[0].is_cuda and not resident.pinned
    assert_same(everything(cpu), everything(resident))
    # Same indices drawn by the same CUDA generator state: same batch.
    idx = torch.randint(0, len(cpu), (256,), generator=gen("cuda", 3), device="cuda")
    b = resident.sample(256, generator=gen("cuda", 3))
    assert b.obs.is_cuda
    assert_same(cpu.gather(idx.cpu()), b)


@pytest.mark.gpu
def test_gpu_ring_cpu_learner():
    cpu, gpu_ring = _filled_pair("cpu", "cuda")
    idx = torch.randint(0, len(cpu), (64,), generator=gen("cuda", 4), device="cuda")
    b = gpu_ring.sample(64, generator=gen("cuda", 4))
    # What the learner reads comes to its device; the slots drawn stay where they were
    # drawn, for update_priorities (Batch's contract).
    assert all(t.device.type == "cpu" for t in b.learned)
    assert b.indices is not None and b.indices.is_cuda
    assert_same(cpu.gather(idx.cpu()), b)


@pytest.mark.gpu
def test_back_to_back_non_blocking_samples_are_not_corrupted():
    cpu, pinned = _filled_pair("cuda", "cpu")
    g_cpu, g_pinned = gen("cpu", 11), gen("cpu", 11)
    batches = []
    for i in range(24):
        # Hold the copy stream (or the compute stream) back, so that each copy is still
        # queued while the host gathers the next batches: a staging slot refilled
        # before its copy ran would show up as a mismatch below.
        stream = pinned.transfer.stream if i % 2 == 0 else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000)
        b = pinned.sample(512, generator=g_pinned)
        batches.append((b, b.obs.sum(dtype=torch.int64)))  # used on the compute stream at once
    torch.cuda.synchronize()
    for b, total in batches:
        want = cpu.sample(512, generator=g_cpu)
        assert_same(want, b)
        assert torch.equal(total.cpu(), want.obs.sum(dtype=torch.int64))


@pytest.mark.gpu
def test_resident_adds_with_busy_stream_are_not_corrupted():
    # add() stages rows in pinned memory and copies them non-blocking on the current
    # stream; with that stream held back, reused staging would corrupt the ring.
    rng = np.random.default_rng(1)
    cpu = ReplayBuffer(100, (4,), np.float32, device="cpu", num_envs=2, n_step=2)
    gpu = ReplayBuffer(
        100, (4,), np.float32, device="cuda", storage_device="cuda", num_envs=2, n_step=2
    )
    torch.cuda._sleep(5_000_000)
    for _ in range(30):
        obs = rng.normal(size=(2, 4)).astype(np.float32)
        step = (
            obs,
            rng.integers(0, 3, 2),
            rng.normal(size=2),
            obs + 1,
            rng.random(2) < 0.2,
            np.zeros(2, bool),
        )
        cpu.add(*step)
        gpu.add(*step)
    assert_same(everything(cpu), everything(gpu))


@pytest.mark.parametrize(
    ("asked", "frames", "free", "where"),
    [
        ("auto", False, 4_000, "cuda"),  # a quarter of the free memory: fits
        ("auto", False, 3_999, "cpu"),
        ("auto", False, None, "cpu"),
        ("device", False, 10, "cuda"),  # asked for: the device, whatever it costs
        ("pinned", False, 10**9, "cpu"),
        ("auto", True, 10**9, "cpu"),  # frame replay's frames: the host unless asked
        ("device", True, 10, "cuda"),
        ("pinned", True, 10**9, "cpu"),
    ],
)
def test_replay_storage_goes_to_the_gpu_when_it_fits_or_when_asked(
    asked: str, frames: bool, free: int | None, where: str
) -> None:
    from agent.replay.base import choose_storage

    chosen = choose_storage(asked, torch.device("cuda", 0), frames, 1_000, free)
    assert chosen.type == where
    # Off CUDA everything lives on the host.
    assert choose_storage(asked, torch.device("cpu"), frames, 1_000, free).type == "cpu"


def test_storage_bytes_is_what_the_ring_allocates() -> None:
    for shape, dtype in (((4,), np.float32), ((4, 8, 8), np.uint8)):
        buf = ReplayBuffer(100, shape, dtype, device="cpu", float_dtype=torch.float64)
        expected = ReplayBuffer.storage_bytes(100, shape, np.dtype(dtype), torch.float64)
        assert expected == 100 * buf.bytes_per_transition
    for envs in (1, 3):  # one frame a slot, ceil(capacity / num_envs) slots per env
        frames = FrameReplayBuffer(100, (4, 8, 8), np.uint8, device="cpu", num_envs=envs,
                                   float_dtype=torch.float64)  # fmt: skip
        expected = FrameReplayBuffer.storage_bytes(100, (4, 8, 8), np.dtype(np.uint8),
                                                   torch.float64, envs)  # fmt: skip
        allocated = sum(t.numel() * t.element_size() for t in frames._tensors.values())
        assert expected == allocated
