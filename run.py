"""``python run.py ...`` from a checkout: the same command line as the installed ``noisy-dqn``."""

import sys

from agent.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
