"""A user's loader's settings carried over once, with the settings torch takes only with workers."""

from __future__ import annotations

from torch.utils.data import DataLoader

from lightning_resumable.readers.settings import DATA_LIBRARY_SETTINGS, TORCH_SETTINGS, forwarded_settings

DATA = list(range(8))


def test_every_setting_of_a_loader_with_workers_is_carried_over() -> None:
    loader = DataLoader(DATA, batch_size=3, num_workers=2, prefetch_factor=5, persistent_workers=True, timeout=7)
    settings = forwarded_settings(loader, TORCH_SETTINGS, batch_size=None)
    assert settings["batch_size"] is None and settings["prefetch_factor"] == 5 and settings["timeout"] == 7
    assert settings["persistent_workers"] is True and settings["num_workers"] == 2
    rebuilt = DataLoader(DATA, **settings)
    assert all(getattr(rebuilt, name) == value for name, value in settings.items())


def test_without_workers_the_worker_only_settings_are_left_out() -> None:
    settings = forwarded_settings(DataLoader(DATA, batch_size=2), TORCH_SETTINGS)
    assert not {"prefetch_factor", "persistent_workers", "multiprocessing_context"} & set(settings)
    assert next(iter(DataLoader(DATA, **settings))).tolist() == [0, 1]


def test_a_data_librarys_loader_keeps_its_workers_only_where_the_users_did() -> None:
    """A data library's loader built in place of the user's is given ``persistent_workers`` as the user's had it,
    and not without workers (torch refuses it there)."""
    for workers, kept in ((0, False), (2, False), (2, True)):
        user = DataLoader(DATA, num_workers=workers, persistent_workers=kept)
        settings = forwarded_settings(user, DATA_LIBRARY_SETTINGS)
        assert settings.get("persistent_workers", False) is kept
        assert DataLoader(DATA, **settings).persistent_workers is kept
