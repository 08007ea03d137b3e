"""The loader object behaves as torch's: picklable, validated state, guarded sharing."""

from __future__ import annotations

import copy
import pickle
import re
import threading
import time

import pytest
import torch.utils.data as tud
from torch.utils.data import Dataset

import minato

pytestmark = pytest.mark.timeout(120)


class Numbers(Dataset):
    def __init__(self, n: int = 40, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if self.delay:
            time.sleep(self.delay)
        return index


def flat(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_loader_copies_as_torchs_does(how: str, persistent: bool) -> None:
    def duplicate(loader):
        return pickle.loads(pickle.dumps(loader)) if how == "pickle" else copy.deepcopy(loader)

    options = dict(batch_size=4, num_workers=2, persistent_workers=persistent)
    theirs = tud.DataLoader(Numbers(), **options)
    ours = minato.DataLoader(Numbers(), **options)
    their_copy = duplicate(theirs)
    # Mid-epoch: the live iterator (and its workers) is not carried. (torch
    # refuses to copy a persistent loader once iterated; minato copies it.)
    our_iter = iter(ours)
    next(our_iter)
    our_copy = duplicate(ours)
    assert type(our_copy) is minato.DataLoader
    assert flat(our_copy) == flat(their_copy) == list(range(40))
    assert our_copy.stats().samples == 40  # its own stats, from zero
    assert our_copy.worker_method == ours.worker_method
    # The original goes on with its own epoch.
    assert [int(i) for batch in our_iter for i in batch] == list(range(4, 40))


def test_a_copy_made_after_load_state_dict_resumes_there() -> None:
    loader = minato.DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=2)
    iterator = iter(loader)
    first = [int(i) for _, batch in zip(range(3), iterator, strict=False) for i in batch]
    state = loader.state_dict()
    del iterator
    restored = minato.DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=2)
    restored.load_state_dict(state)
    rest = flat(copy.deepcopy(restored))
    assert sorted(first + rest) == list(range(40))


def _mid_epoch_state(**options) -> dict:
    loader = minato.DataLoader(Numbers(), batch_size=4, num_workers=2, **options)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    del iterator
    return state


@pytest.mark.parametrize(
    "saved,restored,named",
    [
        (dict(), dict(batch_size=8), "batch_size"),
        (dict(), dict(dataset=Numbers(41)), "len(dataset)"),
        (dict(shuffle=True), dict(shuffle=False), "sampler type"),
        (dict(), dict(drop_last=True), "drop_last"),
    ],
)
def test_a_state_that_does_not_fit_is_refused_naming_the_mismatch(
    saved: dict, restored: dict, named: str
) -> None:
    state = _mid_epoch_state(**saved)
    options = {"dataset": Numbers(), "batch_size": 4, "num_workers": 2, **saved, **restored}
    loader = minato.DataLoader(**options)
    with pytest.raises(ValueError, match=re.escape(named)):
        loader.load_state_dict(state)


@pytest.mark.parametrize(
    "damage",
    [
        lambda state: state.pop("generators"),
        lambda state: state["epoch"].pop("undelivered"),
        lambda state: state["epoch"].pop("mode"),
        lambda state: state["epoch"].update(pulled="three"),
        lambda state: state.update(epoch=[1, 2]),
    ],
)
def test_a_malformed_state_raises_value_error_at_load_time(damage) -> None:
    state = _mid_epoch_state()
    damage(state)
    loader = minato.DataLoader(Numbers(), batch_size=4, num_workers=2)
    with pytest.raises(ValueError, match="malformed"):
        loader.load_state_dict(state)


def test_a_matching_state_still_loads_and_older_states_without_a_shape_too() -> None:
    state = _mid_epoch_state()
    older = {key: value for key, value in state.items() if key != "loader"}
    for saved in (state, older):
        loader = minato.DataLoader(Numbers(), batch_size=4, num_workers=2)
        loader.load_state_dict(copy.deepcopy(saved))
        assert sorted(flat(loader)) == list(range(4, 40))


def test_two_threads_on_one_iterator_the_second_is_refused_at_once() -> None:
    loader = minato.DataLoader(
        Numbers(40, delay=0.02),
        batch_size=2,
        num_workers=1,
        persistent_workers=True,
        worker_method="thread",
    )
    iterator = iter(loader)
    seen: list[int] = []
    refusals: list[float] = []
    lock = threading.Lock()

    def consume() -> None:
        while True:
            started = time.monotonic()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            except RuntimeError as error:
                assert "in use by another thread" in str(error)
                with lock:
                    refusals.append(time.monotonic() - started)
                time.sleep(0.001)
                continue
            with lock:
                seen.extend(int(i) for i in batch)

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert refusals, "both threads were never in next() at once"
    assert max(refusals) < 0.1  # refused at once, not after a wait
    assert sorted(seen) == list(range(40))  # the epoch is intact: every index once
