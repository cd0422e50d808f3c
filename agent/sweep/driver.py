"""The sweep's driver: start or join Ray, run every trial that is not done, write the summary.

Each Ray task has one CPU and one torch thread and trains some seeds of one grid point
together, their networks stacked (:func:`agent.sweep.worker.run_trials`): as many seeds
per task as it takes to give every CPU one task (one seed per task where the env's
observations are images: they stack, but whether stacking them on one CPU pays is not
measured yet). Plain tasks rather than Ray Tune: a
seed x grid sweep is a fixed list of independent trials (no search algorithm, no
scheduler), and keeping the state in our own run directories (not in Tune's experiment
pickles) makes ``--resume``, retries and the summary readable and checkable file by
file; it also needs only the ``ray`` core package.

Ray is imported when a sweep starts (:func:`run_sweep`), not with this module.
"""

from __future__ import annotations

import contextlib
import math
import signal
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.usage import command
from agent.errors import UserError
from agent.sweep.report import format_number, write_summary
from agent.sweep.trials import DONE, Trial, by_grid_point, read_result, remaining, trial_state
from agent.sweep.worker import run_trials, unpack

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "check_address",
    "done_line",
    "end_sweep",
    "run_sweep",
    "tasks",
]

EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports after Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM: what a scheduler expects after its SIGTERM


class _Display:
    """Trial events as lines; on a terminal also one status line, rewritten in place."""

    def __init__(self, total: int, live: bool, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.live = live and self.stream.isatty()
        self.total = total
        self.done = self.failed = self.running = 0
        self.best: tuple[float, str] | None = None
        self.start = time.perf_counter()
        self._shown = False

    def _clear(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self._shown = False

    def event(self, text: str) -> None:
        self._clear()
        print(text, file=self.stream, flush=True)
        self.status()

    def counts(self) -> str:
        pending = self.total - self.done - self.failed - self.running
        best = "" if self.best is None else f" | best {self.best[0]:.1f} ({self.best[1]})"
        return (
            f"{self.running} running, {self.done} done, {self.failed} failed, {pending} pending"
            f"{best}"
        )

    def status(self) -> None:
        if self.live:
            elapsed = time.perf_counter() - self.start
            self.stream.write(f"\r\033[K[{elapsed:6.0f} s] {self.counts()}")
            self.stream.flush()
            self._shown = True

    def close(self) -> None:
        self._clear()


def _error_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _deterministic(exc: BaseException) -> bool:
    """A failure that retrying cannot fix: a bad config value, a diverged run."""
    from agent.learner import NonFiniteError

    cause = getattr(exc, "cause", None)
    return isinstance(exc, (UserError, NonFiniteError)) or isinstance(
        cause, (UserError, NonFiniteError)
    )


def check_address(address: str) -> None:
    """Fail fast, in one line, on an address nothing listens at (ray.init can hang)."""
    if address == "auto":
        return
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UserError(
            f"--ray-address {address}: expected HOST:PORT of a Ray head (e.g. 10.0.0.5:6379), "
            "ray://HOST:10001, or auto"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
            pass
    except OSError as e:
        raise UserError(
            f"--ray-address {address}: cannot reach a Ray head there ({e.strerror or e}); "
            "start one with: ray start --head, or drop --ray-address to run locally"
        ) from None


def _init_ray(address: str | None, num_cpus: int | None) -> Any:
    import logging

    import ray

    if address is None:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
        )
        return ray
    check_address(address)
    root = Path(__file__).resolve().parents[2]  # agent/sweep/driver.py -> the checkout
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            logging_level=logging.WARNING,
            # Ship this checkout's code so every node runs the same version.
            runtime_env={"py_modules": [str(root / "agent"), str(root / "envs")]},
        )
    except Exception as e:  # ConnectionError, version mismatch, auth: one line
        raise UserError(
            f"--ray-address {address}: cannot join the Ray cluster ({_error_line(e)}); "
            "check the address printed by `ray start --head` and that Ray versions match"
        ) from None
    return ray


class _SigtermAsCtrlC:
    """SIGTERM stops the sweep as the first Ctrl-C does; the exit status tells them apart.

    SIGTERM is what Slurm, Kubernetes, systemd and preemptible machines send before they
    kill a job, often to every process of it. Two things would turn it into lost work:

    - The Ray daemons a local sweep starts (raylet, GCS, agents) are children of this
      process, in its process group, and the raylet answers SIGTERM by killing the running
      trials before they can save. Inside this context SIGTERM is blocked, so daemons
      started there inherit the block (as Ray starts them with SIGINT blocked against
      Ctrl-C): the driver stops the trials, then ``ray.shutdown`` ends the daemons (with
      SIGKILL when they do not answer its SIGTERM).
    - ``ray.init`` installs a SIGTERM handler that exits at once. :meth:`arm` replaces it
      with one that raises KeyboardInterrupt, then unblocks SIGTERM here: one that came
      while Ray started is delivered at that point.
    """

    def __init__(self) -> None:
        self.received = False
        self._mask: set[signal.Signals] | None = None
        self._previous: Any = None

    def __enter__(self) -> _SigtermAsCtrlC:
        if hasattr(signal, "pthread_sigmask"):  # not on Windows
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        return self

    def arm(self) -> None:
        """From now on SIGTERM raises KeyboardInterrupt (call it after ``ray.init``)."""
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self._previous = None
        if self._mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = True
        raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if self._mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)


def run_sweep(
    sweep_dir: Path,
    manifest: dict[str, Any],
    trials: list[Trial],
    *,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    retries: int = 1,
    progress: bool = True,
    trials_fn: Callable[..., list[dict[str, Any]]] = run_trials,
    stop_grace_s: float = 60.0,
    out: Any = None,
    on_done: Callable[[Trial], None] | None = None,
) -> int:
    """Run every trial that is not done yet; write the summary. Returns the exit status.

    0: every trial finished; 1: some failed (the others are kept and summarised);
    130: interrupted by Ctrl-C, 143: by SIGTERM (either way the running trials save a
    checkpoint, finished trials are kept, and ``--resume SWEEP_DIR`` runs the rest).
    ``on_done``: called with each trial that finishes, as its result comes back.
    """
    out = out or sys.stdout
    start = time.perf_counter()
    todo = remaining(sweep_dir, trials)
    skipped = len(trials) - len(todo)
    display = _Display(len(trials), progress)
    display.done = skipped
    interrupted = False
    sigterm = _SigtermAsCtrlC()
    failed: dict[str, str] = {}
    if skipped:
        print(f"{skipped} of {len(trials)} trials already finished: not run again", file=out)
    if todo:
        with sigterm:  # Ray's daemons start with SIGTERM blocked: see _SigtermAsCtrlC
            ray = _init_ray(ray_address, num_cpus)
            try:
                sigterm.arm()  # from here on SIGTERM stops the sweep as Ctrl-C does
                cpus = ray.cluster_resources().get("CPU", 1)
                where = "local Ray" if ray_address is None else f"Ray cluster at {ray_address}"
                print(
                    f"sweep: {len(todo)} trials on {where} ({cpus:.0f} CPUs, one per trial)\n"
                    f"sweep directory: {sweep_dir}\n"
                    f"watch it with: tensorboard --logdir {sweep_dir}",
                    file=out,
                    flush=True,
                )
                interrupted = _drive(
                    ray, sweep_dir, manifest, todo, retries, trials_fn, display, failed,
                    stop_grace_s, on_done,
                )  # fmt: skip
            except KeyboardInterrupt:  # outside _drive, which stops its own trials: none run
                interrupted = True
            finally:
                display.close()
                ray.shutdown()
    return end_sweep(
        sweep_dir, manifest, trials, time.perf_counter() - start, interrupted,
        sigterm.received, out,
    )  # fmt: skip


def end_sweep(
    sweep_dir: Path,
    manifest: dict[str, Any],
    trials: list[Trial],
    wall: float,
    interrupted: bool,
    sigterm: bool,
    out: Any,
) -> int:
    """Write and print the summary, say how to continue; returns the exit status."""
    summary, text, note = write_summary(sweep_dir, manifest, trials, wall)
    print("\n" + text, file=out)
    print(f"summary: {sweep_dir}/summary.md, {sweep_dir}/summary.json", file=out)
    if note:
        print(note, file=out)
    else:
        print(f"curves: {sweep_dir}/eval_curves.png", file=out)
    if interrupted:
        print(
            f"interrupted: {summary['trials_done']} of {len(trials)} trials finished and kept; "
            f"run the rest with: {command()} --resume {sweep_dir}",
            file=out,
        )
        results = [read_result(sweep_dir / t.run_dir) or {} for t in trials]
        notes = [r.get("buffer_left_out") for r in results if r.get("status") == "interrupted"]
        for note in dict.fromkeys(n for n in notes if n):
            print(f"note: the interrupted trials' checkpoints/last.pt were saved {note}", file=out)
        return EXIT_TERMINATED if sigterm else EXIT_INTERRUPTED
    if summary["trials_failed"]:
        print(
            f"{summary['trials_failed']} trial(s) failed (see summary.md); retry them with: "
            f"{command()} --resume {sweep_dir}",
            file=out,
        )
        return 1
    return 0


def done_line(name: str, result: dict[str, Any]) -> str:
    """How one trial ended, for the sweep's display."""
    final = result.get("final_eval_return")
    solved = result.get("solved_step")
    how = f"solved at {solved}" if solved is not None else "finished"
    return (
        f"done    {name}: {how}, final return {format_number(final)}, "
        f"{result['wall_time_s']:.0f} s"
    )


def tasks(todo: list[Trial], cpus: int, stacks: Callable[[Trial], bool]) -> list[list[Trial]]:
    """The trials as Ray tasks: each grid point's seeds in chunks of ``ceil(len(todo) /
    cpus)``, so that every CPU gets work and each task stacks as many seeds as it can;
    one trial per task for a grid point whose trials do not ``stacks``."""
    size = max(1, math.ceil(len(todo) / max(1, cpus)))
    units: list[list[Trial]] = []
    for group in by_grid_point(todo):
        step = size if stacks(group[0]) else 1
        units += [group[i : i + step] for i in range(0, len(group), step)]
    return units


def _stacks(trial: Trial) -> bool:
    """True when the trial's env has vector observations: its seeds share a task (image
    seeds stack in one process too, but keep a task each until stacking them on one CPU
    is measured)."""
    from envs import inspect_env

    try:
        spec = inspect_env(trial.config["env_id"], trial.config.get("env_kwargs") or {},
                           trial.config.get("wrappers") or [])  # fmt: skip
    except Exception:  # the trial reports it when it runs
        return False
    return len(spec.obs_shape) == 1


def _drive(
    ray: Any, sweep_dir: Path, manifest: dict[str, Any], todo: list[Trial], retries: int,
    trials_fn: Callable[..., list[dict[str, Any]]], display: _Display, failed: dict[str, str],
    stop_grace_s: float, on_done: Callable[[Trial], None] | None = None,
) -> bool:  # fmt: skip
    """Submit tasks as CPUs free up, collect results, retry crashes. True if interrupted."""
    remote = ray.remote(num_cpus=1, max_retries=0)(trials_fn)
    capacity = max(1, int(ray.cluster_resources().get("CPU", 1)))
    queue: deque[list[Trial]] = deque(tasks(todo, capacity, _stacks))
    attempts: dict[str, int] = {}
    in_flight: dict[Any, list[Trial]] = {}
    sweep_id = manifest["sweep_id"]

    def submit(unit: list[Trial]) -> None:
        attempts[unit[0].name] = attempts.get(unit[0].name, 0) + 1
        ref = remote.remote([t.__dict__ for t in unit], str(sweep_dir.resolve()), sweep_id)
        in_flight[ref] = unit
        display.running = sum(len(u) for u in in_flight.values())

    def fail(t: Trial, line: str, details: str) -> None:
        run_dir = sweep_dir / t.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / "error.txt").exists():
            (run_dir / "error.txt").write_text(f"{line}\n\n{details}")
        failed[t.name] = line
        display.failed += 1
        display.event(f"FAILED  {t.name}: {line}")

    def collect(ref: Any, stopping: bool) -> None:
        unit = in_flight.pop(ref)
        display.running = sum(len(u) for u in in_flight.values())
        try:
            results = ray.get(ref)
        except Exception as e:
            if stopping or type(e).__name__ == "TaskCancelledError":
                return
            line = _error_line(e)
            rest = [t for t in unit if trial_state(sweep_dir, t) != "done"]
            if not _deterministic(e) and attempts[unit[0].name] <= retries and rest:
                display.event(f"retry   {unit[0].name}: attempt {attempts[unit[0].name]} "
                              f"failed: {line}")  # fmt: skip
                attempts[rest[0].name] = attempts[unit[0].name]
                queue.append(rest)
                return
            details = f"attempts: {attempts[unit[0].name]}\n\n" + "".join(
                traceback.format_exception(e)
            )
            for t in rest:
                fail(t, line, details)
            return
        for t, res in zip(unit, results, strict=True):
            if "error" in res:  # this seed failed alone (diverged)
                fail(t, res["error"], res["error"])
                continue
            run_dir = sweep_dir / t.run_dir
            if res.get("archive") and read_result(run_dir) is None:
                unpack(res["archive"], run_dir)
            if res["status"] not in DONE:  # stopped by its own SIGINT
                continue
            display.done += 1
            final = res.get("final_eval_return")
            if final is not None and (display.best is None or final > display.best[0]):
                display.best = (final, t.name)
            display.event(f"{done_line(t.name, res)} | {display.counts()}")
            if on_done is not None:
                on_done(t)

    try:
        while queue or in_flight:
            capacity = max(1, int(ray.cluster_resources().get("CPU", 1)))  # nodes may join
            while queue and len(in_flight) < capacity:
                submit(queue.popleft())
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in ready:
                collect(ref, stopping=False)
            display.status()
        return False
    except KeyboardInterrupt:
        display.event(
            f"stopping: {len(in_flight)} running task(s) save a checkpoint and stop "
            "(Ctrl-C again to kill them)"
        )
        try:
            for ref in in_flight:
                ray.cancel(ref, force=False)  # SIGINT in the task: train() saves and returns
            ready, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=stop_grace_s)
            for ref in ready:
                collect(ref, stopping=True)
        except KeyboardInterrupt:
            pass
        for ref in list(in_flight):
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        return True
