"""Extension points: the one resolver of ``"package.module:attr"`` names and the registry type.

Every place where a user can bring their own piece (a batch scheduler, a PipeInfer draft, a
Winograd target, an MPI factory) resolves names through :class:`Registry` or :func:`load`:

- a built-in name (``"easy"``) is looked up in the registry;
- ``"package.module:attr"`` imports ``package.module`` and returns its attribute ``attr``
  (dotted attributes such as ``"pkg.mod:Class.factory"`` are followed), the form of
  Python's entry points. A module that registers things when imported can be named
  without an attribute in :meth:`Registry.get`: ``"package.module:"`` imports it and then
  looks the name up again.

Because the name is plain text, it travels through a command line, a job's JSON or a YAML
grid, and an MPI rank that receives it imports the same module itself.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from hpcnb.errors import HpcnbError

__all__ = ["PluginError", "Registry", "is_reference", "load"]

T = TypeVar("T")

_REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:([A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)?$")
#: Longest reference accepted, in characters.
MAX_REFERENCE = 300


class PluginError(HpcnbError, ValueError):
    """A plug-in name that cannot be resolved: malformed, not importable, or the wrong kind."""


def is_reference(name: str) -> bool:
    """Whether ``name`` has the form ``"package.module:attr"`` (or ``"package.module:"``).

    Args:
        name: A name given by a user.

    Example:
        >>> is_reference("mypkg.sched:Greedy"), is_reference("easy")
        (True, False)
    """
    return isinstance(name, str) and ":" in name


def load(reference: str, *, what: str = "object") -> Any:
    """Import ``"package.module:attr"`` and return the attribute.

    Args:
        reference: ``"package.module:attr"``; ``attr`` may be dotted.
        what: What is being loaded, for messages (``"scheduler"``, ``"draft"``).

    Returns:
        The object (for ``"package.module:"``, the module).

    Raises:
        PluginError: The reference is malformed, its module does not import, or it has
            no such attribute.

    Example:
        >>> load("hpcnb.errors:HpcnbError").__name__
        'HpcnbError'
    """
    if not isinstance(reference, str) or len(reference) > MAX_REFERENCE:
        raise PluginError(f"{what} {reference!r}: expected a 'package.module:attr' text")
    if not _REFERENCE.match(reference):
        raise PluginError(
            f"{what} {reference!r}: expected 'package.module:attr' (dotted Python names)"
        )
    module_name, _, attr = reference.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"{what} {reference!r}: cannot import {module_name!r} ({exc})") from None
    except Exception as exc:  # the user's module failed while importing
        raise PluginError(
            f"{what} {reference!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split(".") if attr else []:
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(
                f"{what} {reference!r}: {module_name!r} has no attribute {attr!r}"
            ) from None
    return obj


class Registry(Generic[T]):
    """Named extension objects of one kind, resolvable by name or by reference.

    Args:
        what: What the entries are, for messages (``"scheduler"``).
        check: Optional validator: returns an error text for an object of the wrong kind,
            ``None`` for a good one; applied on :meth:`register` and on loaded references.
        builtins: Optional module that registers the built-in entries; it is imported the
            first time the registry is read, so a registry defined in a low module can hold
            entries of a module that imports it.

    Example:
        >>> reg: Registry[type] = Registry("error class")
        >>> _ = reg.register("base", HpcnbError)
        >>> reg.get("base").__name__, reg.get("hpcnb.plugins:PluginError").__name__
        ('HpcnbError', 'PluginError')
        >>> reg.names()
        ['base']
    """

    def __init__(
        self,
        what: str,
        *,
        check: Callable[[Any], str | None] | None = None,
        builtins: str | None = None,
    ) -> None:
        self.what = what
        self._check = check
        self._builtins = builtins
        self._entries: dict[str, T] = {}
        self._modules: dict[str, str] = {}  # "package.module:" -> the name it registered

    def _load_builtins(self) -> None:
        if self._builtins is not None:
            module, self._builtins = self._builtins, None
            load(f"{module}:", what=f"{self.what} built-ins")

    def _validate(self, name: str, obj: Any) -> T:
        problem = self._check(obj) if self._check is not None else None
        if problem:
            raise PluginError(f"{self.what} {name!r}: {problem}")
        return obj

    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        """Register ``obj`` under ``name`` and return it.

        Args:
            name: The built-in name (no ``:``).
            obj: The object.
            replace: Replace an entry of that name instead of refusing it.

        Raises:
            PluginError: The name is empty, has a ``:``, is taken (without ``replace``),
                or the object is of the wrong kind.
        """
        if not isinstance(name, str) or not name or ":" in name:
            raise PluginError(f"{self.what} name {name!r}: a non-empty text without ':'")
        if name in self._entries and not replace and self._entries[name] is not obj:
            raise PluginError(
                f"{self.what} {name!r} is registered already; pass replace=True to replace it"
            )
        self._entries[name] = self._validate(name, obj)
        return obj

    def unregister(self, name: str) -> None:
        """Remove ``name`` (nothing happens when it is not registered).

        Args:
            name: A registered name.
        """
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """Return the entry ``name``, or load ``"package.module:attr"``.

        ``"package.module:"`` (no attribute) imports the module, which may register
        entries, and returns the only entry it added (or, when the module was imported
        before, the only registered class defined in it).

        Args:
            name: A registered name or a reference.

        Raises:
            PluginError: Unknown name (the message lists the registered ones), or a
                reference that does not resolve to an object of the right kind.
        """
        self._load_builtins()
        if name in self._entries:
            return self._entries[name]
        if self._modules.get(name) in self._entries:
            return self._entries[self._modules[name]]
        if is_reference(name):
            before = set(self._entries)
            obj = load(name, what=self.what)
            if name.endswith(":"):
                added = [n for n in self._entries if n not in before]
                if not added:  # imported earlier by other means: its classes name their module
                    added = [
                        n
                        for n, entry in self._entries.items()
                        if getattr(entry, "__module__", None) == obj.__name__
                    ]
                if len(added) != 1:
                    raise PluginError(
                        f"{self.what} {name!r}: importing the module registered "
                        f"{len(added)} {self.what}s ({', '.join(added) or 'none'}); name one "
                        "as 'package.module:attr'"
                    )
                self._modules[name] = added[0]
                return self._entries[added[0]]
            return self._validate(name, obj)
        known = ", ".join(self.names()) or "none"
        raise PluginError(
            f"unknown {self.what} {name!r}; registered: {known}, or give 'package.module:attr'"
        )

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self._load_builtins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load_builtins()
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """``(name, entry)`` pairs, sorted by name."""
        return [(n, self._entries[n]) for n in self.names()]
