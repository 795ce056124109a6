"""Reading checkpoints safely: ``weights_only=True`` always, clear errors, name-matched init."""

from __future__ import annotations

import logging
import pickle
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

from mmtx.checkpoint_keys import DATA_KEY, TASK_KEY
from mmtx.data.bad_data import listing
from mmtx.export import task_from_export
from mmtx.stored_config import (
    DATA,
    MODEL,
    PLAIN,
    TASK,
    StoredConfigError,
    check_stored_arguments,
    check_stored_config,
    check_tokenizer_json,
    stored_class,
)
from mmtx.tasks.freezing import Freeze
from mmtx.tasks.lora import Lora, adapted_names, plain_state

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or not an mmtx checkpoint."""


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load a checkpoint's plain contents without executing code from it (``weights_only=True``).

    ``mmap=True`` maps the tensors' storage instead of reading it: what is never touched (say
    the optimiser state of a checkpoint read for its settings) is never read from disk.

    The configs it records are checked as data (:func:`check_checkpoint_configs`) before
    anything can be built from them.

    Raises:
        CheckpointError: the file is missing, empty, truncated, not a PyTorch checkpoint, holds
            Python objects other than plain data and tensors, or records configs that name code
            mmtx does not write there; the message says which.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: the checkpoint file is empty")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # truncated zip, pickle with code, foreign format ...
        raise CheckpointError(_unreadable(path, e)) from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} is not a checkpoint (it holds a {type(ckpt).__name__})")
    check_checkpoint_configs(ckpt, path)
    return ckpt


def check_checkpoint_configs(ckpt: dict[str, Any], path: str | Path) -> None:
    """Refuse a checkpoint whose recorded task, model config or data config is anything but what
    mmtx writes there (:mod:`mmtx.stored_config`): the task class of ``mmtx.tasks`` by its exact
    name, its hyper-parameters the constructor's own, classes of ``mmtx.models`` in the model
    config and of ``mmtx.data`` in the data config, plain values everywhere else."""
    try:
        cls = stored_class(ckpt[TASK_KEY], TASK, f"{path}: {TASK_KEY}") if TASK_KEY in ckpt else None
        hparams = ckpt.get("hyper_parameters")
        if isinstance(hparams, dict):
            if cls is not None:
                check_stored_arguments(hparams, cls, f"{path}: hyper_parameters")
            for key, value in hparams.items():
                check_stored_config(value, f"{path}: hyper_parameters.{key}", MODEL if key == "model" else PLAIN)
        if DATA_KEY in ckpt:  # a data module that has moved since: mmtx-eval asks for data= instead
            check_stored_config(ckpt[DATA_KEY], f"{path}: {DATA_KEY}", DATA, unknown_ok=True)
        if isinstance(hparams, dict) and isinstance(hparams.get("tokenizer"), str):
            check_tokenizer_json(hparams["tokenizer"], f"{path}: hyper_parameters.tokenizer")
        _check_callback_paths(ckpt.get("callbacks"), path)
    except StoredConfigError as e:
        raise CheckpointError(str(e)) from e
    except RecursionError:  # lists in lists ... a pickle can nest deeper than any config
        raise CheckpointError(f"{path}: its configs are nested too deeply to be mmtx's") from None


def _check_callback_paths(callbacks: Any, path: str | Path) -> None:
    """Lightning's ModelCheckpoint restores the file names its state records when a run resumes,
    and deletes the previous one as it saves the next: each must be a local ``.ckpt`` name that
    climbs out of no folder (``..``), never a remote URL (``hf://``, ``s3://``) or another file."""
    for name, state in (callbacks or {}).items() if isinstance(callbacks, dict) else ():
        if not isinstance(state, dict):
            continue
        named = [*(state.get("best_k_models") or {})] if isinstance(state.get("best_k_models"), dict) else []
        named += [state[key] for key in state if isinstance(key, str) and key.endswith("_path")]
        for value in named:
            if value and not (
                isinstance(value, str)
                and "://" not in value
                and ".." not in Path(value).parts
                and value.endswith(".ckpt")
            ):
                raise StoredConfigError(
                    f"{path}: callbacks[{str(name)[:40]!r}] names {str(value)[:80]!r}, not a checkpoint file of its run"
                )


def _unreadable(path: Path, error: Exception) -> str:
    """Why torch.load failed on ``path``, in words (torch's own message advises unsafe loading)."""
    with path.open("rb") as f:
        head = f.read(512)
    if head.startswith(b"PK\x03\x04"):
        reason = str(error).split(". ")[0]
        return f"{path} is truncated or corrupt: its zip archive cannot be read ({reason}); copy or save it again"
    if b"\0" not in head and _is_text(head):
        return f"{path} is a text file, not a PyTorch checkpoint"
    if isinstance(error, pickle.UnpicklingError):
        detail = str(error).split("WeightsUnpickler error:")[-1].split("Check the documentation")[0].strip()
        return (
            f"{path} is not a checkpoint mmtx can load safely: weights_only=True refused it ({detail}); "
            "it is another kind of pickle or file, and mmtx never runs code from a checkpoint"
        )
    return f"{path} is not a PyTorch checkpoint ({type(error).__name__}: {error})"


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > len(data) - 4  # a character cut at the end of the sample
    return True


def task_class(ckpt: dict[str, Any], path: str | Path) -> type[L.LightningModule]:
    """The LightningModule class that wrote ``ckpt`` (only classes from ``mmtx.tasks`` are allowed)."""
    name = ckpt.get(TASK_KEY)
    if not isinstance(name, str) or not name.startswith("mmtx.tasks."):
        raise CheckpointError(f"{path} was not written by an mmtx task (no valid '{TASK_KEY}' entry)")
    try:
        return stored_class(name, TASK, f"{path}: {TASK_KEY}")
    except StoredConfigError as e:  # renamed or removed since the checkpoint was written
        raise CheckpointError(str(e)) from e


def load_task(path: str | Path, map_location: str | torch.device = "cpu") -> L.LightningModule:
    """Rebuild the trained task (model, tokenizer, settings) from its checkpoint or from the
    directory ``mmtx-export`` wrote, in eval mode."""
    if Path(path).is_dir():
        return task_from_export(path).to(map_location).eval()
    return task_from_checkpoint(read_checkpoint(path), path).to(map_location).eval()


def rebuild_task(ckpt: dict[str, Any], path: str | Path) -> L.LightningModule:
    """The task that wrote the already-read checkpoint ``ckpt``, built from its settings, its
    weights as initialised (none under ``torch.device("meta")``: no memory, no time)."""
    cls = task_class(ckpt, path)
    try:
        return cls(**_entry(ckpt, "hyper_parameters", path), data_config=ckpt.get(DATA_KEY))
    except Exception as e:
        raise CheckpointError(f"{path}: cannot rebuild {cls.__name__} from its hyper_parameters: {e}") from e


def task_from_checkpoint(ckpt: dict[str, Any], path: str | Path) -> L.LightningModule:
    """The task that wrote the already-read checkpoint ``ckpt``, with its weights.

    The task is first built on the meta device (no memory, no time) and its tensors compared with
    the stored ones: a checkpoint whose settings ask for tensors it does not hold (a vocabulary of
    a billion rows beside a small embedding) is refused before any real memory is taken.
    """
    state = _entry(ckpt, "state_dict", path)
    with torch.device("meta"), warnings.catch_warnings():
        # public weights loaded into meta tensors (a captioner started from ViT/GPT-2 files): a no-op
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        shell = rebuild_task(ckpt, path)
    mismatched = _shape_mismatches(shell.state_dict(), state)
    if mismatched:
        raise CheckpointError(f"{path} does not match {type(shell).__name__}:\n{listing(mismatched)}")
    unstored = sum(t.numel() * t.element_size() for name, t in _tensors(shell) if name not in state)
    if unstored > MAX_UNSTORED_BYTES:
        raise CheckpointError(
            f"{path}: its settings build {unstored / 2**20:,.0f} MiB of tensors that it does not store "
            f"(more than {MAX_UNSTORED_BYTES // 2**20} MiB); refused before allocating them"
        )
    del shell
    task = rebuild_task(ckpt, path)
    task.load_state_dict(state)
    return task


# what a model may hold beyond its stored tensors (tables computed at build time, such as rotary
# frequencies): far above any mmtx model's, far below what would exhaust a machine
MAX_UNSTORED_BYTES = 256 * 2**20


def _tensors(module: nn.Module) -> list[tuple[str, Tensor]]:
    return [*module.named_parameters(), *module.named_buffers()]


def check_resume(
    ckpt: dict[str, Any],
    path: str | Path,
    task_target: str,
    model: dict[str, Any],
    task: Mapping[str, Any] | None = None,
) -> None:
    """Refuse to resume from checkpoint ``ckpt`` (read from ``path``) with a task or a model
    config its weights do not fit.

    The checkpoint's task class must be ``task_target``; the task is rebuilt with ``model`` on
    the meta device (no memory, no time) and its tensor names and shapes compared with the
    checkpoint's. A mismatch names the model config keys that differ from the checkpoint's and
    the tensors that do not fit, instead of Lightning's size-mismatch traceback. ``task`` (the
    run's task config), when given, must freeze and adapt what the checkpoint's did
    (``task.freeze``, ``task.lora``): the optimizer state is that of the parameters that trained.
    Other changed settings (say dropout) are allowed, and logged.
    """
    cls = task_class(ckpt, path)
    written = f"{cls.__module__}.{cls.__qualname__}"
    if written != task_target:
        raise CheckpointError(
            f"cannot resume from {path}: it was written by {written}, but the config trains {task_target}; "
            "choose the checkpoint's task, or start a new run from its weights with init_from="
        )
    hparams, state = _entry(ckpt, "hyper_parameters", path), _entry(ckpt, "state_dict", path)
    for key, settings in (("freeze", Freeze), ("lora", Lora)):  # which parameters train, and their optimizer state
        try:
            before, now = settings.from_config(hparams.get(key)), settings.from_config((task or {}).get(key))
        except ValueError as e:
            raise CheckpointError(f"cannot resume from {path}: {e}") from e
        if task is not None and before != now:
            raise CheckpointError(
                f"cannot resume from {path}: task.{key} differs from the checkpoint's ({before} -> {now}), and the "
                f"optimizer state belongs to the parameters that trained; resume with the checkpoint's task.{key}, "
                f"or start a new run from its weights with init_from={path}"
            )
    changed = _differences(hparams.get("model"), model, "model")
    try:
        with torch.device("meta"):
            task = cls(**{**hparams, "model": model})
    except Exception as e:
        raise CheckpointError(
            f"cannot resume from {path}: its task does not build with this model config ({e}); "
            f"the config differs from the checkpoint's in:\n{listing(changed)}"
        ) from e
    mismatched = _shape_mismatches(task.state_dict(), state)
    if mismatched:
        raise CheckpointError(
            f"cannot resume from {path}: the model config differs from the checkpoint's in:\n"
            f"{listing(changed) or '  (no key: the data or tokenizer changed the sizes)'}\n"
            f"so {len(mismatched)} tensor(s) do not fit:\n{listing(mismatched, 5)}\n"
            f"Resume with the checkpoint's model settings, or start a new run from its weights with init_from={path}"
        )
    if changed:
        log.warning("resuming from %s with changed model settings:\n%s", path, listing(changed))


def _entry(ckpt: dict[str, Any], key: str, path: str | Path) -> dict[str, Any]:
    value = ckpt.get(key)
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} is not a complete mmtx checkpoint: no '{key}' entry")
    return value


def _shape_mismatches(own: dict[str, torch.Tensor], saved: dict[str, Any]) -> list[str]:
    """Tensors missing from either side or of different shapes, one line each."""
    lines = []
    for name in sorted(set(own) | set(saved)):
        if name not in saved:
            lines.append(f"{name}: not in the checkpoint")
        elif name not in own:
            lines.append(f"{name}: in the checkpoint, not in the model")
        elif not isinstance(saved[name], torch.Tensor):
            lines.append(f"{name}: not a tensor in the checkpoint")
        elif tuple(own[name].shape) != tuple(saved[name].shape):
            lines.append(f"{name}: {tuple(saved[name].shape)} in the checkpoint, {tuple(own[name].shape)} now")
    return lines


def _differences(saved: Any, new: Any, key: str) -> list[str]:
    """``key.sub: old in the checkpoint, new now`` for each leaf where two configs differ."""
    if isinstance(saved, dict) and isinstance(new, dict):
        return [
            line
            for k in sorted(set(saved) | set(new), key=str)
            for line in _differences(saved.get(k, _ABSENT), new.get(k, _ABSENT), f"{key}.{k}")
        ]
    if saved == new or (saved is _ABSENT and new is None):  # a setting added since, left at its default
        return []
    return [f"{key}: {_shown(saved)} in the checkpoint, {_shown(new)} now"]


_ABSENT = object()


def _shown(value: Any) -> str:
    return "absent" if value is _ABSENT else repr(value)


def init_from(
    module: nn.Module,
    ckpt: dict[str, Any],
    path: str | Path,
    renames: Mapping[str, str] | None = None,
    new_tokens: Mapping[int, Sequence[int]] | None = None,
) -> tuple[list[str], list[str]]:
    """Copy into ``module`` every weight of checkpoint ``ckpt`` (read from ``path``) whose name
    and shape match.

    ``renames`` maps name prefixes of the checkpoint to this module's (e.g. a pretraining
    checkpoint's ``model.backbone.vision.`` to a captioner's ``model.encoder.``); names that no
    prefix matches are compared as they are. ``new_tokens`` maps the ids the run's vocabulary
    adds to the checkpoint's (appended after them) to the old ids that spelled each
    (`mmtx.data.tokenizer.spellings`): every tensor indexed by the vocabulary grows by those
    rows, each the mean of its pieces' rows (Gee et al. 2022's vocabulary transfer). From and
    to runs with low-rank adapters (``task.lora``): a LoRA checkpoint's adapters are folded into
    plain weights, and plain weights go under an adapted layer's ``base_layer``. Returns
    (loaded, left as initialised) names.
    """
    state = ckpt.get("state_dict", ckpt)
    hparams = ckpt.get("hyper_parameters") if "state_dict" in ckpt else None
    state = plain_state(state, (hparams or {}).get("lora"))  # a LoRA run's adapters folded in
    for old, new in (renames or {}).items():
        state = {new + k[len(old) :] if k.startswith(old) else k: v for k, v in state.items()}
    own = module.state_dict()
    state = adapted_names(state, own)  # into a LoRA run: the plain weights under its layers
    if new_tokens:
        state = _grow_vocabulary_rows(state, own, new_tokens)
    loaded = [k for k, v in state.items() if k in own and own[k].shape == v.shape]
    kept = set(loaded)
    skipped = [k for k in own if k not in kept]
    if not loaded:
        raise CheckpointError(f"init_from={path}: no parameter name and shape matches this model")
    module.load_state_dict({k: state[k] for k in loaded}, strict=False)
    log.info("init_from %s: loaded %d tensors, %d left as initialised", path, len(loaded), len(skipped))
    unused = [k for k in state if k not in kept]
    if unused:  # e.g. a learned position table where this model's positions are fixed
        shown = ", ".join(unused[:3]) + (", ..." if len(unused) > 3 else "")
        log.info("init_from %s: %d of its tensors fit no weight here (%s)", path, len(unused), shown)
    return loaded, skipped


def _grow_vocabulary_rows(
    state: dict[str, Tensor], own: Mapping[str, Tensor], new_tokens: Mapping[int, Sequence[int]]
) -> dict[str, Tensor]:
    """``state`` with each tensor of the old vocabulary's rows (V, ...) that ``own`` holds with
    ``len(new_tokens)`` more grown by them, a new token's row the mean of its spelling's."""
    old_rows = min(new_tokens)
    new_rows = old_rows + len(new_tokens)
    grown = dict(state)
    for name, value in state.items():
        if (
            value.ndim
            and value.shape[0] == old_rows
            and name in own
            and own[name].shape == (new_rows, *value.shape[1:])
        ):
            added = [
                value[list(ids)].float().mean(0) if ids else own[name][i].float()
                for i, ids in sorted(new_tokens.items())
            ]
            grown[name] = torch.cat([value, torch.stack(added).to(value.dtype)])
            log.info("init_from: %s grown by %d rows for the new tokens", name, len(added))
    return grown
