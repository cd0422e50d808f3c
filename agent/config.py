"""The one configuration dataclass: every key with its docstring, its checks
(:meth:`Config.validate`, each invalid value one :class:`UserError` line naming the fix),
and the key reference generated from the docstrings. How YAML files and ``--set``
resolve into it is :mod:`agent.config_files`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.errors import UserError

__all__ = ["Config", "config_reference", "config_sections", "field_docs"]


@dataclass
class Config:
    """Every hyperparameter and switch of a run. Field docs are the reference
    (docs/configuration.md is generated from them)."""

    # --- run ---
    env_id: str = "CartPole-v1"
    """gymnasium environment id (any registered id, or ``module:Env-v0``)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of every ``gymnasium.make`` of the run (training, evaluation, video),
    e.g. ``{goal_velocity: 0.02}`` for MountainCar-v0 or ``{max_episode_steps: 200}``."""
    wrappers: list[str | dict[str, dict[str, Any] | None]] = field(default_factory=list)
    """gymnasium wrappers by import path, applied in order to every env of the run as
    ``gymnasium.make`` returns it (before the Atari and MiniGrid preprocessing):
    ``module:Class`` or ``{module:Class: {key: value}}``, e.g.
    ``[minigrid.wrappers:FullyObsWrapper]``."""
    seed: int = 1
    """Seed of torch, numpy, Python and every environment episode."""
    total_steps: int = 150_000
    """Environment steps to train for (summed over vector sub-environments)."""
    num_envs: int = 1
    """Sub-environments stepped together in one gymnasium vector env."""
    vector: Literal["sync", "async", "ale"] = "sync"
    """Vector env kind: ``sync`` (one process), ``async`` (one subprocess per env; with
    ``--seeds``, every seed's subprocesses step at once, the same runs as ``sync``) or, for
    ALE games, ``ale``: ale-py's ``AtariVectorEnv``, the copies stepped by C++ threads with
    the same preprocessing (its no-ops drawn by the ALE, so not the same episodes; no
    ``wrappers``; a resume starts the interrupted episodes afresh)."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``. Small MLPs (classic
    control) train faster on the CPU: an eager update on a GPU is launch-bound."""
    dtype: Literal["float32", "float64"] = "float32"
    """Floating-point precision of the networks and of the replay batches."""
    torch_threads: int = 1
    """Intra-op threads on CPU, for torch and numpy's BLAS alike. One is fastest for small
    networks and robust under load."""

    # --- network ---
    torso: Literal["auto", "mlp", "minatar", "nature", "der"] = "auto"
    """The layers before the Q head. ``auto`` picks by the observations' shape: none
    (``mlp``) for vectors, ``minatar`` (one 3x3 convolution of 16 filters, MinAtar's DQN)
    for images under 36x36, ``nature`` (the three convolutions of Mnih et al. 2015)
    otherwise. ``der``: data-efficient Rainbow's two convolutions (van Hasselt et al. 2019:
    32 filters 5x5 stride 5, 64 filters 5x5 stride 5), for frames of 0-255 (at least
    25x25), which the network divides by 255. A torso that does not fit the observations
    is refused before training."""
    hidden_sizes: list[int] = field(default_factory=lambda: [128, 128])
    """Widths of the hidden layers of the Q head."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A)."""
    dueling_streams: Literal["hidden", "linear"] = "hidden"
    """Layers of each dueling stream. ``hidden``: a hidden layer of its own (the last of
    hidden_sizes) and an output layer, as in Wang et al. 2016 and Rainbow. ``linear``: every
    hidden layer shared and one output layer per stream, as in Revisiting Rainbow's MinAtar
    network (whose streams read the convolution's features): the head costs little more than
    a plain one (docs/research/log.md#rainbow-cost)."""
    distributional: bool = False
    """C51 head (Bellemare et al. 2017): a categorical distribution of the return over
    num_atoms atoms from v_min to v_max for each action, learned by the cross entropy to
    the projected n-step double-DQN target; actions are greedy on its expectation.
    loss and huber_delta then do not apply. See docs/training.md."""
    num_atoms: int = 51
    """Atoms of the distributional head (C51's 51), at least 2."""
    v_min: float = -100.0
    """Lowest atom of the distributional head: below the lowest discounted return the
    env can give (returns outside [v_min, v_max] are clipped to it)."""
    v_max: float = 100.0
    """Highest atom of the distributional head (Rainbow's Atari support, with clipped
    rewards, is [-10, 10])."""
    noisy_layers: Literal["all", "last", "none"] = "last"
    """Which linear layers are noisy; ``none`` gives a plain DQN (epsilon-greedy)."""
    sigma0: float = 0.5
    """Initial noise scale of the noisy layers (sigma = sigma0 / sqrt(fan_in))."""
    update_noise: float = 1.0
    """Scale of the noise that updates run both networks with, relative to the acting noise:
    1 as in the NoisyNet paper; 0: updates on the mean weights (the noise is for acting
    only and the sigmas keep their initial values). See docs/exploration.md."""

    # --- exploration ---
    exploration: Literal["noisy", "epsilon"] = "noisy"
    """``noisy``: act greedily on a noisy net. ``epsilon``: epsilon-greedy, with the noise of any
    noisy layers off everywhere (acting and learning: the sigmas stay as initialised)."""
    noise_interval: int | Literal["episode"] = "episode"
    """Acting holds one noise sample for this many steps (1: fresh every step, as in the paper),
    or ``episode``: a new sample at every episode end (with num_envs > 1: whenever any
    sub-env's episode ends). Updates use their own noise and leave the acting noise alone."""
    noise_on_repeat: bool = True
    """Noisy exploration with held noise (noise_interval other than 1): draw a new sample
    as soon as an observation repeats one seen earlier in the same episode. Under held noise
    the policy is deterministic, so in a deterministic env a repeat is a loop the same noise
    would replay until the time limit. Continuous observations practically never repeat
    exactly, so this acts in gridworlds and toy text. See docs/exploration.md."""
    noisy_epsilon: float = 0.05
    """Noisy exploration only: probability of a uniform random action at each step after
    random_starts, on top of the noise. A floor for states where the noise has stopped
    changing the action: an action whose estimate has drifted below the truth is retried.
    The n-step returns before a random action end there (replay's ``explored``). 0: the
    noise alone, as in the NoisyNet paper. See docs/exploration.md."""
    epsilon_start: float = 1.0
    """Epsilon-greedy only: initial probability of a random action."""
    epsilon_end: float = 0.05
    """Epsilon-greedy only: final probability of a random action."""
    epsilon_fraction: float = 0.1
    """Epsilon-greedy only: fraction of total_steps over which epsilon decays linearly."""
    epsilon_decay_start: int | Literal["learning_starts"] = 0
    """Epsilon-greedy only: the env step at which epsilon starts to decay; it holds
    epsilon_start until then, and decays over epsilon_fraction of total_steps from there.
    0: from the first step. ``learning_starts``: from the first update (the config's
    learning_starts), as Dopamine's ``dqn_agent.linearly_decaying_epsilon`` waits for
    ``JaxDQNAgent.min_replay_history`` (DrQ(epsilon)). A function of the step alone, so a
    resume follows it as the uninterrupted run would."""

    # --- learning ---
    buffer_size: int = 10_000
    """Replay capacity in transitions."""
    frame_replay: bool = True
    """Image stacks (C, H, W) uint8: store each frame once and rebuild stacks at sample time."""
    replay_storage: Literal["auto", "device", "pinned"] = "auto"
    """Where replay lives when training on CUDA: ``device`` (GPU memory: sampling needs no
    copy), ``pinned`` (host memory, batches copied over through pinned staging), or
    ``auto``: the GPU when the buffer fits in a quarter of its free memory, else pinned
    host memory. Frame replay (Atari) keeps its frames on the host under ``auto``;
    ``device`` puts them in GPU memory too (the indices stay on the host). On a CPU, the
    host."""
    prioritized_replay: bool = False
    """Proportional prioritized replay (Schaul et al. 2016): sample transitions in
    proportion to (|TD error| + priority_eps)^priority_alpha (the cross entropy, with a
    distributional head), new ones at the largest priority so far, each loss weighted by
    its importance-sampling weight."""
    priority_alpha: float = 0.5
    """How much priorities count, in (0, 1] (Rainbow's 0.5)."""
    priority_beta: float = 0.4
    """Importance-sampling exponent at the start, in [0, 1], annealed linearly to 1 over
    total_steps (Rainbow's 0.4)."""
    priority_eps: float = 1e-6
    """Added to every error that sets a priority, so that none is zero."""
    save_buffer: bool | Literal["auto"] = "auto"
    """Keep the replay buffer in ``checkpoints/last.pt``, which makes a resume exact (the
    run an uninterrupted one would be): ``auto`` when the buffer takes at most 1 GiB at
    full capacity (classic control, toy text, Box2D, MinAtar and MiniGrid at their
    defaults; not Atari's 1M frames, 6.7 GiB), ``true`` always, ``false`` never.
    Without it a resume starts with an empty buffer and waits learning_starts steps while
    it refills: approximate, and the messages say so. Each seed of a group or a sweep is
    judged on its own buffer."""
    batch_size: int = 32
    """Transitions per gradient update."""
    augment: Literal["none", "shift"] = "none"
    """Augmentation of every replay batch an update learns from (image observations only).
    ``shift``: DrQ's random shift (Kostrikov et al. 2021): each observation's frames,
    obs and next_obs each on their own, padded by 4 repeated border pixels and cropped back
    to their size at a random offset."""
    intensity_scale: float = 0.0
    """Intensity augmentation of every replay batch (image observations only), after
    ``augment``, as SPR and DrQ(epsilon) use it: each observation's frames, obs and
    next_obs each on their own, multiplied by 1 + intensity_scale * clip(N(0, 1), -2, 2).
    0: none; SPR's and DrQ(epsilon)'s is 0.05."""
    learning_starts: int = 500
    """Environment steps collected before the first update."""
    random_starts: int = 15_000
    """Uniform random actions for this many first env steps (SB3 and CleanRL: learning_starts);
    learning starts at learning_starts all the same, off-policy on the random data."""
    train_freq: int = 3
    """One gradient update every this many environment steps."""
    lr: float = 2e-3
    """Adam learning rate. The YAMLs of CartPole-v1, Acrobot-v1 and MountainCar-v0 keep
    0.004, the rate they were benchmarked with."""
    adam_eps: float = 1.5e-4
    """Adam epsilon."""
    gamma: float = 0.99
    """Discount factor, in (0, 1]."""
    clip_rewards: bool = False
    """Learn from sign(reward) (DQN's clipping); logged returns stay the raw score."""
    terminal_on_life_loss: bool = False
    """A lost life (info['lives'] drops) ends bootstrapping in replay; the game goes on."""
    n_step: int = 3
    """n-step returns."""
    double_dqn: bool = True
    """Choose the bootstrap action with the online net and value it with the target net."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss: Huber (robust to large TD errors) or squared error."""
    huber_delta: float = 1.0
    """Huber loss threshold."""
    max_grad_norm: float | None = 10.0
    """Clip the global gradient norm to this value; null disables clipping."""
    target_update_interval: int = 250
    """Environment steps between target network updates."""
    tau: float = 1.0
    """Target update weight: 1 copies (hard update), < 1 is a Polyak average."""
    learner_backend: Literal["auto", "torch", "numpy", "compile"] = "auto"
    """How the update's gradients are computed: ``numpy`` (a numpy program compiled from the
    network, the fastest for small networks on a CPU), ``torch`` (autograd: any network,
    any device), ``compile`` (the same autograd update with its loss and backward compiled
    by ``torch.compile``, on a CPU only: the run prints how long compiling took, or, where
    it cannot compile, says so in one line and runs the torch update) or ``auto``: on a
    CPU ``compile`` for the Atari torsos (der, nature) over a run of 50,000 updates or
    more, which pays for compiling; else numpy where it applies (CPU, the layers it
    knows), torch elsewhere (a CPU network it cannot compile is named in one warning;
    ``numpy`` on one is an error). All compute the same
    update up to float rounding, so their trajectories differ; the one that ran is written
    to config.yaml, result.json and the hparams."""
    learner_autocast: Literal["none", "bfloat16"] = "none"
    """``bfloat16``: the update's loss (the forwards, the target and the loss, and so their
    backward) runs under ``torch.autocast`` to bfloat16, while the parameters, gradients and
    Adam stay in ``dtype``. On a CPU with bfloat16 kernels (AVX-512 BF16, AMX) it makes a
    convolutional update faster (docs/performance.md#compiled-update); it needs an autograd
    backend, so ``auto`` takes ``compile`` on a CPU and ``torch`` on CUDA, and ``numpy`` is
    refused. ``none`` by default: whether it costs learning is not settled yet."""

    # --- evaluation ---
    eval_interval: int = 2_000
    """Environment steps between noise-free evaluations (0 disables them)."""
    eval_episodes: int = 10
    """Episodes per periodic evaluation."""
    confirm_episodes: int = 100
    """Episodes of the confirming evaluation before an early stop (0: stop on the periodic one)."""
    final_episodes: int | None = None
    """Episodes of the final evaluation, whose mean is the run's score (result.json's
    final_eval_return); null: confirm_episodes, or eval_episodes when that is 0."""
    best_confirm_episodes: int | None = None
    """Fresh episodes that confirm a candidate for best.pt: a periodic round whose mean beats
    best.pt's confirmed score by more than confirm_z of its standard errors (the first
    round always) plays them, and its policy replaces best.pt when their mean beats
    best.pt's (result.json's best_eval_return). An early stop's confirmation counts as
    one. null: confirm_episodes; 0: best.pt is the best periodic round, unconfirmed."""
    eval_epsilon: float = 0.0
    """Probability of a uniform random action at each step of every evaluation (the
    periodic ones, the confirmation and the final one), on top of the noise-free greedy
    policy: 0 plays it greedily; the Atari 100k protocol uses 0.001, so that a policy
    stuck in a loop ends its episode. Drawn per episode, so a score does not depend on
    how many copies play."""
    eval_envs: int = 10
    """Environment copies that play evaluation episodes at once, one batched action per
    step (at most the episodes of a round)."""
    eval_vector: Literal["sync", "async", "ale"] = "sync"
    """How the evaluation copies step: ``sync``, one after another in this process;
    ``async``, each in a worker process of its own, all at once (on several cores, the
    final 100 Atari episodes in a fraction of the time; the same scores); ``ale``, an ALE
    game's copies in ale-py's ``AtariVectorEnv`` (C++ threads; its own no-ops, so other
    episodes than sync's and async's). Not async with ``--seeds``, whose every seed would
    start its own workers."""
    confirm_z: float = 1.645
    """The confirming mean minus confirm_z standard errors must reach target_return: 1.645
    is a one-sided 95% confidence that the policy, not the luck of its episodes, is at the
    target (0: the mean alone)."""
    early_stop: bool = True
    """Stop when the confirmed noise-free evaluation reaches target_return."""
    target_return: float | None = None
    """Return that counts as solved; null uses the env spec's reward_threshold."""

    # --- logging and checkpoints ---
    log_interval: int = 1_000
    """Environment steps between TensorBoard scalar writes."""
    checkpoint_interval: int = 25_000
    """Environment steps between writes of checkpoints/last.pt."""
    track: bool = False
    """Also send the run to Weights & Biases (``--track``): every scalar TensorBoard gets,
    the resolved config, the final results, and the videos of ``--eval RUN --video DIR``.
    An extra (``pip install -e ".[track]"``); ``WANDB_MODE=offline`` keeps it on this
    machine. A W&B run that cannot start (no ``wandb login`` and no terminal to ask in)
    stops the command before training, in one line. TensorBoard stays."""
    wandb_project: str = "noisy-dqn"
    """The Weights & Biases project of a tracked run."""
    wandb_entity: str | None = None
    """The Weights & Biases entity (user or team) of a tracked run; null: W&B's default."""
    capture_graph: bool = True
    """On CUDA, capture action selection and the learner update as CUDA graphs, each
    replayed every step; a seed group (``--seeds``) captures its stacked update and acts
    eagerly (false: eager, e.g. where capture misbehaves)."""

    def validate(self, defaults: Config | None = None) -> Config:
        """Raise :class:`UserError` on the first invalid value, naming the ``--set`` that
        fixes it (with the value of ``defaults``: the env's config before the user's
        files and flags); return self."""
        check = _Checks(self, defaults)
        self._validate_run_and_network(check)
        self._validate_learning(check)
        self._validate_evaluation(check)
        return self

    def _validate_run_and_network(self, check: _Checks) -> None:
        need, at_least, default = check.need, check.at_least, check.default
        need(
            "render_mode" not in self.env_kwargs,
            "env_kwargs cannot set render_mode (--video chooses it)",
            "remove it from env_kwargs",
        )
        at_least("seed", 0)
        check.positive("total_steps")
        at_least("num_envs", 1)
        at_least("torch_threads", 1)
        need(
            self.device == "auto" or self.device == "cpu" or self.device.split(":")[0] == "cuda",
            f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}",
            "--set device=auto",
        )
        need(
            len(self.hidden_sizes) >= 1 and all(h >= 1 for h in self.hidden_sizes),
            f"hidden_sizes must be a non-empty list of positive ints, got {self.hidden_sizes}",
            "e.g. --set hidden_sizes=[128,128]",
        )
        at_least("sigma0", 0)
        at_least("update_noise", 0)
        need(
            self.noise_interval == "episode" or self.noise_interval >= 1,
            f"noise_interval must be >= 1 or episode, got {self.noise_interval}",
            default("noise_interval"),
        )
        for name in ("noisy_epsilon", "epsilon_start", "epsilon_end"):
            value = getattr(self, name)
            need(0 <= value <= 1, f"{name} must be in [0, 1], got {value}", default(name))
        need(
            0 < self.epsilon_fraction <= 1,
            f"epsilon_fraction must be in (0, 1], got {self.epsilon_fraction}",
            default("epsilon_fraction"),
        )
        need(
            self.epsilon_decay_start == "learning_starts" or self.epsilon_decay_start >= 0,
            f"epsilon_decay_start must be >= 0 or learning_starts, got {self.epsilon_decay_start}",
            default("epsilon_decay_start"),
        )
        need(
            not (self.exploration == "noisy" and self.noisy_layers == "none"),
            "exploration=noisy needs noisy layers",
            "--set noisy_layers=all (or last), or --set exploration=epsilon",
        )

    def _validate_learning(self, check: _Checks) -> None:
        need, at_least, positive = check.need, check.at_least, check.positive
        default = check.default
        at_least("buffer_size", 1)
        at_least("batch_size", 1)
        at_least("intensity_scale", 0)
        need(
            self.learner_autocast == "none" or self.learner_backend != "numpy",
            f"learner_autocast={self.learner_autocast} needs an autograd learner backend, "
            "not numpy",
            "--set learner_backend=auto (compile on a CPU), or --set learner_autocast=none",
        )
        need(
            self.batch_size <= self.buffer_size,
            f"batch_size ({self.batch_size}) is larger than buffer_size ({self.buffer_size})",
            f"--set batch_size=N with N <= {self.buffer_size}",
        )
        need(
            0 <= self.learning_starts <= self.total_steps,
            f"learning_starts ({self.learning_starts}) must be in [0, total_steps "
            f"({self.total_steps})]",
            f"--set learning_starts=N with {min(self.batch_size, self.total_steps)} <= N <= "
            f"{self.total_steps}, or a larger --total-steps",
        )
        need(
            self.learning_starts >= self.batch_size,
            f"learning_starts ({self.learning_starts}) must be >= batch_size ({self.batch_size})",
            f"--set learning_starts={self.batch_size}",
        )
        if self.distributional:
            need(
                self.num_atoms >= 2,
                f"a distributional head needs at least 2 atoms, got num_atoms={self.num_atoms}",
                "--set num_atoms=51",
            )
            need(
                self.v_min < self.v_max,
                f"the distributional support is empty: v_min ({self.v_min}) must be below "
                f"v_max ({self.v_max})",
                "e.g. --set v_min=-100 --set v_max=100",
            )
        need(
            0 < self.priority_alpha <= 1,
            f"priority_alpha must be in (0, 1], got {self.priority_alpha}",
            default("priority_alpha"),
        )
        need(
            0 <= self.priority_beta <= 1,
            f"priority_beta must be in [0, 1], got {self.priority_beta}",
            default("priority_beta"),
        )
        positive("priority_eps")
        at_least("random_starts", 0)
        # A warm-up the user set that outlasts the run is a mistake; the env's own default
        # outlasting a short trial run is only announced (train's start-up lines).
        need(
            self.random_starts < self.total_steps
            or check.defaults is None
            or self.random_starts == check.defaults.random_starts,
            f"random_starts ({self.random_starts:,}) is not shorter than the run (total_steps "
            f"{self.total_steps:,}): the policy would never act",
            f"--set random_starts=N with N < {self.total_steps}, or a larger --total-steps",
        )
        at_least("train_freq", 1)
        positive("lr")
        positive("adam_eps")
        need(0 < self.gamma <= 1, f"gamma must be in (0, 1], got {self.gamma}", default("gamma"))
        at_least("n_step", 1)
        positive("huber_delta")
        need(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            f"max_grad_norm must be > 0 or null, got {self.max_grad_norm}",
            "--set max_grad_norm=10 (or null)",
        )
        at_least("target_update_interval", 1)
        need(0 < self.tau <= 1, f"tau must be in (0, 1], got {self.tau}", default("tau"))

    def _validate_evaluation(self, check: _Checks) -> None:
        need, at_least = check.need, check.at_least
        at_least("eval_interval", 0)
        at_least("eval_episodes", 1)
        at_least("confirm_episodes", 0)
        need(
            self.final_episodes is None or self.final_episodes >= 1,
            f"final_episodes must be >= 1 or null, got {self.final_episodes}",
            "--set final_episodes=100 (or null)",
        )
        need(
            self.best_confirm_episodes is None or self.best_confirm_episodes >= 0,
            f"best_confirm_episodes must be >= 0 or null, got {self.best_confirm_episodes}",
            "--set best_confirm_episodes=100 (or null)",
        )
        need(
            0 <= self.eval_epsilon <= 1,
            f"eval_epsilon must be in [0, 1], got {self.eval_epsilon}",
            check.default("eval_epsilon"),
        )
        at_least("eval_envs", 1)
        at_least("confirm_z", 0)
        at_least("log_interval", 1)
        at_least("checkpoint_interval", 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Checks:
    """What :meth:`Config.validate` checks with: each failure one :class:`UserError` line
    naming the ``--set`` that fixes it (``defaults``: the env's config before the user's
    files and flags)."""

    def __init__(self, cfg: Config, defaults: Config | None) -> None:
        self.cfg, self.defaults = cfg, defaults

    def need(self, ok: bool, what: str, fix: str) -> None:
        if not ok:
            raise UserError(f"invalid config: {what}: {fix}")

    def default(self, name: str) -> str:
        value = getattr(self.defaults or Config(), name)
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        return f"--set {name}={text}"

    def at_least(self, name: str, low: float) -> None:
        value = getattr(self.cfg, name)
        self.need(value >= low, f"{name} must be >= {low}, got {value}", self.default(name))

    def positive(self, name: str) -> None:
        value = getattr(self.cfg, name)
        self.need(value > 0, f"{name} must be > 0, got {value}", self.default(name))


def config_reference() -> str:
    """Markdown tables of every key, its default and its doc, one per section of
    :class:`Config`: the documentation's configuration reference, generated so that it
    cannot drift from the code."""
    docs = field_docs()
    defaults = Config().to_dict()
    out: list[str] = []
    for title, names in config_sections():
        out += ["", f"### {title.capitalize()}", "",
                "| key | default | meaning |", "| --- | --- | --- |"]  # fmt: skip
        for name in names:
            value = defaults[name]
            value = value if isinstance(value, str) else json.dumps(value)
            if "e" in value and "." not in value and value[-1].isdigit():
                value = value.replace("e", ".0e")  # 1e-06 reads back as a YAML float
            doc = docs[name].replace("|", "\\|")
            out.append(f"| `{name}` | `{value}` | {doc} |")
    return "\n".join(out).strip() + "\n"


def config_sections() -> list[tuple[str, list[str]]]:
    """(title, field names) of each section of :class:`Config`, in order: the fields (read
    with ``ast``, as :func:`field_docs` reads their docs) under each ``# --- title ---``
    comment of its source."""
    source = inspect.getsource(Config)
    headers = [(i + 1, line.strip().strip("# -"))
               for i, line in enumerate(source.splitlines())
               if line.strip().startswith("# ---")]  # fmt: skip
    sections: list[tuple[str, list[str]]] = [(title, []) for _, title in headers]
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = [i for i, (line, _) in enumerate(headers) if line < node.lineno]
            if above:
                sections[above[-1]][1].append(node.target.id)
    return sections


def field_docs() -> dict[str, str]:
    """The docstring under each field of :class:`Config`, for ``--list-config`` and the
    documentation's configuration reference."""
    tree = ast.parse(inspect.getsource(Config))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
