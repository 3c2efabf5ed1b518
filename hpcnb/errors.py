"""The one error base of the project.

Every error hpcnb raises on purpose derives from :class:`HpcnbError`, so a caller can
catch the project's errors without catching programming mistakes. Subclasses that
replace a built-in error also derive from it (``RecordError`` is a ``ValueError``), so
code written against the built-in keeps working.
"""

from __future__ import annotations

__all__ = ["ClaimError", "HpcnbError", "RecordError"]


class HpcnbError(Exception):
    """Base class of every error raised on purpose by hpcnb."""


class RecordError(HpcnbError, ValueError):
    """A record is malformed: bad key, non-finite value, unreadable target or interval."""


class ClaimError(HpcnbError, ValueError):
    """A claim is malformed or names a record that was not emitted."""
