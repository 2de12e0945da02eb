"""
The command line's conventions shared by every script, with no torch (a script's --help answers before torch
loads): the argparse types of numbers and seeds, and the commit a run records. Floor 0: it imports no project module.
"""
import argparse
import math
import subprocess
from pathlib import Path


def at_least(low, kind=int, why=""):
    """An argparse type: a number of `kind` >= low (finite), else argparse's one-line error."""
    def parse(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (math.isfinite(v) and v >= low):
            rule = f"must be at least {low}" if kind is int else f"must be a finite number >= {low}"
            raise argparse.ArgumentTypeError(f"{s}: {rule}" + (f" ({why})" if why else ""))
        return v
    return parse


def positive(s):
    v = at_least(0.0, float)(s)
    if v == 0:
        raise argparse.ArgumentTypeError(f"{s}: must be a finite number > 0")
    return v


def seed_value(s):
    v = at_least(0)(s)
    if v >= 2 ** 63:
        raise argparse.ArgumentTypeError(f"{s}: must be in 0 .. 2^63 - 1")
    return v


def git_sha():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
