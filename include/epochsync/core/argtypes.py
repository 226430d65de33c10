"""Types of the command line's arguments that more than one verb takes."""

from __future__ import annotations

import argparse


def epoch_number(text: str) -> int:
    """An epoch as ``--epoch`` or ``--through`` take it: a whole number of at least 1 (epoch 0 is the
    empty start no run replicates); anything else is a usage error naming the value."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an epoch (a whole number of at least 1)") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"epoch {n}: epochs are numbered from 1")
    return n
