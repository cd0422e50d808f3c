"""Benchmark scripts, run from the checkout's root as modules (``python -m bench.suite``).

Each script measures one thing and prints its table; the figures in docs/ come from them.
They share helpers by importing each other as ``bench.<script>`` (``bench.acting``'s
timing helpers, ``bench.cartpole``'s runs of ``run.py`` and SB3). This package is not
part of the wheel: it needs a checkout, with the agent installed (``pip install -e .``).
"""
