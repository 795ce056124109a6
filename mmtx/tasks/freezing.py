"""Which weights train: ``task.freeze`` keeps chosen modules fixed while the rest fine-tunes.

Frozen parameters get ``requires_grad=False``: no gradient, no optimizer state, no weight decay
(`mmtx.tasks.optim.param_groups` skips them), nothing for DDP to reduce. A module whose every
parameter is frozen also stays in eval mode (`eval_frozen`), as BLIP-2 keeps its frozen image
encoder: its dropout is off and its batch-norm statistics do not move, so its outputs are those
of the pretrained module. Lightning's ``BaseFinetuning`` callback freezes too, but by module
objects rather than names and by switching batch norm to batch statistics, which changes what a
frozen stem computes; this module keeps the frozen layers exactly as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from torch import nn

from mmtx.config_error import ArgumentError

log = logging.getLogger(__name__)

_MAX_PATTERNS, _MAX_PATTERN = 64, 200  # a checkpoint's settings are untrusted: bounded work


@dataclass(frozen=True)
class Freeze:
    """What ``task.freeze`` asks for.

    Args:
        modules: module names or ``fnmatch`` patterns, relative to the task (``model.encoder``,
            ``model.decoder.body.blocks.*``): every parameter under a matching module is frozen.
        train: patterns of modules under the frozen ones that train all the same
            (``*.cross_attn``: a frozen decoder whose cross-attention learns).
        train_last_blocks: in every tower under a frozen module (a module holding ``blocks``),
            its last N blocks and the layers after them (the final norm) train, as open_clip's
            ``--lock-image-unlocked-groups`` does.
    """

    modules: tuple[str, ...] = ()
    train: tuple[str, ...] = ()
    train_last_blocks: int = 0

    @classmethod
    def from_config(cls, config: dict | None) -> Freeze:
        """``task.freeze`` as given (None or empty: nothing frozen), its types checked."""
        if config is not None and not isinstance(config, Mapping):
            raise ArgumentError("{freeze!r} must be a mapping of modules, train, train_last_blocks", freeze=config)
        config = dict(config or {})
        unknown = sorted(set(config) - {"modules", "train", "train_last_blocks"})
        if unknown:
            raise ArgumentError(
                f"{{freeze.{unknown[0]}!k}} is not a key (allowed: modules, train, train_last_blocks)",
                **{f"freeze.{unknown[0]}": config[unknown[0]]},
            )
        patterns = {}
        for key in ("modules", "train"):
            value = config.get(key) or ()
            if isinstance(value, str):  # one name
                value = (value,)
            if not isinstance(value, list | tuple):
                raise ArgumentError(
                    f"{{freeze.{key}!r}} must be a list of module names or patterns", **{f"freeze.{key}": value}
                )
            if not all(isinstance(p, str) and 0 < len(p) <= _MAX_PATTERN for p in value) or len(value) > _MAX_PATTERNS:
                raise ArgumentError(
                    f"{{freeze.{key}!k}} must be a list of at most {_MAX_PATTERNS} module names or patterns "
                    f"of 1-{_MAX_PATTERN} characters",
                    **{f"freeze.{key}": value},
                )
            patterns[key] = tuple(value)
        last = config.get("train_last_blocks", 0)
        if isinstance(last, bool) or not isinstance(last, int) or last < 0:
            raise ArgumentError(
                "{freeze.train_last_blocks!r} must be an integer >= 0", **{"freeze.train_last_blocks": last}
            )
        if (patterns["train"] or last) and not patterns["modules"]:
            raise ArgumentError(
                "{freeze.train!k} and {freeze.train_last_blocks!k} need {freeze.modules!k}: nothing is frozen",
                **{f"freeze.{key}": config.get(key) for key in ("modules", "train", "train_last_blocks")},
            )
        return cls(modules=patterns["modules"], train=patterns["train"], train_last_blocks=last)

    def __bool__(self) -> bool:
        return bool(self.modules)


@dataclass
class _Plan:
    frozen: set[str] = field(default_factory=set)  # module names whose parameters are frozen
    trained: set[str] = field(default_factory=set)  # module names under those that train all the same


def _matching(names: list[str], pattern: str) -> list[str]:
    return [n for n in names if fnmatchcase(n, pattern)]


def _under(name: str, roots: set[str]) -> bool:
    """Whether module `name` is one of `roots` or inside one of them."""
    return any(name == r or name.startswith(r + ".") for r in roots)


def _plan(root: nn.Module, freeze: Freeze) -> _Plan:
    names = [n for n, _ in root.named_modules() if n]
    plan = _Plan()
    for pattern in freeze.modules:
        found = _matching(names, pattern)
        if not found:
            tops = ", ".join(n for n in names if n.count(".") <= 1)
            raise ArgumentError(
                f"{{freeze.modules!k}}: {pattern!r} names no module (modules: {tops})",
                **{"freeze.modules": list(freeze.modules)},
            )
        plan.frozen.update(found)
    for pattern in freeze.train:
        found = [n for n in _matching(names, pattern) if _under(n, plan.frozen)]
        if not found:
            raise ArgumentError(
                f"{{freeze.train!k}}: {pattern!r} names no module under the frozen ones",
                **{"freeze.train": list(freeze.train)},
            )
        plan.trained.update(found)
    if freeze.train_last_blocks:
        plan.trained.update(_last_blocks(root, plan.frozen, freeze.train_last_blocks))
    return plan


def _last_blocks(root: nn.Module, frozen: set[str], count: int) -> list[str]:
    """The last `count` blocks, and the layers registered after them, of every tower under the
    frozen modules (a tower: a module with a ``blocks`` list)."""
    names: list[str] = []
    towers = [
        (name, module)
        for name, module in root.named_modules()
        if isinstance(getattr(module, "blocks", None), nn.ModuleList) and _under(name, frozen)
    ]
    if not towers:
        raise ArgumentError(
            "{freeze.train_last_blocks}: no frozen module holds transformer blocks",
            **{"freeze.train_last_blocks": count},
        )
    for name, tower in towers:
        if count > len(tower.blocks):
            raise ArgumentError(
                f"{{freeze.train_last_blocks}}: {name} has {len(tower.blocks)} blocks (allowed: <= {len(tower.blocks)})",
                **{"freeze.train_last_blocks": count},
            )
        names += [f"{name}.blocks.{i}" for i in range(len(tower.blocks) - count, len(tower.blocks))]
        children = [n for n, _ in tower.named_children()]
        names += [f"{name}.{n}" for n in children[children.index("blocks") + 1 :]]
    return names


def apply_freeze(root: nn.Module, freeze: Freeze) -> tuple[int, int]:
    """Freeze `root`'s parameters as `freeze` says; (frozen, total) parameter counts.

    A parameter shared by several modules (tied embeddings) trains when any of its names does.
    """
    if not freeze:
        return 0, sum(p.numel() for p in root.parameters())
    plan = _plan(root, freeze)
    trains: dict[int, bool] = {}
    params: dict[int, nn.Parameter] = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        module = name.rpartition(".")[0]
        trained = not _under(module, plan.frozen) or _under(module, plan.trained)
        trains[id(p)] = trains.get(id(p), False) or trained
        params[id(p)] = p
    for key, p in params.items():
        p.requires_grad_(trains[key])
    frozen = sum(p.numel() for key, p in params.items() if not trains[key])
    return frozen, sum(p.numel() for p in params.values())


def eval_frozen(root: nn.Module) -> None:
    """Put every module whose parameters are all frozen (and that has some) in eval mode."""
    for module in root.modules():
        params = list(module.parameters())
        if params and not any(p.requires_grad for p in params):
            module.eval()


def describe(frozen: int, total: int, freeze: Freeze) -> str:
    """The start-of-training line: how many parameters are frozen, and by which settings."""
    asked = [", ".join(freeze.modules)]
    if freeze.train:
        asked.append(f"but {', '.join(freeze.train)}")
    if freeze.train_last_blocks:
        asked.append(f"but the last {freeze.train_last_blocks} blocks")
    return f"task.freeze: {frozen:,} of {total:,} parameters frozen ({'; '.join(asked)}); {total - frozen:,} train"
