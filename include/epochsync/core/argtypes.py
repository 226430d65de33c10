"""Types of the command line's arguments that more than one verb takes."""

from __future__ import annotations

import argparse


def _whole(text: str, minimum: int, below: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(below.format(value=value))
    return value


def epoch_number(text: str) -> int:
    """An epoch as ``--epoch`` or ``--through`` take it: a whole number of at least 1 (epoch 0 is the
    empty start no run replicates); anything else is a usage error naming the value."""
    return _whole(text, 1, "epoch {value}: epochs are numbered from 1")


def non_negative(text: str) -> int:
    """A whole number of 0 or more (a usage error naming the value otherwise)."""
    return _whole(text, 0, "must be 0 or more, got {value}")
