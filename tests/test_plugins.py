"""hpcnb.plugins: references to a user's module and the registry every extension point uses."""

import sys

import pytest

from hpcnb.plugins import PluginError, Registry, is_reference, load


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module outside the package, importable as ``userplug``."""
    (tmp_path / "userplug.py").write_text(
        "class Thing:\n"
        "    @staticmethod\n"
        "    def make():\n"
        "        return 42\n"
        "NOT_A_THING = 3\n"
        "def register(reg):\n"
        "    reg.register('user-thing', Thing)\n"
    )
    (tmp_path / "broken_plug.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userplug"
    for name in ("userplug", "broken_plug", "registering_plug"):
        sys.modules.pop(name, None)


def test_load_follows_module_and_dotted_attribute(user_module):
    assert load("userplug:Thing.make")() == 42
    assert load("userplug:").__name__ == "userplug"
    assert is_reference("userplug:Thing") and not is_reference("fcfs")


@pytest.mark.parametrize(
    ("reference", "match"),
    [
        ("userplug", "expected 'package.module:attr'"),
        ("user plug:Thing", "expected 'package.module:attr'"),
        ("no_such_module_xyz:Thing", "cannot import 'no_such_module_xyz'"),
        ("userplug:Missing", "has no attribute 'Missing'"),
        ("broken_plug:X", "raised RuntimeError: boom at import"),
        ("a" * 400 + ":b", "expected a 'package.module:attr'"),
    ],
)
def test_load_errors_say_what_and_where(user_module, reference, match):
    with pytest.raises(PluginError, match=match) as info:
        load(reference, what="scheduler")
    assert str(info.value).startswith("scheduler ")


def test_registry_refuses_taken_names_and_wrong_kinds(user_module):
    def check(obj):
        return None if isinstance(obj, type) else f"{obj!r} is not a class"

    reg = Registry("thing", check=check)
    reg.register("base", int)
    with pytest.raises(PluginError, match="registered already"):
        reg.register("base", float)
    reg.register("base", float, replace=True)
    assert reg.get("base") is float
    assert reg.get("userplug:Thing").__name__ == "Thing"
    with pytest.raises(PluginError, match="is not a class"):
        reg.get("userplug:NOT_A_THING")
    with pytest.raises(PluginError, match="unknown thing 'nope'; registered: base"):
        reg.get("nope")
    with pytest.raises(PluginError, match="without ':'"):
        reg.register("a:b", int)
    assert reg.names() == ["base"] and "base" in reg and len(reg) == 1


def test_registry_imports_a_module_that_registers_itself(tmp_path, monkeypatch, user_module):
    reg = Registry("thing")
    monkeypatch.setattr(sys.modules[__name__], "REG", reg, raising=False)
    (tmp_path / "registering_plug.py").write_text(
        f"import {__name__} as t\nt.REG.register('from-import', 'hello')\n"
    )
    assert reg.get("registering_plug:") == "hello"
    assert reg.names() == ["from-import"]
    assert reg.get("registering_plug:") == "hello"  # imported once; the name stays known


def test_registry_imports_its_built_ins_when_first_read(tmp_path, monkeypatch):
    reg = Registry("thing", builtins="builtin_plug")
    monkeypatch.setattr(sys.modules[__name__], "REG2", reg, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "builtin_plug.py").write_text(
        f"import {__name__} as t\nt.REG2.register('built-in', 1)\n"
    )
    try:
        assert "builtin_plug" not in sys.modules
        assert reg.names() == ["built-in"] and reg.get("built-in") == 1
    finally:
        sys.modules.pop("builtin_plug", None)


def test_module_reference_finds_a_class_of_a_module_imported_before(tmp_path, monkeypatch):
    reg = Registry("thing")
    monkeypatch.setattr(sys.modules[__name__], "REG3", reg, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "early_plug.py").write_text(
        f"import {__name__} as t\nclass Early:\n    pass\nt.REG3.register('early', Early)\n"
    )
    try:
        import early_plug  # imported by other means first: nothing new registers later

        assert reg.get("early_plug:") is early_plug.Early
    finally:
        sys.modules.pop("early_plug", None)
