"""The one error base of the project.

Every error hpcnb raises on purpose derives from :class:`HpcnbError`, so a caller can
catch the project's errors without catching programming mistakes. Subclasses that
replace a built-in error also derive from it (``RecordError`` is a ``ValueError``), so
code written against the built-in keeps working. A module with errors of its own defines a
subclass (``WorkloadError``); the three general ones here serve the rest:

- :class:`InvalidInputError` (a ``ValueError``): an argument or input value that is not valid;
- :class:`InvalidTypeError` (a ``TypeError``): an argument of the wrong type;
- :class:`InvalidStateError` (a ``RuntimeError``): a call that the object's state does not allow;
- :class:`MissingFileError` (a ``FileNotFoundError``): a file or folder that is not there;
- :class:`UnknownNameError` (a ``KeyError``): a name that is not in a table.
"""

from __future__ import annotations

__all__ = [
    "ClaimError",
    "HpcnbError",
    "InvalidInputError",
    "InvalidStateError",
    "InvalidTypeError",
    "MissingFileError",
    "RecordError",
    "UnknownNameError",
]


class HpcnbError(Exception):
    """Base class of every error raised on purpose by hpcnb."""


class InvalidInputError(HpcnbError, ValueError):
    """An argument or input value is not valid (the message says which and why)."""


class InvalidTypeError(HpcnbError, TypeError):
    """An argument has the wrong type (the message names it and what was expected)."""


class InvalidStateError(HpcnbError, RuntimeError):
    """The call is not possible in the object's present state (not fitted, closed, ...)."""


class MissingFileError(HpcnbError, FileNotFoundError):
    """A file or folder the call needs is not there (the message names it)."""


class UnknownNameError(HpcnbError, KeyError):
    """A name that is not in the table it is looked up in (the message lists valid ones)."""

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class RecordError(HpcnbError, ValueError):
    """A record is malformed: bad key, non-finite value, unreadable target or interval."""


class ClaimError(HpcnbError, ValueError):
    """A claim is malformed or names a record that was not emitted."""
