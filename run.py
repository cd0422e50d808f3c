"""Noisy DQN command line: train, evaluate, resume."""

import sys

if __name__ == "__main__":
    print("run.py: training is not implemented yet", file=sys.stderr)
    sys.exit(2)
