"""A run's learning curve as a PNG: return against env steps and against wall time.

    python -m bench.curve RUN_DIR --out curve.png [--title TEXT]

Reads the run's TensorBoard events, every piece of a resumed run (one event file per
process): the noise-free evaluations (``eval/mean_return``) and the training episodes
(``charts/episodic_return``, as a moving mean). A resumed piece starts again from its
checkpoint's step: the steps an earlier piece logged past it are dropped. Wall time is the
time the pieces ran, the gaps between them left out. Prints the evaluations as a table,
with the steps per second of each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

EVAL, EPISODES = "eval/mean_return", "charts/episodic_return"

Point = tuple[int, float, float]  # (env step, wall seconds into the run, value)


def read_curves(run_dir: Path, tags: tuple[str, ...] = (EVAL, EPISODES)) -> dict[str, list[Point]]:
    """Each tag's points over the run's pieces, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pieces = []  # per event file: (opened, last event, first step, {tag: [(step, wall, value)]})
    for path in Path(run_dir).glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        names = acc.Tags()["scalars"]
        every = [e for t in names for e in acc.Scalars(t)]
        if not every:
            continue
        points = {t: [(e.step, e.wall_time, e.value) for e in acc.Scalars(t)]
                  for t in tags if t in names}  # fmt: skip
        # the piece starts when its writer opened the file (as the run's loop starts), or
        # at its first scalar where that was written with an earlier time
        start = min(acc.FirstEventTimestamp(), *(e.wall_time for e in every))
        pieces.append((start, max(e.wall_time for e in every), min(e.step for e in every),
                       points))  # fmt: skip
    pieces.sort(key=lambda piece: piece[0])  # in the order they ran
    curves: dict[str, list[Point]] = {t: [] for t in tags}
    elapsed = 0.0  # wall seconds of the earlier pieces
    for i, (start, end, _, points) in enumerate(pieces):
        # the next piece's first step: what this one logged from there on was redone
        resumed_at = pieces[i + 1][2] if i + 1 < len(pieces) else None
        for tag, tag_points in points.items():
            curves[tag] += [(step, elapsed + wall - start, value) for step, wall, value
                            in tag_points if resumed_at is None or step < resumed_at]  # fmt: skip
        elapsed += end - start
    return {t: sorted(p) for t, p in curves.items()}


def moving_mean(values: list[float], window: int = 20) -> np.ndarray:
    """The mean of each value with the ``window - 1`` before it (fewer at the start)."""
    sums = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, len(values) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def draw(curves: dict[str, list[Point]], out: Path, title: str) -> None:
    """Two panels: return against env steps, and against wall minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x, label in ((axes[0], 0, "env steps"), (axes[1], 1, "wall minutes")):
        episodes, evals = curves.get(EPISODES, []), curves.get(EVAL, [])
        scale = 60.0 if x == 1 else 1.0
        if episodes:
            xs = [p[x] / scale for p in episodes]
            ax.plot(xs, moving_mean([p[2] for p in episodes]), color="tab:blue", alpha=0.6,
                    label="training episodes (mean of 20)")  # fmt: skip
        if evals:
            ax.plot([p[x] / scale for p in evals], [p[2] for p in evals], "o-",
                    color="tab:orange", label="noise-free evaluation")  # fmt: skip
        ax.set_xlabel(label)
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", default=None, help="the figure's title (default: RUN_DIR)")
    args = parser.parse_args()
    curves = read_curves(args.run_dir)
    if not any(curves.values()):
        print(f"error: no training scalars under {args.run_dir}: give a run directory (it "
              "holds events.out.tfevents.* files)", file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    draw(curves, args.out, args.title or str(args.run_dir))
    print("| env steps | wall min | steps/s | noise-free return |")
    print("|---|---|---|---|")
    for step, wall, value in curves[EVAL]:
        rate = f"{step / wall:.0f}" if wall >= 1.0 else "-"
        print(f"| {step:,} | {wall / 60:.1f} | {rate} | {value:.1f} |")
    if curves[EPISODES]:
        step, wall, _ = curves[EPISODES][-1]
        last = moving_mean([p[2] for p in curves[EPISODES]])[-1]
        print(f"training: {step:,} steps in {wall / 60:.1f} min ({step / max(wall, 1.0):.0f} "
              f"steps/s), the last 20 episodes' mean return {last:.1f}")  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
