"""The one exception type that run.py turns into a one-line message and exit status 2."""

__all__ = ["UserError"]


class UserError(Exception):
    """A mistake the user can fix: the message names the problem and the fix, in one line."""
