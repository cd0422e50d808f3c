"""Export the greedy, noise-free policy of a Q-network to ONNX or torch.export, verified.

The exported model is the policy a deployment needs and nothing else:

* noise-free: every :class:`~agent.noisy.NoisyLinear` is folded into a plain
  ``nn.Linear`` holding its mean weights (``weight_mu``, ``bias_mu``), which is
  exactly what the layer computes with its noise off;
* input ``obs``: a batch ``(B, *obs_shape)`` of raw observations in the env's
  dtype (uint8 frames stay uint8: the cast and the /255 run inside the graph),
  with a dynamic batch dimension;
* outputs ``q_values`` ``(B, n_actions)`` and ``action`` ``(B,)`` int64, the
  greedy action (the first of equal maxima, as ``torch.argmax`` and ONNX
  ``ArgMax`` both pick).

Formats: ``onnx`` (``torch.onnx.export``, one self-contained file, run with
onnxruntime) and ``torch`` (a ``torch.export`` program, ``.pt2``, loaded with
``torch.export.load`` without importing this project).

Nothing is trusted: :func:`verify` runs the written file (onnxruntime, or the
loaded program) on observations gathered by playing the env and compares it with
the original network, noise off. Q values must agree within a float tolerance,
``tol = sqrt(eps(dtype)) * max(1, max_a |Q(s, a)|)`` per observation (3.5e-4 of the
largest |Q| in float32). Actions must be equal wherever the reference's two best
Q values are more than ``2 * tol`` apart; closer than that, both runtimes are
right to pick either, so there the exported action only has to be one of the
near-tied best actions, and such observations are counted and reported. Any
other disagreement raises :class:`ExportMismatch`.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from agent.errors import UserError
from agent.networks import QNetwork
from agent.usage import install_hint
from agent.noisy import NoisyLinear, noise_disabled
from agent.values import q_values, support_of

__all__ = [
    "FORMATS",
    "ExportMismatch",
    "GreedyPolicy",
    "Verification",
    "collect_observations",
    "export_policy",
    "fold_noise",
    "load_exported",
    "require_format",
    "verify",
    "write_verified",
]

# Format -> file suffix.
FORMATS = {"onnx": ".onnx", "torch": ".pt2"}
INPUT_NAME = "obs"
OUTPUT_NAMES = ("q_values", "action")


class ExportMismatch(Exception):
    """The exported model does not act like the checkpoint (a defect, not a user error)."""


def fold_noise(q_network: nn.Module) -> nn.Module:
    """A copy of ``q_network`` with every NoisyLinear replaced by an ``nn.Linear`` of its means."""
    folded = copy.deepcopy(q_network)
    for parent in list(folded.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, NoisyLinear):
                linear = nn.Linear(
                    child.in_features,
                    child.out_features,
                    device=child.weight_mu.device,
                    dtype=child.weight_mu.dtype,
                )
                with torch.no_grad():
                    linear.weight.copy_(child.weight_mu)
                    linear.bias.copy_(child.bias_mu)
                setattr(parent, name, linear)
    if isinstance(folded, QNetwork):  # none of its layers is noisy any more
        folded.refresh_noisy_layers()
    return folded.eval().requires_grad_(False)


class GreedyPolicy(nn.Module):
    """``obs -> (q_values, greedy action)`` over a (folded, noise-free) Q-network."""

    def __init__(self, q_network: nn.Module) -> None:
        super().__init__()
        self.q_network = q_network

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = q_values(self.q_network(obs), support_of(self.q_network))
        return q, q.argmax(dim=-1)


def require_format(fmt: str) -> None:
    """:class:`UserError` naming the extra when ``fmt`` needs packages that are missing."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}: use onnx or torch")
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401  (torch.onnx.export's exporter)
        except ImportError as e:
            raise UserError(
                f"--format onnx needs the export extra ({e.name} is missing): "
                f"{install_hint('export')}"
            ) from None


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporters log and warn about things that do not concern a user (e.g. torchvision)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def export_policy(
    q_network: nn.Module, example_obs: np.ndarray, path: str | Path, fmt: str
) -> None:
    """Write the noise-free greedy policy of ``q_network`` to ``path`` (no verification).

    ``example_obs``: one batch ``(B, *obs_shape)`` of observations in the env's dtype;
    it fixes the input's dtype and shape, except the batch dimension, which stays dynamic.
    """
    require_format(fmt)
    policy = GreedyPolicy(fold_noise(q_network)).cpu().eval()
    example = torch.as_tensor(example_obs)
    # A batch of 1 would let the exporters specialise the batch dimension to 1.
    example = example.expand(max(2, example.shape[0]), *example.shape[1:]).contiguous()
    dynamic = {INPUT_NAME: {0: torch.export.Dim("batch")}}
    with _quiet_exporter():
        if fmt == "onnx":
            torch.onnx.export(
                policy,
                (example,),
                str(path),
                input_names=[INPUT_NAME],
                output_names=list(OUTPUT_NAMES),
                dynamic_shapes=dynamic,
                dynamo=True,
                external_data=False,  # one self-contained file
                verbose=False,
            )
        else:
            program = torch.export.export(policy, (example,), dynamic_shapes=dynamic)
            torch.export.save(program, str(path))


ExportedFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def load_exported(path: str | Path, fmt: str) -> ExportedFn:
    """Load a written file as deployment would: ``obs batch -> (q_values, actions)`` in numpy."""
    if fmt == "onnx":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        def run_onnx(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            q_values, actions = session.run(list(OUTPUT_NAMES), {INPUT_NAME: obs})
            return q_values, actions

        return run_onnx
    module = torch.export.load(str(path)).module()

    def run_torch(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            q_values, actions = module(torch.from_numpy(obs))
        return q_values.numpy(), actions.numpy()

    return run_torch


def collect_observations(
    env: gym.Env, q_network: nn.Module, count: int, *, seed: int = 0, dtype: str | None = None
) -> np.ndarray:
    """``count`` observations from playing ``env``: half greedy actions, half random ones.

    Greedy steps reach the states the policy will meet; random ones the states around
    them. Episodes are reset with seeds ``seed, seed + 1, ...``.
    """
    rng = np.random.default_rng(seed)
    policy = GreedyPolicy(q_network)
    device = next(q_network.parameters()).device
    observations = []
    episode = seed
    obs, _ = env.reset(seed=episode)
    env.action_space.seed(seed)
    with torch.inference_mode(), noise_disabled(q_network):
        while len(observations) < count:
            observations.append(np.asarray(obs, dtype=dtype))
            if rng.random() < 0.5:
                action = int(policy(torch.as_tensor(obs[None], device=device))[1][0])
            else:
                action = int(env.action_space.sample())
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                episode += 1
                obs, _ = env.reset(seed=episode)
    return np.stack(observations)


@dataclass(frozen=True)
class Verification:
    """How the exported model compared with the checkpoint's noise-free network."""

    observations: int
    near_ties: int  # observations whose two best reference Q values are within 2 * tol
    near_tie_differences: int  # of those, how many the exported model broke the other way
    max_q_error: float  # max |Q_exported - Q_reference| over every observation and action

    def summary(self) -> str:
        n, other = self.observations, self.near_tie_differences
        text = f"actions equal on {n - other} of {n} observations"
        if other:
            text += f", near-ties broken the other way on {other}"
        return f"{text} ({self.near_ties} near-ties), max |Q error| {self.max_q_error:.2g}"


def verify(
    exported: ExportedFn, q_network: nn.Module, observations: np.ndarray, batch_size: int = 256
) -> Verification:
    """Compare ``exported`` with ``q_network`` (noise off) on ``observations``.

    Raises :class:`ExportMismatch` if a Q value is off by more than the tolerance or an
    action differs where the best action is not a near-tie (see the module docstring).
    """
    device = next(q_network.parameters()).device
    dtype = next(q_network.parameters()).dtype
    q_exp, a_exp, q_ref = [], [], []
    with torch.inference_mode(), noise_disabled(q_network):
        for start in range(0, len(observations), batch_size):
            batch = observations[start : start + batch_size]
            q, a = exported(np.ascontiguousarray(batch))
            q_exp.append(np.asarray(q, dtype=np.float64))
            a_exp.append(np.asarray(a).reshape(-1))
            ref = q_values(q_network(torch.as_tensor(batch, device=device)), support_of(q_network))
            q_ref.append(ref.to(device="cpu", dtype=torch.float64).numpy())
    q_exported, actions, q_reference = (np.concatenate(x) for x in (q_exp, a_exp, q_ref))
    if q_exported.shape != q_reference.shape or actions.shape != (len(observations),):
        raise ExportMismatch(
            f"the exported model returned Q values {q_exported.shape} and actions "
            f"{actions.shape} for {len(observations)} observations (expected "
            f"{q_reference.shape} and ({len(observations)},))"
        )

    tol = math.sqrt(torch.finfo(dtype).eps) * np.maximum(1.0, np.abs(q_reference).max(axis=1))
    error = np.abs(q_exported - q_reference)
    bad_q = np.flatnonzero((error > tol[:, None]).any(axis=1))
    if len(bad_q):
        i = int(bad_q[0])
        raise ExportMismatch(
            f"Q values differ on {len(bad_q)} of {len(observations)} observations (first: "
            f"observation {i}, |error| {error[i].max():.3g} > tolerance {tol[i]:.3g})"
        )

    reference_actions = q_reference.argmax(axis=1)
    top2 = np.sort(q_reference, axis=1)[:, -2:] if q_reference.shape[1] > 1 else None
    gap = np.full(len(observations), np.inf) if top2 is None else top2[:, 1] - top2[:, 0]
    near_tie = gap <= 2 * tol
    valid = (actions >= 0) & (actions < q_reference.shape[1])
    index = np.where(valid, actions, 0).astype(np.int64)[:, None]
    chosen = np.take_along_axis(q_reference, index, axis=1)[:, 0]
    ok = valid & np.where(
        near_tie, chosen >= q_reference.max(axis=1) - 2 * tol, actions == reference_actions
    )
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise ExportMismatch(
            f"actions differ on {int((~ok).sum())} of {len(observations)} observations (first: "
            f"observation {i}, exported action {int(actions[i])}, checkpoint's "
            f"{int(reference_actions[i])}, Q gap {gap[i]:.3g})"
        )
    return Verification(
        observations=len(observations),
        near_ties=int(near_tie.sum()),
        near_tie_differences=int((near_tie & (actions != reference_actions)).sum()),
        max_q_error=float(error.max()) if error.size else 0.0,
    )


def write_verified(
    q_network: nn.Module,
    env: gym.Env,
    out: str | Path,
    fmt: str,
    *,
    observations: int = 2048,
    seed: int = 0,
    obs_dtype: str | None = None,
) -> Verification:
    """Export ``q_network`` to ``out``, verified on ``observations`` observations of ``env``.

    The model goes to a temporary file beside ``out`` and is moved there only once it
    passed :func:`verify`; one that fails is deleted (:class:`ExportMismatch`), so ``out``
    is either a verified export or untouched. A missing extra or an unwritable ``out`` is
    a :class:`UserError`, raised before anything runs.
    """
    require_format(fmt)
    out = Path(out)
    if out.is_dir():
        raise UserError(
            f"--out {out} is a directory: give a file name, e.g. {out}/policy{FORMATS[fmt]}"
        )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=FORMATS[fmt], dir=out.parent)
        os.close(fd)
    except OSError as e:
        reason = e.strerror or str(e)
        if isinstance(e, (FileExistsError, NotADirectoryError)):  # mkdir's view of it
            reason = "a part of its directory path is a file"
        raise UserError(f"cannot write {out} ({reason}): pass --out a writable path") from None
    tmp = Path(tmp_name)
    try:
        obs = collect_observations(env, q_network, observations, seed=seed, dtype=obs_dtype)
        export_policy(q_network, obs[:2], tmp, fmt)
        result = verify(load_exported(tmp, fmt), q_network, obs)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide a file meant to be shipped
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return result
