"""Every piece of Lightning internals this library uses, here, in `_loop_progress` (the loop progress a
checkpoint writes) and in `_lightning_signals` (Lightning's handling of preemption signals).

Checked against lightning 2.6.6 (the version CI installs); ``tests/test_lightning_internals.py``
fails if these attributes move. Everything else in the library uses public API only.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.data import _reinstantiate_wrapped_cls
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch.utilities import CombinedLoader
from lightning.pytorch.utilities.data import _get_dataloader_init_args_and_kwargs, _is_dataloader_shuffled
from torch.utils.data import DataLoader, Dataset, Sampler

__all__ = [
    "batches_fetched_before",
    "batches_processed",
    "combined_loader_mode",
    "epoch_of_trained_batches",
    "given_arguments",
    "rebuild_train_loader",
    "rebuild_with_dataset",
    "reinstantiate_loader",
    "resumes_in_next_epoch",
    "saving_off_the_training_path",
    "set_fabric_pass_count",
    "silence_not_resumable_warning",
    "validates_by_time",
    "validation_follows",
]

log = logging.getLogger("lightning.pytorch.lightning_resumable")
"""Under Lightning's logger, whose console handler prints INFO: each rank says how it met a signal."""

_NOT_RESUMABLE_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"


def batches_processed(trainer: pl.Trainer) -> int:
    """Batches of the current epoch that the trainer counts as done if a checkpoint is written now.

    ``processed`` is right at every save point: in ``on_train_batch_end`` (the batch is done and the
    resume starts after it), inside ``training_step`` (not yet counted; the resume re-runs it) and
    during mid-epoch validation (counted; the resume starts after it). After a restore, before the
    first batch, it is the count the resumed epoch continues from.
    """
    return _processed(trainer.fit_loop.epoch_loop.batch_progress.current)


def epoch_of_trained_batches(trainer: pl.Trainer) -> int:
    """The epoch the trainer's count of batches (`batches_processed`) belongs to: ``current_epoch``, but once
    ``fit()`` returned, the epoch it ended (Lightning's ``current_epoch`` has moved past it, no batch of the
    next one trained)."""
    from lightning.pytorch.trainer.states import TrainerStatus

    epoch = trainer.fit_loop.epoch_progress.current
    ended = trainer.state.status == TrainerStatus.FINISHED and epoch.completed == _processed(epoch) > 0
    return trainer.current_epoch - 1 if ended and trainer.current_epoch == epoch.completed else trainer.current_epoch


def validates_by_time(trainer: pl.Trainer) -> bool:
    """Whether the trainer's ``val_check_interval`` is a time (2.6: ``"DD:HH:MM:SS"``, a ``timedelta``, a dict): then
    Lightning reads ``time.monotonic()`` to decide each validation, and a prediction would read the clock again."""
    return getattr(trainer, "_val_check_time_interval", None) is not None


def validation_follows(trainer: pl.Trainer) -> bool:
    """Whether Lightning validates after the training batch now ending (a save in ``on_train_batch_end``):
    ``_TrainingEpochLoop.on_advance_end`` asks ``_should_check_val_fx`` right after that hook."""
    fit_loop = trainer.fit_loop
    if trainer.validating or fit_loop._data_fetcher is None:
        return False
    return bool(fit_loop.epoch_loop._should_check_val_fx(fit_loop._data_fetcher))


def resumes_in_next_epoch(trainer: pl.Trainer) -> bool:
    """Whether Lightning, restored from a checkpoint written now after the epoch's last batch, starts the next
    epoch (``True``) or first ends this one (``False``: its last batch had completed, a validation after it
    runs or ran, and ``on_train_epoch_end`` has not).

    The fit loop starts the next epoch when the epoch's end ran (``epoch_progress.processed``), or when the
    save came from the last batch's ``on_train_batch_end`` (``RESTARTED_ON_TRAIN_BATCH_END``), unless a
    validation follows that batch, which `validation_resumes_from_its_start` makes the resume run first.
    """
    fit_loop = trainer.fit_loop
    if _processed(fit_loop.epoch_progress.current) > trainer.current_epoch:
        return True
    batch = fit_loop.epoch_loop.batch_progress.current
    return batch.completed < _processed(batch) and not validation_follows(trainer)


def _processed(progress: object) -> int:
    return int(progress.processed)  # type: ignore[attr-defined]  # a _ProcessedTracker at runtime


def batches_fetched_before(checkpoint: dict[str, Any]) -> int | None:
    """Train batches the run had fetched when ``checkpoint`` was written, from Lightning's loop state
    (``None`` where the checkpoint holds none: written outside a fit)."""
    try:
        progress = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["ready"]
    except (KeyError, TypeError):
        return None
    return progress if isinstance(progress, int) else None


def saving_off_the_training_path(trainer: pl.Trainer) -> bool:
    """Whether a checkpoint is being written where the ranks may not be in step, so that a collective
    could deadlock: from an exception (``OnExceptionCheckpoint``, Lightning's ``SIGTERMException``),
    after a SIGTERM, or from inside a signal handler (the SLURM auto-requeue handler saves there).

    Lightning composes its signal handlers in ``_HandlersCompose.__call__`` (signal_connector.py);
    a frame of it on the stack means this save runs inside one.
    """
    from lightning.pytorch.trainer.connectors.signal_connector import _HandlersCompose
    from lightning.pytorch.trainer.states import TrainerStatus

    if trainer.state.status == TrainerStatus.INTERRUPTED or trainer.received_sigterm:
        return True
    handler_code = _HandlersCompose.__call__.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is handler_code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def silence_not_resumable_warning() -> None:
    """Hide Lightning's warning that a mid-epoch resume is unreliable for a loader without ``state_dict``.

    Our loader deliberately has no ``state_dict`` (the callback is the one owner of its position), so
    Lightning's check (``training_epoch_loop.py``, ``is_resumable_loader``) would warn on every resume.
    """
    warnings.filterwarnings("ignore", message=_NOT_RESUMABLE_WARNING, category=PossibleUserWarning)


def rebuild_train_loader(trainer: pl.Trainer) -> None:
    """Make the fit's start, or the next epoch's, call ``train_dataloader()`` again, as
    ``reload_dataloaders_every_n_epochs`` does.

    Lightning counts an epoch's batches once per loader build (``FitLoop.setup_data`` sets
    ``max_batches``). After a resume on another world size that count is the resumed epoch's (in the
    old world size's units), so the following epochs need a fresh build to be counted right.
    ``setup_data`` rebuilds when ``_combined_loader`` is ``None``; it runs at every epoch start.
    """
    trainer.fit_loop._combined_loader = None


def reinstantiate_loader(loader: DataLoader[Any], dataset: Dataset[Any], sampler: Sampler[Any]) -> DataLoader[Any]:
    """``loader`` built again by its own class, with ``dataset`` and ``sampler`` in place of its own.

    Lightning's re-instantiation (what ``_update_dataloader`` does to inject a ``DistributedSampler``)
    replays a ``DataLoader`` subclass's constructor with the arguments it was called with, which
    Lightning records while ``train_dataloader()`` runs (``__pl_saved_args``), or else reads them from
    the instance's attributes.

    Raises:
        ValueError: the constructor cannot be replayed (a required argument it does not keep, no
            ``**kwargs`` to take the sampler, or no dataset among its arguments); the message says which.
    """
    args: tuple[Any, ...]
    try:
        args, kwargs = _get_dataloader_init_args_and_kwargs(loader, sampler)
    except (MisconfigurationException, TypeError) as error:
        raise ValueError(str(error)) from error
    # The dataset is whichever recorded argument is the loader's dataset (whatever the subclass names it).
    original = loader.dataset
    kwargs = {name: dataset if value is original else value for name, value in kwargs.items()}
    replaced = any(value is original for value in args) or any(value is dataset for value in kwargs.values())
    args = tuple(dataset if value is original else value for value in args)
    if not replaced:
        raise ValueError(f"{type(loader).__name__} was built without its dataset among the recorded arguments")
    rebuilt: DataLoader[Any] = _reinstantiate_wrapped_cls(loader, *args, **kwargs)
    return rebuilt


def given_arguments(loader: DataLoader[Any]) -> dict[str, Any] | None:
    """The arguments ``loader``'s constructor was called with, by name, as Lightning records them for a
    loader built inside one of its hooks (``__pl_saved_args``, ``__pl_saved_arg_names``,
    ``__pl_saved_kwargs``); ``None`` for a loader built elsewhere."""
    if not hasattr(loader, "__pl_saved_args"):
        return None
    names = getattr(loader, "__pl_saved_arg_names")
    given = dict(zip(names, getattr(loader, "__pl_saved_args"), strict=False))
    given.update(getattr(loader, "__pl_saved_kwargs"))
    return given


def rebuild_with_dataset(loader: DataLoader[Any], dataset: Dataset[Any]) -> DataLoader[Any]:
    """``loader`` built again by its own class with the arguments it was given, ``dataset`` in place of its
    own: the same sampler or batch sampler, ``shuffle`` and every setting.

    A loader built inside a Lightning hook carries the arguments it was called with (``__pl_saved_args``
    and ``__pl_saved_kwargs``, which Lightning also reads to tell whether an evaluation loader shuffles,
    ``_is_dataloader_shuffled``); those are replayed. One built elsewhere is rebuilt from its attributes
    with its sampler (`reinstantiate_loader`).

    Raises:
        ValueError: the constructor cannot be replayed, or a loader built outside a hook has a batch
            sampler (its attributes do not say how to rebuild it).
    """
    if not hasattr(loader, "__pl_saved_args"):
        if loader.batch_size is None:
            raise ValueError(
                f"{type(loader).__name__} with a batch_sampler was built outside a Lightning hook; build it in"
                " the hook that returns it"
            )
        rebuilt_here = reinstantiate_loader(loader, dataset, loader.sampler)  # type: ignore[arg-type]  # a Sampler
        if isinstance(recorded := getattr(rebuilt_here, "__pl_saved_kwargs", None), dict):  # rebuilt in a hook:
            recorded["shuffle"] = _is_dataloader_shuffled(loader)  # not shuffle=False: Lightning warns from it
        return rebuilt_here
    original = loader.dataset
    args = tuple(dataset if value is original else value for value in getattr(loader, "__pl_saved_args"))
    saved_kwargs = getattr(loader, "__pl_saved_kwargs")
    kwargs: dict[str, Any] = {name: dataset if value is original else value for name, value in saved_kwargs.items()}
    if not any(value is dataset for value in (*args, *kwargs.values())):
        raise ValueError(f"{type(loader).__name__} was built without its dataset among the recorded arguments")
    rebuilt: DataLoader[Any] = _reinstantiate_wrapped_cls(loader, *args, **kwargs)
    return rebuilt


def combined_loader_mode(loader: CombinedLoader) -> str:
    """The mode a user's ``CombinedLoader`` was built with (Lightning keeps it private)."""
    return str(loader._mode)


def set_fabric_pass_count(loader: object, passes: int) -> bool:
    """Make a loader set up by Fabric (``_FabricDataLoader``) count ``passes`` passes so far; ``False``
    for any other loader.

    On every ``iter()`` Fabric calls ``sampler.set_epoch(_num_iter_calls)`` and increments it: the
    epoch it sets is the number of passes this process has made (wrappers.py, ``__iter__``). A resumed
    process starts that count at 0; set to the restored epoch, Fabric's epochs are the run's again.
    """
    from lightning.fabric.wrappers import _FabricDataLoader

    if not isinstance(loader, _FabricDataLoader):
        return False
    loader._num_iter_calls = passes
    return True
