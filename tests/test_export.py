"""Export: `run.py --export` writes a noise-free greedy policy that acts like the checkpoint.

The exported files are checked here independently of agent/export.py's own verification:
loaded with onnxruntime or torch.export.load (in a process where this project cannot be
imported) and compared with the checkpoint's network, noise off, on observations from
playing the env. ONNX tests skip without onnxruntime (CI installs the export extra
through `dev`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import envs.testing  # noqa: F401  (registers NoisyDQN/Frames-v0: uint8 frames, Nature CNN)
from agent import cli
from agent.checkpoint import FORMAT, load_checkpoint
from agent.config_files import config_from_dict
from agent.export import (
    ExportMismatch,
    GreedyPolicy,
    collect_observations,
    export_policy,
    fold_noise,
    load_exported,
    verify,
)
from agent.networks import QNetwork
from agent.noisy import NoisyLinear, noise_disabled
from agent.train import build_q_network
from agent.values import q_values, support_of
from agent.usage import install_hint
from conftest import train_checkpoint
from envs import make_env

ROOT = Path(__file__).resolve().parent.parent

# name: (env id, config overrides, steps). Noise on every layer, so that folding matters.
NETWORKS = {
    "mlp": ("CartPole-v1", {"noisy_layers": "all"}, 1_000),
    "dueling": ("CartPole-v1", {"noisy_layers": "all", "dueling": True}, 1_000),
    "c51": ("CartPole-v1", {"noisy_layers": "all", "dueling": True, "distributional": True,
                            "num_atoms": 11, "prioritized_replay": True}, 1_000),
    "c51-linear-streams": ("CartPole-v1", {"noisy_layers": "all", "dueling": True,
                                           "dueling_streams": "linear", "distributional": True,
                                           "num_atoms": 11}, 1_000),
    "cnn": ("NoisyDQN/Frames-v0", {"hidden_sizes": [64]}, 300),
}


# Runs a .pt2 where this project cannot be imported: batches of 1, 7 and all of obs.npy.
LOAD_PT2 = """
import sys
import numpy as np
import torch
sys.modules["agent"] = sys.modules["envs"] = None
module = torch.export.load(sys.argv[1]).module()
obs = torch.from_numpy(np.load("obs.npy"))
for n in (1, 7):
    q_values, action = module(obs[:n])
    assert q_values.shape[0] == n and action.shape == (n,)
q_values, action = module(obs)
np.save("q.npy", q_values.detach().numpy())
np.save("a.npy", action.numpy())
"""


def _onnx() -> None:
    # Skip only without the extra at all: an installed extra missing a part (onnx,
    # onnxscript) must fail here, as it would fail users.
    pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    paths = {}
    for name, (env_id, overrides, steps) in NETWORKS.items():
        run_dir = tmp_path_factory.mktemp(name) / "run"
        paths[name] = train_checkpoint(run_dir, env_id, steps, **overrides)
    return paths


def _network(checkpoint: Path) -> QNetwork:
    data = load_checkpoint(checkpoint)
    cfg = config_from_dict(dict(data["config"]), str(checkpoint))
    q = build_q_network(cfg, tuple(data["obs_shape"]), int(data["n_actions"]), torch.device("cpu"),
                        data["obs_dtype"])  # fmt: skip
    q.load_state_dict(data["q_network"])
    return q


def _one_line_error(code: int, err: str, pattern: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and pattern in lines[0], lines[0]


# --------------------------------------------------------------------------- #
# Folding the noise                                                           #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_folded_network_is_the_noise_free_network(dueling: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    q = QNetwork((6,), 3, (32, 16), dueling=dueling, dtype=dtype)
    q.reset_noise()  # non-zero noise: a fold that kept it would differ
    before = {k: v.clone() for k, v in q.state_dict().items()}
    folded = fold_noise(q)
    assert not any(isinstance(m, NoisyLinear) for m in folded.modules())
    assert all(p.dtype == dtype for p in folded.parameters())
    obs = torch.randn(64, 6, dtype=dtype)
    with torch.no_grad(), noise_disabled(q):
        torch.testing.assert_close(folded(obs), q(obs), rtol=0, atol=0)
    # The original keeps its noise (switched on) and its parameters.
    with torch.no_grad():
        assert not torch.equal(q(obs), folded(obs))
    for k, v in q.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_fold_stays_on_the_meta_device() -> None:
    q = QNetwork((4, 36, 36), 3, (32,), dueling=True, input_scale=255.0, device="meta")
    folded = fold_noise(q)
    assert all(t.device.type == "meta" for t in [*folded.parameters(), *folded.buffers()])
    q_values, action = GreedyPolicy(folded)(
        torch.zeros(2, 4, 36, 36, dtype=torch.uint8, device="meta")
    )
    assert q_values.device.type == "meta" and action.device.type == "meta"
    assert q_values.shape == (2, 3) and action.shape == (2,)


# --------------------------------------------------------------------------- #
# The command: every network, both formats                                    #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("fmt", ["onnx", "torch"])
@pytest.mark.parametrize("name", list(NETWORKS))
def test_export_acts_like_the_checkpoint(
    name: str, fmt: str, checkpoints: dict[str, Path], tmp_path: Path, capsys
) -> None:
    if fmt == "onnx":
        _onnx()
    env_id = NETWORKS[name][0]
    out = tmp_path / "deploy" / f"policy.{'onnx' if fmt == 'onnx' else 'pt2'}"
    assert cli.main(["--export", str(checkpoints[name]), "--format", fmt, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"actions equal on \d+ of 2048 observations", printed), printed
    # One self-contained file (no ONNX external-data file beside it, no temporary left).
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]

    # Fresh observations (another seed than the export's check), in the env's dtype.
    q = _network(checkpoints[name])
    env = make_env(env_id)
    obs = collect_observations(env, q, 500, seed=123)
    env.close()
    assert obs.dtype == (np.uint8 if name == "cnn" else np.float32)
    with torch.no_grad(), noise_disabled(q):
        q_ref = q_values(q(torch.from_numpy(obs)), support_of(q)).numpy()

    if fmt == "onnx":
        import onnxruntime as ort

        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        (inp,) = session.get_inputs()
        assert inp.name == "obs"
        assert inp.type == ("tensor(uint8)" if name == "cnn" else "tensor(float)")
        assert [o.name for o in session.get_outputs()] == ["q_values", "action"]
        # Dynamic batch: 1, 7 and 500 observations through the same file.
        for batch in (obs[:1], obs[:7], obs):
            q_exp, a_exp = session.run(None, {"obs": batch})
            assert q_exp.shape == (len(batch), q_ref.shape[1]) and a_exp.dtype == np.int64
        q_exp, a_exp = session.run(None, {"obs": obs})
    elif name != "cnn":
        module = torch.export.load(str(out)).module()
        with torch.inference_mode():
            q_exp, a_exp = (t.numpy() for t in module(torch.from_numpy(obs)))
    else:  # once, in a process where this project cannot be imported
        np.save(tmp_path / "obs.npy", obs)
        proc = subprocess.run(
            [sys.executable, "-c", LOAD_PT2, str(out)], cwd=tmp_path, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        q_exp, a_exp = np.load(tmp_path / "q.npy"), np.load(tmp_path / "a.npy")
    np.testing.assert_allclose(q_exp, q_ref, rtol=1e-4, atol=1e-4)
    # Actions equal wherever the best action is not a near-tie.
    top2 = np.sort(q_ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(a_exp[clear], q_ref.argmax(axis=1)[clear])


def test_default_output_is_beside_the_checkpoint_and_format_follows_out(
    checkpoints: dict[str, Path], tmp_path: Path, capsys
) -> None:
    checkpoint = tmp_path / "best.pt"
    checkpoint.write_bytes(checkpoints["mlp"].read_bytes())
    assert cli.main(["--export", str(checkpoint), "--format", "torch"]) == 0
    assert (tmp_path / "best.pt2").is_file()
    assert cli.main(["--export", str(checkpoint), "--out", str(tmp_path / "x.pt2")]) == 0
    torch.export.load(str(tmp_path / "x.pt2"))  # a torch.export program, from the suffix
    capsys.readouterr()


# --------------------------------------------------------------------------- #
# Verification                                                                #
# --------------------------------------------------------------------------- #


def test_verification_rejects_a_model_that_acts_otherwise(tmp_path: Path) -> None:
    torch.manual_seed(0)
    q = QNetwork((4,), 2, (32,))
    env = make_env("CartPole-v1")
    obs = collect_observations(env, q, 300)
    env.close()
    other = QNetwork((4,), 2, (32,))
    export_policy(other, obs[:2], tmp_path / "other.pt2", "torch")
    with pytest.raises(ExportMismatch, match="differ"):
        verify(load_exported(tmp_path / "other.pt2", "torch"), q, obs)


def test_verification_counts_near_ties_and_accepts_either_tied_action() -> None:
    q = QNetwork((4,), 3, (8,), noisy_layers="none")
    with torch.no_grad():  # Q(s, 0) == Q(s, 1) exactly, Q(s, 2) clearly lower
        q.head[-1].weight.zero_()
        q.head[-1].bias.copy_(torch.tensor([1.0, 1.0, -5.0]))
    obs = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)

    def picks(action: int):
        def exported(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            q_values = np.tile(np.array([1.0, 1.0, -5.0], np.float32), (len(batch), 1))
            return q_values, np.full(len(batch), action)

        return exported

    first = verify(picks(0), q, obs)
    assert (first.near_ties, first.near_tie_differences) == (50, 0)
    second = verify(picks(1), q, obs)  # the other runtime broke the tie the other way
    assert (second.near_ties, second.near_tie_differences) == (50, 50)
    with pytest.raises(ExportMismatch, match="actions differ on 50 of 50"):
        verify(picks(2), q, obs)
    with pytest.raises(ExportMismatch, match="actions differ on 50 of 50"):
        verify(picks(7), q, obs)  # not an action at all


def test_a_wrong_export_is_exit_1_and_writes_nothing(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # The plausible bug: folding the *noisy* weights instead of the means.
    import agent.export

    def fold_with_noise(q_network: torch.nn.Module) -> torch.nn.Module:
        folded = fold_noise(q_network)
        for (_, noisy), linear in zip(
            [(n, m) for n, m in q_network.named_modules() if isinstance(m, NoisyLinear)],
            [m for m in folded.modules() if isinstance(m, torch.nn.Linear)],
            strict=True,
        ):
            with torch.no_grad():
                linear.weight.add_(noisy.weight_sigma * noisy.weight_epsilon)
        return folded

    monkeypatch.setattr(agent.export, "fold_noise", fold_with_noise)
    out = tmp_path / "policy.pt2"
    code = cli.main(["--export", str(checkpoints["mlp"]), "--format", "torch", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "does not match" in err[0], err
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary


# --------------------------------------------------------------------------- #
# Bad input: one line, exit 2                                                 #
# --------------------------------------------------------------------------- #


def test_bad_input_is_one_line(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    foreign = tmp_path / "foreign.pt"
    torch.save({"model": torch.zeros(2)}, foreign)
    other_version = tmp_path / "v99.pt"
    data = torch.load(checkpoints["mlp"], weights_only=True)
    assert data["format"] == FORMAT
    torch.save({**data, "version": 99}, other_version)
    a_file = tmp_path / "file"
    a_file.write_text("")
    good = str(checkpoints["mlp"])
    cases = [  # torch.export: these must not depend on the export extra
        (["--export", str(tmp_path / "missing.pt")], "no checkpoint at"),
        (["--export", str(foreign)], "not a Noisy DQN checkpoint"),
        (["--export", str(other_version)], "format version 99"),
        (["--export", good, "--out", str(a_file / "x.pt2")], "part of its directory path is a"),
        (["--export", good, "--out", str(tmp_path)], "is a directory"),
        (["--export", good, "--env", "Acrobot-v1"], "trained on CartPole"),
        (["--export", good, "--format", "tflite"], "invalid choice"),
    ]
    for args, pattern in cases:
        try:
            code = cli.main([*args, "--format", "torch"] if "--format" not in args else args)
        except SystemExit as e:  # argparse's own errors exit from inside parse_args
            code = e.code
        _one_line_error(code, capsys.readouterr().err, pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "foreign.pt", "v99.pt"]


def test_missing_export_extra_is_one_line_but_torch_export_needs_none(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # A fresh install without the extra: importing onnxruntime fails.
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    code = cli.main(["--export", str(checkpoints["mlp"]), "--out", str(tmp_path / "p.onnx")])
    _one_line_error(code, capsys.readouterr().err, install_hint("export"))
    assert cli.main(["--export", str(checkpoints["mlp"]), "--out", str(tmp_path / "p.pt2")]) == 0
    capsys.readouterr()


# --------------------------------------------------------------------------- #
# The docs' deployment program                                               #
# --------------------------------------------------------------------------- #


def test_the_documented_onnxruntime_program_plays_cartpole(
    checkpoints: dict[str, Path], tmp_path: Path, capsys
) -> None:
    _onnx()
    page = (ROOT / "docs" / "evaluation.md").read_text()
    section = page.split("## Deploy a policy", 1)[1].split("\n## ", 1)[0]
    program = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    filename = re.search(r'InferenceSession\("([^"]+)"\)', program).group(1)
    assert len(program.strip().splitlines()) <= 12
    assert cli.main(["--export", str(checkpoints["mlp"]), "--out", str(tmp_path / filename)]) == 0
    capsys.readouterr()
    blocked = (
        "import sys\nsys.modules['agent'] = sys.modules['envs'] = sys.modules['torch'] = None\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocked + program], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    episode_return = float(proc.stdout.split()[-1])
    assert 1 <= episode_return <= 500
