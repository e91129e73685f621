"""ddpdoctor's wrappers are invisible: torch's warnings name the line they name without ddpdoctor, and the script's
traceback has no ddpdoctor frame in it (issue 19, point 3)."""

from __future__ import annotations

import traceback
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from ddpdoctor.capture import dp as dp_capture
from ddpdoctor.capture.invisible import invisible, is_own_file, strip_exception
from ddpdoctor.capture.setup import SetupObserver


class _Items(Dataset):
    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fail_at:
            raise ValueError(f"bad sample {i}")
        return torch.tensor([i])


def _first_batch(loader: DataLoader) -> None:
    for _ in loader:  # the user's line
        break


def _pin_memory_warning() -> tuple[str, int]:
    """Where the DataLoader's "'pin_memory' ... no accelerator" UserWarning points (this machine has no GPU)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _first_batch(DataLoader(_Items(), batch_size=2, pin_memory=True))
    hits = [w for w in seen if "pin_memory" in str(w.message)]
    assert hits, [str(w.message) for w in seen]
    return hits[0].filename, hits[0].lineno


@pytest.mark.skipif(torch.cuda.is_available(), reason="the pin_memory warning is given only without an accelerator")
def test_dataloader_warning_points_where_it_does_without_ddpdoctor():
    bare = _pin_memory_warning()
    observer = SetupObserver()
    observer.install()
    try:
        traced = _pin_memory_warning()
    finally:
        observer.uninstall()
    assert not is_own_file(traced[0]), traced
    assert traced == bare


def _warns_at_caller() -> None:
    warnings.warn("look at your caller", UserWarning, stacklevel=2)


def test_a_wrapper_is_skipped_by_stacklevel_and_a_plain_one_is_not():
    def plain(original):
        def wrapper(*args, **kwargs):
            return original(*args, **kwargs)

        return wrapper

    for wrap, points_at_caller in ((plain, False), (lambda f: invisible(plain(f)), True)):
        wrapped = wrap(_warns_at_caller)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            wrapped()
            line = traceback.extract_stack(limit=1)[0].lineno - 1  # the line above: `wrapped()`
        assert (seen[0].filename == __file__ and seen[0].lineno == line) is points_at_caller, (
            seen[0].filename,
            seen[0].lineno,
        )


def test_dataparallel_wrappers_are_invisible_too():
    dp_capture.install()
    try:
        wrapped = torch.nn.DataParallel.__init__
        assert is_own_file(wrapped.__code__.co_filename) and "importlib._bootstrap" in wrapped.__code__.co_filename
    finally:
        dp_capture.uninstall()


def test_traceback_through_a_wrapper_shows_only_the_users_frames():
    observer = SetupObserver()
    observer.install()
    try:
        with pytest.raises(ValueError) as info:
            _first_batch(DataLoader(_Items(fail_at=0), batch_size=2))
    finally:
        observer.uninstall()
    raw = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert any(is_own_file(name) for name in raw), raw  # the wrapper was on the stack
    stripped = traceback.extract_tb(strip_exception(info.value, info.value.__traceback__))
    assert not any(is_own_file(f.filename) for f in stripped), stripped
    assert [f.name for f in stripped if f.filename == __file__] == [
        "test_traceback_through_a_wrapper_shows_only_the_users_frames",
        "_first_batch",
        "__getitem__",
    ]


def test_knob_wrappers_are_invisible_too():
    """`trace --set loader.*` wraps DataLoader(...): the user's call of it must read as without ddpdoctor."""
    from ddpdoctor.capture.knobs import Applier

    applier = Applier({"loader.pin_memory": "true"})
    applier.install()
    try:
        wrapped = DataLoader.__init__
        with pytest.raises(ValueError) as info:
            DataLoader(_Items(), batch_size=-1)  # torch refuses it inside __init__
    finally:
        applier.uninstall()
    assert is_own_file(wrapped.__code__.co_filename) and "importlib._bootstrap" in wrapped.__code__.co_filename
    raw = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert any(is_own_file(name) for name in raw), raw
    stripped = traceback.extract_tb(strip_exception(info.value, info.value.__traceback__))
    assert not any(is_own_file(f.filename) for f in stripped), stripped
