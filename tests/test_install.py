"""``minato.install()`` (issue 32): one line that makes loaders built by
calling torch's DataLoader, under whatever name a library imported it,
minato's; subclasses and copies of torch's loaders are left alone, and
``uninstall()`` undoes it."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.utils.data as tud
from torch.utils.data import DataLoader as BoundBeforeInstall

import minato

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _uninstalled_after() -> Iterator[None]:
    yield
    minato.uninstall()


def test_import_minato_installs_nothing() -> None:
    code = (
        "import minato, torch.utils.data as tud\n"
        "assert type(tud.DataLoader(list(range(4)))) is tud.DataLoader\n"
        "assert not minato.installer.installed()\n"
        "print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/"
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_torchs_class_builds_minato_loaders_under_any_name() -> None:
    minato.install()
    for cls in (tud.DataLoader, torch.utils.data.dataloader.DataLoader, BoundBeforeInstall):
        loader = cls(list(range(10)), batch_size=4, num_workers=2)
        assert isinstance(loader, minato.DataLoader)
        assert isinstance(loader, tud.DataLoader)
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_install_options_are_defaults_a_call_overrides() -> None:
    minato.install(on_error="skip", num_workers=2)
    loader = tud.DataLoader(list(range(10)))
    assert (loader.on_error, loader.num_workers) == ("skip", 2)
    given = tud.DataLoader(list(range(10)), num_workers=0, on_error="raise")
    assert (given.on_error, given.num_workers) == ("raise", 0)
    # minato's own class takes the defaults only through torch's name.
    assert minato.DataLoader(list(range(10))).on_error == "raise"


def test_install_rejects_unknown_options() -> None:
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['workers'\\]"):
        minato.install(workers=2)
    assert not minato.installer.installed()


def test_subclasses_and_copies_of_torchs_loaders_stay_torchs() -> None:
    before = tud.DataLoader(list(range(6)), batch_size=2)
    minato.install()

    class Subclass(tud.DataLoader):  # type: ignore[type-arg]
        pass

    assert type(Subclass(list(range(6)))) is Subclass
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(list(range(6)), batch_size=2)
    assert type(loader) is stateful.StatefulDataLoader
    for copied in (copy.deepcopy(before), pickle.loads(pickle.dumps(before))):
        assert type(copied) is tud.DataLoader
        assert [batch.tolist() for batch in copied] == [[0, 1], [2, 3], [4, 5]]


def test_uninstall_gives_torchs_class_back() -> None:
    minato.install()
    made = tud.DataLoader(list(range(4)))
    minato.uninstall()
    assert type(tud.DataLoader(list(range(4)), batch_size=2)) is tud.DataLoader
    # What was built meanwhile stays minato's, and is copied as such.
    assert isinstance(copy.deepcopy(made), minato.DataLoader)
    # Installing again works as the first time.
    minato.install()
    assert isinstance(tud.DataLoader(list(range(4))), minato.DataLoader)


def test_lightning_recreates_an_installed_loader_with_minatos_defaults() -> None:
    fabric_data = pytest.importorskip("lightning.fabric.utilities.data")
    minato.install(on_error="skip")
    # As Lightning's Trainer records a loader's arguments, then re-creates it
    # with its own sampler (a DistributedSampler under DDP).
    with fabric_data._replace_dunder_methods(tud.DataLoader, "dataset"):
        loader = tud.DataLoader(list(range(10)), batch_size=2, num_workers=2, shuffle=True)
    recreated = fabric_data._update_dataloader(loader, tud.SequentialSampler(range(10)))
    assert type(recreated) is type(loader) and isinstance(recreated, minato.DataLoader)
    assert recreated.on_error == "skip" and recreated.in_order_given() is None
    assert [batch.tolist() for batch in recreated][:2] == [[0, 1], [2, 3]]


def test_webdatasets_webloader_builds_a_minato_loader() -> None:
    # WebLoader calls torch.utils.data.DataLoader(...) itself.
    wds = pytest.importorskip("webdataset")
    minato.install(on_error="skip")
    dataset = tud.TensorDataset(torch.arange(10))
    loader = wds.WebLoader(dataset, batch_size=4, num_workers=2)
    inner = loader.pipeline[0]
    assert isinstance(inner, minato.DataLoader) and inner.on_error == "skip"
    assert [batch[0].tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
