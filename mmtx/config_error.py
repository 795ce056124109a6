"""The errors a config value that cannot work raises: `ConfigError` from `mmtx.config_check`'s
start-up checks and the data modules' own refusals once they have read their data;
`ArgumentError` from a constructor that refuses its arguments; `is_int` / `is_number`, the
type tests those checks share (a YAML ``true`` is no number); and `not_a_key`, how a key that is
not in the config is named. Nothing here imports torch: the command line's checks use it too."""

from __future__ import annotations

import difflib
import string
from collections.abc import Callable
from typing import Any


def is_int(value: Any) -> bool:
    """An integer, and not a bool (YAML's ``true`` would pass ``isinstance(value, int)``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key and the values allowed."""


class ArgumentError(ValueError):
    """A constructor's refusal that carries the arguments it names as data, not only as text.

    ``str()`` reads as a plain message: ``ArgumentError("{dim} is not divisible by {num_heads}",
    dim=30, num_heads=4)`` is ``dim=30 is not divisible by num_heads=4``. `mmtx.config_check`
    renders the same error with each name written as the config key the value came from
    (``model.encoder.dim=30``), so no message text is ever parsed. In ``template``, ``{name}``
    shows ``name=value``, ``{name!r}`` ``name='value'``, ``{name!k}`` the name alone and
    ``{name!v}`` the value alone. A dotted name (``decoder.context_dim``) is a key inside an
    argument; pass it as ``**{"decoder.context_dim": value}``.
    """

    def __init__(self, template: str, /, **arguments: Any) -> None:
        self.template, self.arguments = template, arguments
        super().__init__(self.render())

    def render(self, argument: Callable[[str, str], str] = lambda name, shown: name + shown) -> str:
        """The message, each named argument written by ``argument(name, "=value")`` (``""`` for
        ``!k``); values shown alone (``!v``) are left as they are."""
        return _Arguments(self.arguments, argument).format(self.template)


class _Arguments(string.Formatter):
    """Formats ``{name!conversion}`` fields from a mapping whose keys may hold dots."""

    def __init__(self, values: dict[str, Any], argument: Callable[[str, str], str]) -> None:
        self.values, self.argument = values, argument

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[tuple[str, Any], str]:
        return (field_name, self.values[field_name]), field_name

    def convert_field(self, value: tuple[str, Any], conversion: str | None) -> str:
        name, given = value
        if conversion == "v":
            return str(given)
        shown = {"k": "", "r": f"={given!r}", None: f"={given}"}[conversion]
        return self.argument(name, shown)


def not_a_key(key: str, keys: list[str]) -> str:
    """``KEY is not a key of PARENT (did you mean PARENT.CLOSEST?)``, the closest of ``keys``
    (the names in PARENT) by spelling, if any is close."""
    parent, _, name = key.rpartition(".")
    close = difflib.get_close_matches(name, [k for k in map(str, keys) if k not in (name, "_target_")], n=1)
    hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
    return f"{key} is not a key of {parent or 'the config'}{hint}"
