"""Configs read from files a user is handed are data: checked before anything is built from them.

A checkpoint records the configs its task was built from (the model's, the data module's) so that
``mmtx-eval``, ``mmtx-caption`` and the others can rebuild it; an export records its model's.
Building a config (`mmtx.config_build` for models, Hydra's ``instantiate`` for the data module)
calls whatever a ``_target_`` names, so a checkpoint holding nothing but
dicts and strings (which ``torch.load(weights_only=True)`` accepts) could name any function of
the standard library. Every entry point checks a stored config here first; a config passes only
if it is what mmtx itself writes there:

- each ``_target_`` names a class defined in the allowed packages (not something their modules
  import), as ``module.Class`` with no attribute walked, or one of the public-weight loaders;
- each key beside it is a parameter of that constructor (``_partial_``, in model configs, is the
  one Hydra option mmtx writes);
- every other value is plain data (None, bool, int, float, str, lists and dicts of them) with no
  OmegaConf interpolation (``${...}``, which ``instantiate`` would resolve).

A refusal is one line naming the file and the key.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = [
    "DATA", "EXPORTED_MODEL", "MODEL", "PLAIN", "TASK", "Allowed", "StoredConfigError", "UnknownStoredClass",
    "check_stored_arguments", "check_stored_config", "check_tokenizer_json", "stored_class",
]  # fmt: skip


class StoredConfigError(ValueError):
    """A config read from a file names code or keys that mmtx does not write there."""


class UnknownStoredClass(StoredConfigError):
    """A name inside the allowed packages that this mmtx does not have (renamed or removed since
    the file was written): importing it fails, so it can run nothing."""


@dataclass(frozen=True)
class Allowed:
    """Which ``_target_``s a stored config may name: classes defined in ``packages`` that are
    subclasses of ``base`` (a callable returning the class: imported only when needed), or one of
    ``functions`` (exact import paths)."""

    what: str
    packages: tuple[str, ...]
    base: Callable[[], type] = lambda: object
    functions: tuple[str, ...] = ()
    hydra_options: tuple[str, ...] = ()  # besides ``_target_``: the model presets' ``_partial_``


def _lightning_data_module() -> type:
    import lightning as L

    return L.LightningDataModule


def _task() -> type:
    from mmtx.tasks.base import Task

    return Task


PRETRAINED_LOADERS = ("mmtx.pretrained.load_vit", "mmtx.pretrained.load_text_encoder", "mmtx.pretrained.load_decoder")
MODEL = Allowed(
    "a class of mmtx.models or a loader of mmtx.pretrained",
    ("mmtx.models",),
    functions=PRETRAINED_LOADERS,
    hydra_options=("_partial_",),
)
DATA = Allowed("a data module of mmtx.data", ("mmtx.data",), _lightning_data_module)
TASK = Allowed("a task of mmtx.tasks", ("mmtx.tasks",), _task)
EXPORTED_MODEL = Allowed("a class of mmtx.models", ("mmtx.models",))
PLAIN = Allowed("allowed here (plain values only)", ())

_PLAIN = (type(None), bool, int, float, str)


def stored_class(name: Any, allowed: Allowed, where: str) -> Any:
    """The class (or loader) ``name`` if ``allowed`` admits it, else `StoredConfigError`.

    ``name`` is resolved as ``module.attribute`` with one ``import_module`` of a module inside the
    allowed packages and one attribute lookup, never by walking attributes (``mmtx.models.vit.torch.load``
    would reach ``torch.load`` through the module's own imports).
    """
    refused = StoredConfigError(f"{where}: {name!r} is not {allowed.what}; mmtx builds nothing else from a file")
    if not isinstance(name, str):
        raise refused
    module_name, _, attribute = name.rpartition(".")
    if not _inside(module_name, allowed.packages) and name not in allowed.functions:
        raise refused
    try:
        obj = getattr(importlib.import_module(module_name), attribute, None)
    except (ImportError, ValueError):  # no such module (or an empty part: "mmtx.models..x")
        obj = None
    if obj is None:
        _unknown_or_refused(name, where, refused)
    if name in allowed.functions and callable(obj):
        return obj
    # defined in the allowed packages (a package may re-export it: mmtx.data.synthetic.ShapesCaptions)
    defined_there = inspect.isclass(obj) and obj.__qualname__ == attribute and _inside(obj.__module__, allowed.packages)
    if not defined_there or not issubclass(obj, allowed.base()):
        raise refused
    return obj


def _unknown_or_refused(name: str, where: str, refused: StoredConfigError) -> NoReturn:
    """``name`` (not ``module.attribute`` of an allowed package) is unknown where Hydra's
    ``instantiate`` could not reach it either (renamed or removed since the file was written);
    else it reaches something by walking attributes, and is refused."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes, as Hydra does
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except (ImportError, ValueError):
            continue
        for part in parts[i:]:
            obj = getattr(obj, part, None)
            if obj is None:
                break
        else:
            raise refused
        break
    raise UnknownStoredClass(
        f"{where}: names {name}, which this mmtx does not have (renamed or removed since the file was written)"
    )


def _inside(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def check_stored_config(config: Any, where: str, allowed: Allowed, unknown_ok: bool = False) -> None:
    """Refuse ``config`` (read from the file and key ``where``) unless it is plain data whose
    ``_target_``s ``allowed`` admits, each with only its constructor's keys; see the module doc.

    ``unknown_ok``: a class of the allowed packages that this mmtx does not have passes (its
    arguments are still checked as plain data), for configs that can be replaced on the command
    line (a checkpoint's data module, say, that has moved since)."""
    if isinstance(config, Mapping):
        target, keys = config.get("_target_"), None
        if "_target_" in config:
            try:
                keys = constructor_keys(stored_class(target, allowed, f"{where}._target_"))
            except UnknownStoredClass:
                if not unknown_ok:
                    raise
        for key, value in config.items():
            at = f"{where}.{key}"
            if not isinstance(key, str):
                raise StoredConfigError(f"{where}: key {key!r} is not a string")
            if key.startswith("_") and key.endswith("_") and len(key) > 1:
                if "_target_" not in config or key not in ("_target_", *allowed.hydra_options):
                    raise StoredConfigError(
                        f"{at}: the Hydra option {key!r} is not allowed here (mmtx never writes it)"
                    )
                if key == "_partial_" and not isinstance(value, bool):
                    raise StoredConfigError(f"{at}: must be true or false, not {value!r}")
                continue
            if keys is not None and key not in keys:
                raise StoredConfigError(f"{at}: {target} takes no argument {key!r}")
            check_stored_config(value, at, allowed, unknown_ok)
    elif isinstance(config, (list, tuple)):
        for i, value in enumerate(config):
            check_stored_config(value, f"{where}[{i}]", allowed, unknown_ok)
    elif not isinstance(config, _PLAIN):
        raise StoredConfigError(f"{where}: a {type(config).__name__} is not a plain config value")
    elif isinstance(config, str) and "${" in config:
        raise StoredConfigError(f"{where}: {config[:60]!r} holds an interpolation ('${{'), which mmtx never writes")


def check_stored_arguments(arguments: Mapping[str, Any], cls: type, where: str) -> None:
    """``arguments`` (a task's stored hyper-parameters) must be parameters of ``cls``'s
    constructor; the values are checked by the caller."""
    keys = constructor_keys(cls)
    for key in arguments:
        if keys is not None and key not in keys:
            raise StoredConfigError(f"{where}.{key}: {cls.__module__}.{cls.__qualname__} takes no argument {key!r}")


def constructor_parameters(target: Any) -> tuple[dict[str, Any], bool]:
    """The named parameters of a constructor and their defaults (``inspect.Parameter.empty``
    where none), following ``**kwargs`` into the ``__init__``s of a class's mmtx bases (data
    modules and text encoders pass theirs on), and whether the last one still takes
    ``**kwargs``: keys beyond these would reach code that is not mmtx's."""
    if not inspect.isclass(target):
        functions = [target]
    else:
        functions = [
            cls.__init__ for cls in target.__mro__ if "__init__" in vars(cls) and cls.__module__.startswith("mmtx.")
        ]
    names: dict[str, Any] = {}
    for fn in functions:
        parameters = list(inspect.signature(fn).parameters.values())
        for p in parameters:
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                names.setdefault(p.name, p.default)
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            return names, False
    return names, True


def constructor_keys(target: Any) -> set[str] | None:
    """The keys a constructor takes (`constructor_parameters`); a class admits no keys beyond
    them, so None (any key) only for a function with ``**kwargs``."""
    names, open_ended = constructor_parameters(target)
    return None if open_ended and not inspect.isclass(target) else set(names)


def check_tokenizer_json(text: str, where: str) -> None:
    """Refuse a stored tokenizer (``tokenizers`` JSON) that holds a regular expression: its
    Oniguruma engine backtracks, so a pattern such as ``(a+)+$`` can take exponential time on
    each text. The tokenizers mmtx writes and imports (WordPiece, byte-level BPE) have none."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise StoredConfigError(f"{where}: not a tokenizer's JSON ({type(e).__name__})") from None
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "Regex" in node:
                raise StoredConfigError(
                    f"{where}: holds a regular expression ({str(node['Regex'])[:40]!r}), which mmtx never writes"
                )
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
