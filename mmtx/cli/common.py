"""What the command-line apps share before their command runs: the config directory, the
resolvers, reading the command line's keys, and turning bad input into one line.

Nothing here imports torch or Lightning: an app reads its command line with Hydra first and
imports its command (`mmtx.commands`) only then, so that ``--help`` and a misspelt key answer at
once rather than after the seconds those imports take.
"""

from __future__ import annotations

import functools
import logging
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

import mmtx.config_resolvers  # noqa: F401  (registers the ${mmtx.*} resolvers the configs use)
from mmtx.config_error import not_a_key

# the configs: mmtx/conf in an installed wheel (package data), else the source tree's top-level conf/
_PACKAGED, _SOURCE = (Path(__file__).resolve().parents[n] / "conf" for n in (1, 2))
CONFIG_DIR = str(_PACKAGED if _PACKAGED.is_dir() else _SOURCE)


def user_errors() -> tuple[type[Exception], ...]:
    """The problems with the user's files or settings: reported in one line, not as a traceback."""
    from mmtx.callbacks import NonFiniteLossError
    from mmtx.checkpoint import CheckpointError
    from mmtx.config_error import ConfigError
    from mmtx.data.annotations import AnnotationError
    from mmtx.data.bad_data import BadDataError
    from mmtx.data.images import ImageLoadError
    from mmtx.data.tokenizer import TokenizerError
    from mmtx.export import ExportError
    from mmtx.pretrained import PretrainedError

    return (
        AnnotationError,
        CheckpointError,
        ImageLoadError,
        TokenizerError,
        FileNotFoundError,
        NonFiniteLossError,
        ConfigError,
        BadDataError,
        ExportError,
        PretrainedError,
    )


# what libraries print on every run that says nothing about it: Lightning's advertisements and its
# note that the callbacks bring a model summary (mmtx's, in place of its own), a deprecation inside
# Lightning's own code, and the checkpoint monitor's complaint before the first validation (mmtx
# validates the final weights of every run), the model summary's size estimate
_ADVERTS = ("💡 Tip:", "Trainer already configured with model summary callbacks")
_NOISE = (
    r".*isinstance\(treespec, LeafSpec\)",
    r".*could not find the monitored key in the returned metrics",
    r"Precision .* is not supported by the model summary",
)


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_ADVERTS)


def mute_library_noise() -> None:
    """Keep the console to mmtx's lines, the progress bar and real warnings."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):  # rank_zero_info
        logging.getLogger(name).addFilter(_DropAdverts())
    for message in _NOISE:
        warnings.filterwarnings("ignore", message=message)


def friendly_errors(fn: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
    """Exit with ``mmtx: <message>`` (status 1) when ``fn`` fails on bad input; library noise muted."""

    @functools.wraps(fn)
    def wrapper(cfg: DictConfig) -> Any:
        mute_library_noise()
        try:
            result = fn(cfg)
        except Exception as e:
            if isinstance(e, user_errors()):
                sys.exit(f"mmtx: {e}")
            raise
        leave_process_group()
        return result

    return wrapper


def check_override_keys(config_name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a ``hydra.main`` app: a command-line override of a key that its config (conf/
    ``config_name``.yaml) does not have, ``data.batchsize=8``, exits with one line per such key,
    naming the closest key there is. Hydra's own message advises adding the key with ``+``,
    which only moves the failure into the constructor the key is then given to."""

    def decorate(app: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(app)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not args and not kwargs:  # from the command line, which Hydra reads from sys.argv
                problems = unknown_override_keys(config_name, sys.argv[1:])
                if problems:
                    sys.exit("\n".join(f"mmtx: {p}" for p in problems))
            return app(*args, **kwargs)

        return wrapper

    return decorate


def unknown_override_keys(config_name: str, argv: list[str]) -> list[str]:
    """``KEY is not a key of PARENT (did you mean PARENT.CLOSEST?)`` for each override on the
    command line ``argv`` that sets a key the composed config lacks. Nothing for a command line
    that Hydra refuses for another reason (it says why), for a sweep's values (``-m seed=0,1``),
    for ``--help``, or for another config directory or name."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    args, _ = get_args_parser().parse_known_args(argv)
    if args.help or args.hydra_help or args.config_dir or args.config_path or args.config_name:
        return []
    try:
        overrides = [o for o in OverridesParser.create().parse_overrides(args.overrides) if not o.is_sweep_override()]
    except HydraException:
        return []
    unknown: list[str] = []
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        while True:  # each failed pass finds one unknown key; the next composes without its override
            try:
                cfg = compose(config_name, [o.input_line for o in overrides], return_hydra_config=True)
                break
            except Exception as e:  # an unknown key is reported here; anything else, by Hydra as usual
                cause = e.__cause__ if isinstance(e, ConfigCompositionException) else None
                key = cause.full_key if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) else ""
                bad = [o for o in overrides if key and (o.key_or_group == key or o.key_or_group.startswith(key + "."))]
                if not bad:  # another problem: Hydra reports it
                    return []
                overrides.remove(bad[0])
                unknown.append(key)
    problems = []
    for key in unknown:
        parent, _, name = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if parent and node is None:  # e.g. data.test: null, which takes a whole {annotations, images}
            problems.append(
                f"{key} is not a key of {parent}, which is null: give it whole, e.g. {parent}={{{name}:...}}"
            )
        else:
            problems.append(not_a_key(key, list(node) if isinstance(node, DictConfig) else []))
    return problems


def leave_process_group() -> None:
    """End a distributed run's process group once every process is done with it. Left to the
    interpreter's exit, gloo's threads can still be running when the process goes away, and that
    process aborts ("terminate called without an active exception") after a run that succeeded."""
    torch = sys.modules.get("torch")  # a command that never imported it started no process group
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
