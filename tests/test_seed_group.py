"""Seeds trained together in one process (agent/seeds/group.py, agent/sweep/local.py)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from agent import cli
from agent.checkpoint import load_checkpoint
from agent.config import Config
from agent.config_files import load_config
from agent.errors import UserError
from agent.learner import NonFiniteError
from agent.seeds.group import GROUP_KEY, train_group
from agent.train import TrainResult
from test_train import SHORT as TRAIN_SHORT
from test_train import _events, _interrupt_at, _interrupt_final_evaluation

ROOT = Path(__file__).resolve().parent.parent

# test_train's short CartPole run (learning, logging, evaluation and checkpoints all
# happen), with evaluations every 500 steps.
SHORT = {**TRAIN_SHORT, "eval_interval": 500}


def _configs(seeds: list[int], **overrides: object) -> list[Config]:
    return [load_config("CartPole-v1", overrides={**SHORT, **overrides, "seed": s}) for s in seeds]


def _group(
    root: Path, seeds: list[int], checkpoints: list | None = None, **overrides: object
) -> list[TrainResult]:
    results = train_group(
        _configs(seeds, **overrides),
        [root / f"seed_{s}" for s in seeds],
        checkpoints or [None] * len(seeds),
        progress=False,
        echo=lambda _: None,
    )
    assert all(isinstance(r, TrainResult) for r in results), results
    return results  # type: ignore[return-value]


def _same_run(a: Path, b: Path) -> None:
    """Two run directories of one seed hold the same training: network, counters, curve."""
    last_a, last_b = (load_checkpoint(d / "checkpoints" / "last.pt") for d in (a, b))
    for key in last_a["q_network"]:
        assert torch.equal(last_a["q_network"][key], last_b["q_network"][key]), key
    assert last_a["counters"] == last_b["counters"]
    result_a, result_b = (json.loads((d / "result.json").read_text()) for d in (a, b))
    for key in ("status", "global_step", "updates", "solved_step", "eval_curve",
                "final_eval_return"):  # fmt: skip
        assert result_a[key] == result_b[key], key


def test_each_seed_is_an_ordinary_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results = _group(tmp_path, [1, 2])
    assert [r.status for r in results] == ["finished", "finished"]
    for seed, result in zip((1, 2), results, strict=True):
        run_dir = tmp_path / f"seed_{seed}"
        assert result.run_dir == str(run_dir) and result.global_step == 2_000
        assert result.learner_backend == "stacked"
        assert load_config("CartPole-v1", run_dir / "config.yaml").seed == seed
        assert json.loads((run_dir / "result.json").read_text())["final_eval_return"] is not None
        assert list(run_dir.glob("events.out.tfevents.*"))
        last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        assert last["counters"]["global_step"] == 2_000 and GROUP_KEY in last
        # The learner state is a single learner's: the optimizer's moments cover one network.
        size = sum(t.numel() for k, t in last["q_network"].items() if "epsilon" not in k)
        assert last["learner"]["optimizer"]["exp_avg"].shape == (size,)
    # The seeds learned apart: different networks.
    nets = [load_checkpoint(tmp_path / f"seed_{s}" / "checkpoints" / "last.pt") for s in (1, 2)]
    assert not torch.equal(nets[0]["q_network"]["head.0.weight"],
                           nets[1]["q_network"]["head.0.weight"])  # fmt: skip
    # --eval takes a seed's best.pt as it is.
    best = tmp_path / "seed_2" / "checkpoints" / "best.pt"
    code = cli.main(["--eval", str(best), "--episodes", "2", "--device", "cpu", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["episodes"] == 2


def test_a_seed_does_not_depend_on_the_seeds_beside_it(tmp_path: Path) -> None:
    """Seed 1 alone, beside seed 2 and beside seed 3: the same run, to the bit."""
    _group(tmp_path / "alone", [1])
    _group(tmp_path / "with2", [2, 1])
    _group(tmp_path / "with3", [1, 3])
    _same_run(tmp_path / "alone" / "seed_1", tmp_path / "with2" / "seed_1")
    _same_run(tmp_path / "alone" / "seed_1", tmp_path / "with3" / "seed_1")


def test_seeds_envs_in_worker_processes_step_at_once_and_train_as_in_this_one(
    tmp_path: Path,
) -> None:
    """With ``vector: async`` every seed's actions go out before any seed's step is read,
    so the seeds' env workers step at once; the runs are the ``sync`` group's, to the bit."""
    log = tmp_path / "steps.log"
    slow = {"envs.testing:StepLog": {"path": str(log), "slow_steps": 2, "seconds": 0.1}}
    few = {"total_steps": 1_000, "eval_envs": 1}
    _group(tmp_path / "async", [1, 2], vector="async", wrappers=[slow], **few)
    _group(tmp_path / "sync", [1, 2], **few)
    for seed in (1, 2):
        _same_run(tmp_path / "async" / f"seed_{seed}", tmp_path / "sync" / f"seed_{seed}")
    # The first lines are the two seeds' workers' first steps (evaluation comes later).
    lines = [line.split() for line in log.read_text().splitlines()[:8]]
    workers = {pid for _, pid in lines}
    assert len(workers) == 2 and str(os.getpid()) not in workers
    # A step of one worker starts while the other's is under way: two starts in a row.
    assert any(a[0] == b[0] == "start" and a[1] != b[1] for a, b in itertools.pairwise(lines))


@pytest.mark.parametrize("streams", ["hidden", "linear"])
def test_a_group_with_c51_and_prioritized_replay_is_each_seed_alone(
    tmp_path: Path, streams: str
) -> None:
    """Each seed's priorities come back from the stacked update to its own replay."""
    rainbow = {"distributional": True, "num_atoms": 7, "prioritized_replay": True,
               "dueling": True, "dueling_streams": streams, "total_steps": 1_000}  # fmt: skip
    _group(tmp_path / "alone", [2], **rainbow)
    _group(tmp_path / "together", [1, 2], **rainbow)
    _same_run(tmp_path / "alone" / "seed_2", tmp_path / "together" / "seed_2")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_group_trains_on_every_device_and_dtype(tmp_path: Path, device: str, dtype: str) -> None:
    """Each seed's checkpoint holds its network in the config's dtype; vector envs per seed."""
    settings = {"device": device, "dtype": dtype, "num_envs": 2, "total_steps": 1_000}
    _group(tmp_path / "a", [1, 2], **settings)
    _group(tmp_path / "b", [3, 2], **settings)
    for seed in (1, 2):
        last = load_checkpoint(tmp_path / "a" / f"seed_{seed}" / "checkpoints" / "last.pt")
        assert last["counters"]["global_step"] == 1_000
        assert all(t.dtype == getattr(torch, dtype) for t in last["q_network"].values())
    if device == "cpu":  # cuBLAS may pick other kernels for another batch of seeds
        _same_run(tmp_path / "a" / "seed_2", tmp_path / "b" / "seed_2")


def test_seeds_that_stop_early_leave_the_others_unchanged(tmp_path: Path) -> None:
    early = {"early_stop": True, "eval_interval": 250, "target_return": 80.0}
    results = _group(tmp_path / "group", [1, 2, 3], **early)
    steps = [r.solved_step for r in results]
    assert all(r.status == "solved" for r in results)
    assert len(set(steps)) == 3  # they left the stack one at a time
    latest = [1, 2, 3][steps.index(max(steps))]
    _group(tmp_path / "alone", [latest], **early)
    _same_run(tmp_path / "alone" / f"seed_{latest}", tmp_path / "group" / f"seed_{latest}")


@pytest.mark.parametrize("noise", [{}, {"noise_interval": "episode"}], ids=["step", "episode"])
def test_a_group_resumes_exactly(tmp_path: Path, noise: dict) -> None:
    """2N steps straight == N, then a resume of the whole group to 2N (save_buffer at its
    default, auto, keeps each seed's buffer)."""
    settings = {**noise, "checkpoint_interval": 10_000, "eval_interval": 700}
    _group(tmp_path / "a", [1, 2], total_steps=2_400, **settings)
    _group(tmp_path / "b", [1, 2], total_steps=1_200, **settings)
    saved = [load_checkpoint(tmp_path / "b" / f"seed_{s}" / "checkpoints" / "last.pt")
             for s in (1, 2)]  # fmt: skip
    _group(tmp_path / "b", [1, 2], saved, total_steps=2_400, **settings)
    for seed in (1, 2):
        _same_run(tmp_path / "a" / f"seed_{seed}", tmp_path / "b" / f"seed_{seed}")


def test_each_seed_of_a_group_keeps_its_buffer_as_it_would_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # save_buffer auto judges each seed's own buffer (CartPole: 52 bytes a transition),
    # not the group's together: a seed resumes the same alone or in any group.
    import agent.checkpoint as checkpoint_module

    one_seed = SHORT["buffer_size"] * 52
    for limit, kept in ((one_seed, True), (one_seed - 1, False)):
        monkeypatch.setattr(checkpoint_module, "BUFFER_LIMIT", limit)
        root = tmp_path / str(limit)
        results = _group(root, [1, 2], total_steps=600)
        for seed, result in zip((1, 2), results, strict=True):
            last = load_checkpoint(root / f"seed_{seed}" / "checkpoints" / "last.pt")
            assert ("replay" in last) is kept
            assert (result.buffer_left_out is None) is kept


def test_what_cannot_train_together_is_refused_in_one_line(tmp_path: Path) -> None:
    cfgs = _configs([1]) + _configs([2], lr=1e-3)
    with pytest.raises(UserError, match="lr differs"):
        train_group(cfgs, [tmp_path / "a", tmp_path / "b"], [None, None], progress=False)
    with pytest.raises(UserError, match="listed twice"):
        train_group(_configs([1, 1]), [tmp_path / "a", tmp_path / "b"], [None, None])
    with pytest.raises(UserError, match="--set eval_vector=sync"):
        train_group(_configs([1, 2], eval_vector="async"), [tmp_path / "a", tmp_path / "b"],
                    [None, None], progress=False)  # fmt: skip
    with pytest.raises(UserError, match="train fewer seeds at a time"):
        train_group(_configs([1, 2], buffer_size=10**13), [tmp_path / "a", tmp_path / "b"],
                    [None, None])  # fmt: skip
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_diverged_seeds_fail_alone_with_their_error_on_disk(tmp_path: Path) -> None:
    cfgs = _configs([1, 2], lr=1e30, max_grad_norm=None, log_interval=100, eval_interval=0)
    results = train_group(cfgs, [tmp_path / "1", tmp_path / "2"], [None, None], progress=False,
                          echo=lambda _: None)  # fmt: skip
    assert all(isinstance(r, NonFiniteError) for r in results)
    for d in ("1", "2"):
        assert (tmp_path / d / "error.txt").read_text().startswith("NonFiniteError")
        last = tmp_path / d / "checkpoints" / "last.pt"
        if last.exists():  # whatever was saved is a good state
            params = load_checkpoint(last)["q_network"]
            assert all(torch.isfinite(t).all() for t in params.values())


def test_seeds_without_ray_train_in_this_process_and_summarise(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    argv = ["--env", "CartPole-v1", "--seeds", "2", "--run-dir", str(sweep), "--no-progress"]
    sets = [a for k, v in SHORT.items() for a in ("--set", f"{k}={v}")]
    assert cli.main([*argv, *sets]) == 0
    summary = json.loads((sweep / "summary.json").read_text())
    assert summary["trials_done"] == 2
    assert {row["seed"] for row in summary["trials"]} == {1, 2}


def test_in_a_terminal_no_line_of_a_seed_group_lands_on_its_progress_bar(tmp_path: Path) -> None:
    from conftest import BAR_FRAME, run_in_a_terminal, text_after_a_bar

    # Evaluations every 200 steps, and a line for each seed as it ends, while the bar runs.
    code, lines = run_in_a_terminal([
        "--env", "CartPole-v1", "--seeds", "2", "--total-steps", "400", "--run-dir",
        str(tmp_path / "sweep"), "--device", "cpu", "--set", "random_starts=100", "--set",
        "learning_starts=100", "--set", "eval_interval=200", "--set", "log_interval=100",
    ])  # fmt: skip
    assert code == 0 and any(BAR_FRAME.search(line) for line in lines), lines
    assert text_after_a_bar(lines) == []


def test_ctrl_c_on_seeds_summarises_what_is_known_and_how_they_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Stopped before any seed finished: CartPole's target (475) is still known from the
    # interrupted runs, and nothing blames eval_interval for the missing curves.
    _interrupt_at(monkeypatch, 700)
    sweep = tmp_path / "sweep"
    argv = ["--env", "CartPole-v1", "--seeds", "1-2", "--run-dir", str(sweep), "--no-progress"]
    settings = {**SHORT, "save_buffer": False}
    sets = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    assert cli.main([*argv, *sets]) == 130
    out = capsys.readouterr().out
    summary = json.loads((sweep / "summary.json").read_text())
    (configuration,) = summary["configurations"]
    assert configuration["done"] == 0 and configuration["not_run"] == 2
    assert configuration["target_return"] == 475.0
    assert "eval_interval" not in out
    # Each seed's last.pt without its buffer: the interruption says the resume is approximate.
    assert all(
        "replay" not in load_checkpoint(sweep / f"seed_{s}" / "checkpoints" / "last.pt")
        for s in (1, 2)
    )
    assert "approximate" in out


def test_a_grid_point_that_cannot_run_fails_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = tmp_path / "sweep"
    argv = ["--env", "CartPole-v1", "--seeds", "2", "--grid", "device=cpu,cuda:99"]
    sets = [a for k, v in SHORT.items() if k != "device" for a in ("--set", f"{k}={v}")]
    assert cli.main([*argv, *sets, "--run-dir", str(sweep), "--no-progress"]) == 1
    summary = json.loads((sweep / "summary.json").read_text())
    assert (summary["trials_done"], summary["trials_failed"]) == (2, 2)
    failed = [row for row in summary["trials"] if row["state"] == "failed"]
    assert all(row["params"]["device"] == "cuda:99" for row in failed)
    assert "FAILED  device=cuda:99 seed=1" in capsys.readouterr().out
    assert cli.main(["--resume", str(sweep), "--no-progress"]) == 1  # only those run again
    assert "2 of 4 trials already finished" in capsys.readouterr().out


def test_more_seeds_than_memory_allows_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["--env", "CartPole-v1", "--seeds", "1-4", "--run-dir", str(tmp_path / "s")]
    assert cli.main([*argv, "--set", "buffer_size=10000000000000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train fewer seeds at a time" in err
    assert not (tmp_path / "s").exists()


def test_ctrl_c_saves_every_seed_and_resume_continues_them(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(
        [sys.executable, "run.py", "--env", "CartPole-v1", "--seeds", "1-3", "--run-dir",
         str(sweep), "--no-progress", "--total-steps", "400000", "--device", "cpu",
         "--set", "early_stop=false"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.time() + 60
    while not (sweep / "seed_3" / "config.yaml").exists() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # let them train a little
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"--resume {sweep}" in out
    steps, saved = set(), []
    for seed in (1, 2, 3):
        result = json.loads((sweep / f"seed_{seed}" / "result.json").read_text())
        assert result["status"] == "interrupted"
        saved.append(load_checkpoint(sweep / f"seed_{seed}" / "checkpoints" / "last.pt"))
        steps.add(saved[-1]["counters"]["global_step"])
    assert len(steps) == 1
    step = steps.pop()
    assert 0 < step < 400_000
    # The group continues from where every seed stopped (here 300 steps further).
    cfgs = [load_config("CartPole-v1", sweep / f"seed_{s}" / "config.yaml") for s in (1, 2, 3)]
    for cfg in cfgs:
        cfg.total_steps = step + 300
    results = train_group(cfgs, [sweep / f"seed_{s}" for s in (1, 2, 3)], saved,
                          progress=False, echo=lambda _: None)  # fmt: skip
    assert [r.global_step for r in results] == [step + 300] * 3  # type: ignore[union-attr]


def test_a_group_resumed_at_its_budget_takes_no_further_step(tmp_path: Path) -> None:
    # A group stopped at its last step (Ctrl-C between the step and the end) resumes there.
    first = _group(tmp_path, [1, 2])
    saved = [load_checkpoint(tmp_path / f"seed_{s}" / "checkpoints" / "last.pt") for s in (1, 2)]
    assert {c["counters"]["global_step"] for c in saved} == {SHORT["total_steps"]}

    again = _group(tmp_path, [1, 2], saved)

    assert [r.global_step for r in again] == [SHORT["total_steps"]] * 2
    assert [r.updates for r in again] == [r.updates for r in first]


def test_ctrl_c_in_the_final_evaluation_interrupts_the_group_and_its_resume_plays_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _group(tmp_path / "a", [1, 2])
    calls = _interrupt_final_evaluation(monkeypatch, 5)
    stopped = _group(tmp_path / "b", [1, 2])
    monkeypatch.undo()
    # The first seed's evaluation heard it at the next step; the second's did not start.
    assert len(calls) == 5
    assert [r.status for r in stopped] == ["interrupted"] * 2
    assert [r.final_eval_return for r in stopped] == [None, None]
    saved = [load_checkpoint(tmp_path / "b" / f"seed_{s}" / "checkpoints" / "last.pt")
             for s in (1, 2)]  # fmt: skip
    again = _group(tmp_path / "b", [1, 2], saved)
    assert [r.status for r in again] == ["finished"] * 2
    assert [r.final_eval_return for r in again] == [r.final_eval_return for r in first]
    assert [r.updates for r in again] == [r.updates for r in first]


# Image seeds: the DER preset on the test env of 36x36 uint8 frame stacks (3 lives, short
# episodes), shortened; the frame replay, prioritized, 20-step returns, C51 and noise all on.
FRAMES = "envs.testing:NoisyDQN/Frames-v0"
FRAMES_RUN = {
    "total_steps": 300, "learning_starts": 100, "buffer_size": 1_000, "batch_size": 8,
    "train_freq": 2, "target_update_interval": 50, "n_step": 3, "final_episodes": 2,
    "eval_envs": 1, "log_interval": 100, "checkpoint_interval": 100_000, "device": "cpu",
    "env_kwargs": {},
}  # fmt: skip


def _image_group(
    root: Path, seeds: list[int], checkpoints: list | None = None, **overrides: object
) -> list[TrainResult]:
    cfgs = [load_config(FRAMES, "der", overrides={**FRAMES_RUN, **overrides, "seed": s})
            for s in seeds]  # fmt: skip
    results = train_group(cfgs, [root / f"seed_{s}" for s in seeds],
                          checkpoints or [None] * len(seeds), progress=False,
                          echo=lambda _: None)  # fmt: skip
    assert all(isinstance(r, TrainResult) for r in results), results
    return results  # type: ignore[return-value]


def test_image_seeds_stack_and_each_is_its_own_run(tmp_path: Path) -> None:
    """Seed 1 alone and beside seed 2: the same run to the bit; the frame replay per seed."""
    _image_group(tmp_path / "alone", [1])
    _image_group(tmp_path / "with2", [2, 1])
    _same_run(tmp_path / "alone" / "seed_1", tmp_path / "with2" / "seed_1")
    last = load_checkpoint(tmp_path / "with2" / "seed_2" / "checkpoints" / "last.pt")
    assert "frames" in last["replay"]  # each seed kept a frame replay of its own
    assert any(k.startswith("torso.convs.0.") for k in last["q_network"])


@pytest.mark.gpu
@pytest.mark.parametrize("vector", ["sync", "async"])
def test_an_image_group_trains_on_cuda(tmp_path: Path, vector: str) -> None:
    """On a GPU the stacked convolutions are one grouped call for the seeds: a group trains
    there to its last step, each seed's parameters finite; its envs also in worker
    processes forked from the process that holds the CUDA context."""
    results = _image_group(tmp_path, [1, 2], device="cuda", vector=vector)
    assert [r.status for r in results] == ["finished", "finished"]
    for seed in (1, 2):
        last = load_checkpoint(tmp_path / f"seed_{seed}" / "checkpoints" / "last.pt")
        assert last["counters"]["global_step"] == FRAMES_RUN["total_steps"]
        assert all(torch.isfinite(t).all() for t in last["q_network"].values())


def _captured_and_eager(
    root: Path, run: Callable[..., list[TrainResult]], **overrides: object
) -> list[tuple[Path, Path]]:
    """The same group trained with eager updates and with its update captured (on the
    CPU the capture seam's eager stand-in; on CUDA a CUDA graph): each seed's two runs."""
    run(root / "eager", [1, 2], capture_graph=False, **overrides)
    run(root / "captured", [1, 2], capture_graph=True, **overrides)
    return [(root / "eager" / f"seed_{s}", root / "captured" / f"seed_{s}") for s in (1, 2)]


def test_a_captured_group_update_trains_the_same_runs_as_eager_updates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA (capture_graph) a group's stacked update is one CUDA graph, the seeds' noise
    streams registered with it. On the CPU the capture seam's eager stand-in runs the same
    orchestration: static buffers, the host's counters, and a capture whose warm-up draws
    each seed's update noise and must leave no trace. So each seed's run is its eager run
    to the bit, down to its saved noise streams and its logged losses."""
    import agent.seeds.group as group_module
    from agent.acting.graph import capture_eager

    monkeypatch.setattr(group_module, "update_capture",
                        lambda device, on: capture_eager if on else None)  # fmt: skip
    for eager, captured in _captured_and_eager(tmp_path, _group):
        _same_run(eager, captured)
        a, b = (load_checkpoint(d / "checkpoints" / "last.pt") for d in (eager, captured))
        assert a["learner"]["optimizer"]["step"] == b["learner"]["optimizer"]["step"] > 0
        assert torch.equal(a["learner"]["optimizer"]["steps"], b["learner"]["optimizer"]["steps"])
        for stream in ("act_generator", "update_generator"):
            assert torch.equal(a[GROUP_KEY][stream], b[GROUP_KEY][stream]), stream
        losses = [[e.value for e in _events(d).Scalars("losses/td_loss")]
                  for d in (eager, captured)]  # fmt: skip
        assert losses[0] and losses[0] == losses[1]  # each update counted once


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_an_image_group_captures_its_update_and_trains_as_eager_updates_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two der seeds stacked on CUDA, their update one CUDA graph (grouped convolutions,
    each seed's noise stream registered) against the same group's eager updates. cuDNN's
    default convolution gradients sum in no fixed order: deterministic algorithms keep the
    comparison about the capture."""
    import agent.seeds.group as group_module

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    graphs = []  # the captures that succeeded (one that raises leaves the update eager)
    real = group_module.update_capture

    def recorded(device: torch.device, on: bool) -> object:
        capture = real(device, on)
        if capture is None:
            return None

        def capture_and_record(*args: object, **kwargs: object) -> object:
            graphs.append(capture(*args, **kwargs))
            return graphs[-1]

        return capture_and_record

    monkeypatch.setattr(group_module, "update_capture", recorded)
    pairs = _captured_and_eager(tmp_path, _image_group, device="cuda")
    assert len(graphs) == 1  # the captured group's one capture; the eager group's none
    for eager, captured in pairs:
        a, b = (load_checkpoint(d / "checkpoints" / "last.pt") for d in (eager, captured))
        assert a["counters"] == b["counters"]
        for key, value in a["q_network"].items():
            torch.testing.assert_close(b["q_network"][key], value, rtol=1e-4, atol=1e-5)
        for stream in ("act_generator", "update_generator"):
            assert torch.equal(a[GROUP_KEY][stream], b[GROUP_KEY][stream]), stream


def test_an_image_group_resumes_exactly(tmp_path: Path) -> None:
    """2N steps straight == N, then a resume of the whole group to 2N (the buffers kept).
    Uniform replay: prioritized replay anneals its beta over total_steps, which differ."""
    uniform = {"prioritized_replay": False}
    _image_group(tmp_path / "a", [1, 2], total_steps=400, **uniform)
    _image_group(tmp_path / "b", [1, 2], total_steps=200, **uniform)
    saved = [load_checkpoint(tmp_path / "b" / f"seed_{s}" / "checkpoints" / "last.pt")
             for s in (1, 2)]  # fmt: skip
    _image_group(tmp_path / "b", [1, 2], saved, total_steps=400, **uniform)
    for seed in (1, 2):
        _same_run(tmp_path / "a" / f"seed_{seed}", tmp_path / "b" / f"seed_{seed}")


def test_three_der_seeds_train_on_breakout_in_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--seeds 3 --config der on a real game, shortened (300 steps, an update a step from
    200 on, one evaluation episode capped at 400 frames)."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from agent.networks import QNetwork

    sweep = tmp_path / "sweep"
    settings = {"total_steps": 300, "learning_starts": 200, "buffer_size": 1000,
                "final_episodes": 1, "eval_envs": 1, "log_interval": 100,
                "checkpoint_interval": 100_000, "device": "cpu", "env_kwargs":
                "{repeat_action_probability: 0.0, max_num_frames_per_episode: 400}"}  # fmt: skip
    argv = ["--env", "BreakoutNoFrameskip-v4", "--config", "der", "--seeds", "3",
            "--run-dir", str(sweep), "--no-progress"]  # fmt: skip
    assert cli.main([*argv, *(a for k, v in settings.items() for a in ("--set", f"{k}={v}"))]) == 0
    out = capsys.readouterr().out
    assert "3 seeds in one process, networks stacked" in out
    weights = []
    for seed in (1, 2, 3):
        run_dir = sweep / f"seed_{seed}"
        result = json.loads((run_dir / "result.json").read_text())
        assert result["status"] == "finished" and result["updates"] == 101
        assert result["learner_backend"] == "stacked"
        last = load_checkpoint(run_dir / "checkpoints" / "last.pt")
        weights.append(last["q_network"])
    for key in ("torso.convs.0.weight", "torso.convs.2.weight", "advantage.2.weight_mu"):
        assert not torch.equal(weights[0][key], weights[1][key]), key
        assert not torch.equal(weights[1][key], weights[2][key]), key
    # A seed's last.pt is a single network's: it loads into a plain QNetwork, and --eval
    # plays it.
    net = QNetwork((4, 84, 84), 4, (256,), torso="der", dueling=True, num_atoms=51,
                   sigma0=0.1, input_scale=255.0)  # fmt: skip
    net.load_state_dict(weights[1])
    last = str(sweep / "seed_2" / "checkpoints" / "last.pt")
    assert cli.main(["--eval", last, "--episodes", "1", "--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["episodes"] == 1


def test_the_memory_check_counts_an_image_seeds_frame_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three der seeds' 100k-frame replays (about 0.7 GB each) fit in 3 GiB; as whole
    stacks (frame_replay off, 5.6 GB each) they do not, and the check says so."""
    import agent.seeds.group as group

    monkeypatch.setattr(group, "available_memory", lambda: 3 * 2**30)
    cfg = load_config("BreakoutNoFrameskip-v4", "der")
    group.check_memory(cfg, (4, 84, 84), "uint8", 3)
    cfg.frame_replay = False
    with pytest.raises(UserError, match="train fewer seeds at a time"):
        group.check_memory(cfg, (4, 84, 84), "uint8", 3)
