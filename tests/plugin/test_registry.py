"""The one registry every kind uses (muestra.plugin.registry): loading, lookups by name or alias, listings."""

from __future__ import annotations

import pytest

from muestra.plugin import hookimpl
from muestra.plugin.manager import Registered, Registration
from muestra.plugin.registry import Registry


class Colour(Registered):
    @property
    def rgb(self) -> str:
        return self.value


class Colours(Registry[Colour]):
    """A kind registered through register_schedulers' shape: register(name, value, aliases=())."""

    hook, what, entry_type = "register_schedulers", "colour", Colour
    key = staticmethod(str.lower)

    @staticmethod
    def accept(name, value, aliases=()) -> Registration:
        if not name:
            raise ValueError("a colour needs a name")
        return Registration(name, value, tuple(aliases))


class Plugin:
    def __init__(self, body) -> None:
        self.body = body

    @hookimpl
    def register_schedulers(self, register):
        self.body(register)


def load(**bodies) -> Colours:
    return Colours.load(env={}, builtin_modules={name: Plugin(body) for name, body in bodies.items()})


def warm(register):
    register("Red", "#f00", aliases=("scarlet",))
    register("orange", "#f80")


def cool(register):
    register("blue", "#00f")
    register("red", "#e00")  # taken by warm, which loaded first


def test_entries_keep_registration_order_and_listings_go_by_name():
    colours = load(warm=warm, cool=cool)
    assert [e.name for e in colours.entries()] == ["Red", "orange", "blue"]
    assert colours.names() == ["Red", "blue", "orange"] and [e.name for e in colours.list()] == colours.names()
    assert {plugin: [e.name for e in entries] for plugin, entries in colours.by_plugin().items()} == {
        "warm": ["Red", "orange"],
        "cool": ["blue"],
    }


def test_a_name_or_alias_finds_its_entry_through_the_kinds_key():
    colours = load(warm=warm)
    assert "SCARLET" in colours and colours.find("red").rgb == "#f00"
    assert (colours.lookup("scarlet").plugin, colours.find("violet")) == ("warm", None)
    with pytest.raises(KeyError, match=r"unknown colour 'violet'; registered: Red, orange"):
        colours.lookup("violet")


def test_a_failed_plugin_is_in_the_records_and_the_errors():
    colours = load(warm=warm, broken=lambda register: register("", "#000"))
    assert [r.name for r in colours.records()][:2] == ["warm", "broken"]  # the built-ins, then the entry points
    assert colours.errors == {
        "broken": {"register_schedulers": "InvalidRegistration: plugin 'broken' registered an invalid colour: "
                   "a colour needs a name"}
    }  # fmt: skip


def test_remove_forgets_a_name_and_its_aliases():
    colours = load(warm=warm)
    colours.remove("Red")
    assert "red" not in colours and "scarlet" not in colours and colours.names() == ["orange"]
