"""Benchmark: NoisyLinear's noisy forward, materialised vs factorised, by layer size and rows.

    python -m bench.noisy_forward            # about half a minute on CPU
    python -m bench.noisy_forward --quick

The layer computes ``x (mu + sigma * eps_out eps_in^T)^T + b``. Materialised: build
the noisy weight matrix (an out x in ``addcmul``), then one matmul. Factorised:
``x mu^T + ((x * eps_in) sigma^T) * eps_out``: two matmuls, no out x in temporary.
``NoisyLinear.forward`` picks the factorised form for at most ``FACTORISED_MAX_ROWS``
rows through a layer of at least ``FACTORISED_MIN_WEIGHTS`` weights; this script
measures both forms on both sides of those thresholds (forced through the constants),
under ``torch.no_grad()`` as acting runs, one torch thread, on every device present.
Medians of single calls, median over repeats, the two forms interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import agent.noisy as noisy
from bench.acting import machine

SHAPES = [(64, 64), (128, 2), (256, 256), (512, 512), (3136, 512)]
ROWS = [1, 4, 8, 32]


def time_form(layer: noisy.NoisyLinear, x: torch.Tensor, factorised: bool, calls: int) -> float:
    """Median microseconds of one forward, with the form forced."""
    noisy.FACTORISED_MAX_ROWS = 1 << 30 if factorised else -1
    noisy.FACTORISED_MIN_WEIGHTS = 0
    times = []
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    with torch.no_grad():
        for _ in range(calls):
            start = time.perf_counter_ns()
            layer(x)
            sync()
            times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    calls, repeats = (100, 3) if args.quick else (500, 7)
    rows_max, weights_min = noisy.FACTORISED_MAX_ROWS, noisy.FACTORISED_MIN_WEIGHTS
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"Machine: {machine()}")
    print(f"medians of {calls} calls, median over {repeats} repeats\n")
    print("| device | layer (in x out) | rows | materialised (µs) | factorised (µs) "
          "| materialised / factorised | forward picks |")
    print("|---|---|---|---|---|---|---|")
    for device in devices:
        for n_in, n_out in SHAPES:
            layer = noisy.NoisyLinear(n_in, n_out, device=device)
            for rows in ROWS:
                x = torch.randn(rows, n_in, device=device)
                medians: dict[bool, list[float]] = {False: [], True: []}
                for _ in range(repeats):
                    for form in (False, True):
                        medians[form].append(time_form(layer, x, form, calls))
                mat, fac = (statistics.median(medians[f]) for f in (False, True))
                picks = rows <= rows_max and n_in * n_out >= weights_min
                print(f"| {device} | {n_in} x {n_out} | {rows} | {mat:.1f} | {fac:.1f} "
                      f"| {mat / fac:.2f} | {'factorised' if picks else 'materialised'} |")


if __name__ == "__main__":
    main()
