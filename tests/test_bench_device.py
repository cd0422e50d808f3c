"""bench/learner.py and bench/atari.py with --device: CPU runs, the CUDA-less usage error,
the CUDA graph checks on a stand-in graph, and (with a GPU) the CUDA runs themselves."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import bench.learner as bench_learner
from conftest import CUDA

from agent.acting.graph import capture_eager

ROOT = Path(__file__).resolve().parent.parent
HAS_ALE = importlib.util.find_spec("ale_py") is not None


def bench(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"bench.{script}", *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )


def test_learner_on_cpu_prints_the_table_with_the_numpy_backend():
    out = bench("learner", "--device", "cpu", "--calls", "5", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    assert "| Learner.update, numpy backend (all of it) |" in out.stdout
    assert "| Learner.update, torch backend (all of it) |" in out.stdout
    assert "the numpy backend takes" in out.stdout
    assert "CUDA graph" not in out.stdout


@pytest.mark.skipif(CUDA, reason="checks the error of a machine without CUDA")
@pytest.mark.parametrize("script", ["learner", "atari"])
def test_device_cuda_without_cuda_is_a_one_line_usage_error(script):
    out = bench(script, "--device", "cuda")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith(
        "error: --device cuda: CUDA is not available here (torch.cuda.is_available() is False)"
    )


@pytest.mark.skipif(not HAS_ALE, reason="needs ale_py (the atari extra)")
def test_atari_breakdown_quick_on_cpu_prints_every_part():
    out = bench("atari", "--breakdown", "--no-sps", "--quick", "--envs", "1", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "failed" not in out.stdout, out.stdout
    for part in ("(a) vector env step", "(b) ActionSelector call", "(c) replay add",
                 "(c) replay.sample(32)", "(d) update, batch 32", "| total |"):
        assert part in out.stdout, out.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--config", "nope"], "no preset of that name"),
        (["--set", "nope=1"], "unknown config key 'nope'"),
        (["--set", "replay_storage=bad"], "must be 'auto' | 'device' | 'pinned'"),
    ],
)
def test_atari_config_or_set_that_does_not_validate_is_a_one_line_usage_error(args, says):
    out = bench("atari", *args, "--no-sps", "--breakdown", "--envs", "1")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert says in out.stderr.strip().splitlines()[-1]


def test_atari_breakdown_on_cpu_times_under_trainings_thread_limits(monkeypatch):
    # train() holds numpy's BLAS to its torch threads; a breakdown that does not times a
    # numpy update with a BLAS thread per core, many times slower beside busy processes.
    import bench.atari as bench_atari
    from threadpoolctl import threadpool_info

    seen: list[tuple[int, list[int]]] = []

    def record(*args, **kwargs):
        blas = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
        seen.append((torch.get_num_threads(), blas))

    monkeypatch.setattr(bench_atari, "breakdown", record)
    monkeypatch.setattr(sys, "argv", ["atari.py", "--no-sps", "--breakdown", "--envs", "1"])
    threads = torch.get_num_threads()
    try:
        bench_atari.main()
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 1
    torch_threads, blas = seen[0]
    assert torch_threads == 1 and blas and set(blas) == {1}


def test_graph_checks_pass_on_an_eager_stand_in(monkeypatch, capsys):
    # The checks' own logic (the twin learner copied from the graph's, Adam state
    # included, reseeded) on the CPU: an eager stand-in must match the twin exactly,
    # so a mismatch on the GPU is the graph's and not the check's.
    mod = bench_learner
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "manual_seed", torch.manual_seed)
    torch.manual_seed(0)
    net = mod.QNetwork((4,), 2, [16, 16], noisy_layers="last")
    learner = mod.Learner(net, copy.deepcopy(net), lr=mod.LR, backend="torch")
    batch = mod.make_batch(8, torch.device("cpu"))
    # The script's own capture path, with the acting path's eager stand-in for the graph.
    graph = mod.capture_update(learner, batch, capture=capture_eager)
    assert mod.grads_in_flat_buffer(learner.optimizer)
    mod.check_graph(learner, graph)
    mod.compare_with_eager(learner, graph, batch)
    out = capsys.readouterr().out
    assert "CUDA graph check after 5 replays: OK" in out
    assert "advanced by [5.0]" in out
    assert "max |parameter difference| 0," in out and "(match up to float rounding)" in out


def test_grads_in_flat_buffer_sees_a_replaced_grad():
    mod = bench_learner
    net = mod.QNetwork((4,), 2, [8], noisy_layers="last")
    learner = mod.Learner(net, copy.deepcopy(net), lr=mod.LR, backend="torch")
    assert mod.grads_in_flat_buffer(learner.optimizer)
    first = learner.optimizer.params[0]
    first.grad = torch.zeros_like(first)
    assert not mod.grads_in_flat_buffer(learner.optimizer)


@pytest.mark.gpu
def test_learner_on_cuda_captures_and_checks_the_graph():
    out = bench("learner", "--device", "cuda", "--calls", "20", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    assert "graph capture failed" not in out.stdout, out.stdout
    assert "numpy backend" not in out.stdout
    assert "| Learner.update captured in a CUDA graph (replay) |" in out.stdout
    assert "CUDA graph check after 5 replays: OK" in out.stdout, out.stdout
    assert "replays against 5 eager updates" in out.stdout, out.stdout
    assert " failed: " not in out.stdout, out.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_ALE, reason="needs ale_py (the atari extra)")
def test_atari_breakdown_quick_on_cuda():
    out = bench("atari", "--breakdown", "--no-sps", "--quick", "--envs", "1,2", "--device", "cuda")
    assert out.returncode == 0, out.stderr
    assert "failed" not in out.stdout, out.stdout
    assert out.stdout.count("| total |") == 2
    assert "graph (captured)" in out.stdout  # the selector's CUDA graph
    # the update as training runs it, a CUDA graph, with the eager one beside it
    assert out.stdout.count("(d) update, batch 32, a CUDA graph") == 2, out.stdout
    assert out.stdout.count("(the same update eager, not counted)") == 2, out.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_ALE, reason="needs ale_py (the atari extra)")
def test_atari_breakdown_of_the_der_preset_on_cuda():
    out = bench("atari", "--env", "KrullNoFrameskip-v4", "--config", "der", "--breakdown",
                "--no-sps", "--quick", "--envs", "1", "--device", "cuda")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "failed" not in out.stdout, out.stdout
    assert "train_freq 1" in out.stdout  # DER's update every step, not atari.yaml's 4
    assert "(d) update, batch 32, a CUDA graph" in out.stdout, out.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_ALE, reason="needs ale_py (the atari extra)")
def test_atari_breakdown_with_frames_on_the_gpu():
    out = bench("atari", "--breakdown", "--no-sps", "--quick", "--envs", "1", "--device", "cuda",
                "--set", "replay_storage=device")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "failed" not in out.stdout, out.stdout
    assert "--set replay_storage=device" in out.stdout  # the header says what ran
    assert "(d) update, batch 32, a CUDA graph" in out.stdout, out.stdout
