"""Argument types shared by the ``hpcnb`` command line and the technique tools.

``argparse`` calls a type with the text given on the command line; a bad text raises
:class:`argparse.ArgumentTypeError`, which argparse prints as one line naming the option.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["whole_number"]


def whole_number(flag: str, low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """Return an argparse type that reads an integer in ``[low, high]``.

    Args:
        flag: The option, for messages (``"--nodes"``).
        low: Smallest value accepted.
        high: Largest value accepted (no limit when ``None``).

    Example:
        >>> whole_number("--workers")("4")
        4
        >>> whole_number("--nodes", high=8)("9")
        Traceback (most recent call last):
        ...
        argparse.ArgumentTypeError: --nodes must be <= 8
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag} must be >= {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{flag} must be <= {high}")
        return value

    parse.__name__ = f"{flag.lstrip('-').replace('-', '_')}_value"
    return parse
