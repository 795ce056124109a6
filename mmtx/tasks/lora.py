"""Low-rank adapters (LoRA, Hu et al. 2021) on a model's linear layers, through ``peft``.

``task.lora.rank > 0`` adds to every linear layer ``layers`` names a trainable low-rank
update ``W x + (alpha / rank) B A x`` whose ``B`` starts at zero, so training starts from the
loaded model; the adapted layers' own weights and biases are frozen. Everything else trains or
not as ``task.freeze`` says; with ``task.freeze`` given, only the layers it freezes get adapters
(``freeze.train=[*.cross_attn]``: a new cross-attention trains whole). The layers keep their names
with peft's parts below them (``attn.qkv.base_layer.weight``, ``attn.qkv.lora_A.default.weight``),
so a LoRA run's checkpoints resume as any other; :func:`merge_adapters` folds the adapters back
into plain layers for export, and :func:`plain_state` / :func:`adapted_names` let ``init_from=``
go from and to LoRA runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from torch import Tensor, nn

from mmtx.config_error import ArgumentError

_MAX_PATTERNS, _MAX_PATTERN = 64, 200  # a checkpoint's settings are untrusted: bounded work
ADAPTER = "default"  # peft's name for the one adapter
_PARTS = re.compile(rf"^(.*)\.(base_layer\.(weight|bias)|lora_[AB]\.{ADAPTER}\.weight)$")


@dataclass(frozen=True)
class Lora:
    """What ``task.lora`` asks for.

    Args:
        rank: the adapters' rank (0: no adapters).
        alpha: the update is scaled by ``alpha / rank``.
        dropout: dropout on the adapters' input.
        layers: ``fnmatch`` patterns of the linear layers to adapt, named relative to the task
            (``*.attn.qkv`` matches every self-attention's input projection).
    """

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    layers: tuple[str, ...] = ("*.attn.qkv", "*.attn.proj", "*.cross_attn.*", "*.mlp.fc1", "*.mlp.fc2")

    @classmethod
    def from_config(cls, config: dict | None) -> Lora:
        """``task.lora`` as given (None: no adapters), its values checked."""
        if config is not None and not isinstance(config, Mapping):
            raise ArgumentError("{lora!r} must be a mapping of rank, alpha, dropout, layers", lora=config)
        config = dict(config or {})
        fields = ("rank", "alpha", "dropout", "layers")
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise ArgumentError(
                f"{{lora.{unknown[0]}!k}} is not a key (allowed: {', '.join(fields)})",
                **{f"lora.{unknown[0]}": config[unknown[0]]},
            )
        layers = config.get("layers", cls.layers)
        if isinstance(layers, str):  # one pattern
            layers = (layers,)
        if not isinstance(layers, list | tuple):
            raise ArgumentError("{lora.layers!r} must be a list of layer names or patterns", **{"lora.layers": layers})
        lora = cls(**{**config, "layers": tuple(layers)})
        if isinstance(lora.rank, bool) or not isinstance(lora.rank, int) or lora.rank < 0:
            raise ArgumentError("{lora.rank!r} must be an integer >= 0 (0: no adapters)", **{"lora.rank": lora.rank})
        if isinstance(lora.alpha, bool) or not isinstance(lora.alpha, int | float) or not lora.alpha > 0:
            raise ArgumentError("{lora.alpha!r} must be a number > 0", **{"lora.alpha": lora.alpha})
        if isinstance(lora.dropout, bool) or not isinstance(lora.dropout, int | float) or not 0 <= lora.dropout < 1:
            raise ArgumentError("{lora.dropout!r} must be in [0, 1)", **{"lora.dropout": lora.dropout})
        layers = lora.layers
        if (
            not layers
            or len(layers) > _MAX_PATTERNS
            or not all(isinstance(t, str) and 0 < len(t) <= _MAX_PATTERN for t in layers)
        ):
            raise ArgumentError(
                f"{{lora.layers!k}} must be a list of 1-{_MAX_PATTERNS} layer names or patterns of 1-{_MAX_PATTERN} characters",
                **{"lora.layers": layers},
            )
        return lora

    def __bool__(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def add_adapters(root: nn.Module, lora: Lora, only_frozen: bool = False) -> list[str]:
    """Add ``lora``'s adapters to the linear layers of ``root.model`` its ``layers`` name (relative
    to ``root``); returns their names. The adapted layers' weights and biases are frozen, the
    adapters train, every other parameter keeps its ``requires_grad``. ``only_frozen``: adapt
    only layers whose weight is already frozen (``task.freeze`` given: a layer it leaves
    training trains whole). A layer whose weight is shared (a tied output layer) is refused:
    merging would change the other user of the weight too."""
    try:
        import peft
    except ImportError as e:
        raise ImportError("task.lora needs peft: pip install 'mmtx[lora]'") from e
    names = [
        name
        for name, module in root.named_modules()
        if isinstance(module, nn.Linear)
        and name.startswith("model.")
        and any(fnmatchcase(name, t) for t in lora.layers)
        and not (only_frozen and module.weight.requires_grad)
    ]
    if not names:
        frozen = " that task.freeze freezes" if only_frozen else ""
        raise ArgumentError(
            f"{{lora.layers!r}} names no linear layer of the model{frozen}", **{"lora.layers": list(lora.layers)}
        )
    uses: dict[int, int] = {}
    for _, p in root.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    tied = [n for n in names if uses[id(root.get_submodule(n).weight)] > 1]
    if tied:
        raise ArgumentError(
            f"{{lora.layers!k}}: {tied[0]} shares its weight with another layer (tied embeddings): not adapted",
            **{"lora.layers": list(lora.layers)},
        )
    trainable = {id(p) for p in root.parameters() if p.requires_grad}
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules="|".join(re.escape(n.removeprefix("model.")) for n in names),
    )
    peft.inject_adapter_in_model(config, root.model, adapter_name=ADAPTER)
    adapted = {id(p) for layer in _lora_layers(root) for p in layer.get_base_layer().parameters()}
    for p in root.parameters():  # peft freezes all but the adapters: the rest as it was
        if id(p) in trainable and id(p) not in adapted:
            p.requires_grad_(True)
    return names


def _lora_layers(root: nn.Module) -> list[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [m for m in root.modules() if isinstance(m, LoraLayer)]


def merge_adapters(root: nn.Module) -> int:
    """Fold every adapter of ``root`` into its layer's weight and put the plain layer back in
    its place: the model computes the same and has its original names. Returns how many."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft: no adapters
        return 0
    count = 0
    for name, module in list(root.named_modules()):
        if isinstance(module, LoraLayer):
            module.merge(safe_merge=True)
            parent, _, child = name.rpartition(".")
            setattr(root.get_submodule(parent) if parent else root, child, module.get_base_layer())
            count += 1
    return count


def plain_state(state: dict[str, Tensor], lora: dict | None) -> dict[str, Tensor]:
    """A LoRA run's state dict with each adapted layer's update folded into a plain ``weight``
    (and its ``bias`` under the plain name), as :func:`merge_adapters` would leave the model;
    other states pass through. ``lora``: that run's ``task.lora``."""
    settings = Lora.from_config(lora)
    layers: dict[str, dict[str, Tensor]] = {}
    out = {}
    for name, tensor in state.items():
        found = _PARTS.match(name)
        if found:
            layers.setdefault(found[1], {})[found[2]] = tensor
        else:
            out[name] = tensor
    for layer, parts in layers.items():
        weight = parts["base_layer.weight"]
        if "lora_A.default.weight" in parts and settings:
            a, b = parts["lora_A.default.weight"].double(), parts["lora_B.default.weight"].double()
            weight = (weight.double() + settings.scaling * b @ a).to(weight.dtype)
        out[f"{layer}.weight"] = weight
        if "base_layer.bias" in parts:
            out[f"{layer}.bias"] = parts["base_layer.bias"]
    return out


def adapted_names(state: dict[str, Tensor], own: dict[str, Any]) -> dict[str, Tensor]:
    """A plain state dict renamed for a model with adapters: ``X.weight`` to
    ``X.base_layer.weight`` where only the latter is the model's (the adapters start anew)."""
    renamed = {}
    for name, tensor in state.items():
        layer, _, param = name.rpartition(".")
        adapted = f"{layer}.base_layer.{param}"
        renamed[adapted if name not in own and adapted in own else name] = tensor
    return renamed


def count_trainable(root: nn.Module) -> tuple[int, int]:
    """(trainable, all) parameters of ``root``."""
    params = list(root.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
