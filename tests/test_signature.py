"""minato.DataLoader is torch's class: signature, validation, attributes, len()."""

from __future__ import annotations

import inspect
import math
import time

import pytest
import torch
import torch.utils.data as tud
from helpers import RangeDataset, ShardedIterable, UnshardedIterable

import minato


def test_is_a_subclass_of_torchs_dataloader() -> None:
    assert issubclass(minato.DataLoader, tud.DataLoader)
    assert isinstance(minato.DataLoader(RangeDataset()), tud.DataLoader)


def test_signature_matches_torch_except_in_order_default() -> None:
    ours = inspect.signature(minato.DataLoader.__init__).parameters
    theirs = inspect.signature(tud.DataLoader.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, param in theirs.items():
        assert ours[name].kind == param.kind, name
        expected_default = None if name == "in_order" else param.default
        assert ours[name].default == expected_default, name


MINATO_OPTIONS = {
    "sample_timeout": "auto",
    "sample_timeout_warmup": 64,
    "max_slow_samples": None,
    "adaptive": True,
    "max_workers": None,
    "log_interval": None,
    "device": None,
    "device_prefetch": 2,
    "on_error": "raise",
    "max_failures": None,
    "worker_method": "auto",
    "sample_hard_timeout": None,
    "worker_nice": 10,
}


def test_minato_options_come_after_torchs_keyword_only_and_are_public_attributes() -> None:
    params = inspect.signature(minato.DataLoader.__init__).parameters
    theirs = inspect.signature(tud.DataLoader.__init__).parameters
    extra = {name: p for name, p in params.items() if name not in theirs}
    assert list(extra) == list(MINATO_OPTIONS)
    for name, param in extra.items():
        assert param.kind == inspect.Parameter.KEYWORD_ONLY
        assert param.default == MINATO_OPTIONS[name]
    given = dict(
        sample_timeout=0.5,
        sample_timeout_warmup=10,
        max_slow_samples=3,
        adaptive=False,
        max_workers=7,
        log_interval=2.5,
        device="cpu",
        device_prefetch=3,
        on_error="skip",
        max_failures=5,
        worker_method="multiprocessing",
        sample_hard_timeout=30.0,
        worker_nice=5,
    )
    loader = minato.DataLoader(RangeDataset(), num_workers=2, **given)
    assert {name: getattr(loader, name) for name in given} == given


@pytest.mark.parametrize(
    "kwargs,error",
    [
        (dict(sample_timeout="fast"), TypeError),
        (dict(sample_timeout=0), ValueError),
        (dict(sample_timeout=-1.5), ValueError),
        (dict(sample_timeout=True), TypeError),
        (dict(sample_timeout_warmup=0), ValueError),
        (dict(sample_timeout_warmup=2.5), ValueError),
        (dict(max_slow_samples=-1), ValueError),
        (dict(max_slow_samples="2"), ValueError),
        (dict(adaptive=1), TypeError),
        (dict(max_workers=0), ValueError),
        (dict(max_workers=2.0), ValueError),
        (dict(max_workers=1, num_workers=2), ValueError),
        (dict(log_interval=0), ValueError),
        (dict(log_interval="1s"), ValueError),
    ],
)
def test_invalid_minato_options_are_refused(kwargs, error) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        minato.DataLoader(RangeDataset(), **kwargs)


def test_in_order_attribute_keeps_the_value_given() -> None:
    from minato.dataloader import DEFAULT_ORDER

    default = minato.DataLoader(RangeDataset())
    assert default.in_order is DEFAULT_ORDER and default.in_order_given() is None
    assert minato.DataLoader(RangeDataset(), in_order=False).in_order is False
    assert minato.DataLoader(RangeDataset(), in_order=True).in_order is True
    # Given back (a loader re-created from its attributes): the default again.
    again = minato.DataLoader(RangeDataset(), in_order=default.in_order)
    assert again.in_order is DEFAULT_ORDER
    import pickle

    assert pickle.loads(pickle.dumps(DEFAULT_ORDER)) is DEFAULT_ORDER


def test_attributes_are_torchs() -> None:
    kwargs = dict(
        batch_size=4,
        shuffle=True,
        num_workers=2,
        drop_last=True,
        timeout=3,
        persistent_workers=True,
    )
    ours, theirs = (
        minato.DataLoader(RangeDataset(), **kwargs),
        tud.DataLoader(RangeDataset(), **kwargs),
    )
    for name in (
        "batch_size",
        "drop_last",
        "num_workers",
        "prefetch_factor",
        "timeout",
        "persistent_workers",
        "pin_memory",
        "generator",
        "collate_fn",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert type(ours.sampler) is type(theirs.sampler)
    assert type(ours.batch_sampler) is type(theirs.batch_sampler)


def _invalid_cases():
    ds, it = RangeDataset(), UnshardedIterable()
    sampler = tud.SequentialSampler(ds)
    batch_sampler = tud.BatchSampler(sampler, 2, False)
    return [
        (ds, dict(batch_sampler=batch_sampler, batch_size=2)),
        (ds, dict(batch_sampler=batch_sampler, shuffle=True)),
        (ds, dict(batch_sampler=batch_sampler, sampler=sampler)),
        (ds, dict(batch_sampler=batch_sampler, drop_last=True)),
        (ds, dict(sampler=sampler, shuffle=True)),
        (ds, dict(prefetch_factor=2)),
        (ds, dict(persistent_workers=True)),
        (ds, dict(num_workers=-1)),
        (ds, dict(timeout=-1)),
        (ds, dict(num_workers=1, prefetch_factor=-1)),
        (ds, dict(batch_size=None, drop_last=True)),
        (it, dict(shuffle=True)),
        (it, dict(sampler=sampler)),
        (it, dict(batch_sampler=batch_sampler)),
        (ds, dict(num_workers=1, multiprocessing_context="no-such-method")),
        (ds, dict(num_workers=1, multiprocessing_context=42)),
        (ds, dict(multiprocessing_context="fork")),
    ]


@pytest.mark.parametrize("dataset,kwargs", _invalid_cases())
def test_invalid_arguments_raise_torchs_exception_and_message(dataset, kwargs) -> None:
    with pytest.raises(Exception) as theirs:
        tud.DataLoader(dataset, **kwargs)
    with pytest.raises(Exception) as ours:
        minato.DataLoader(dataset, **kwargs)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.timeout(60)
# torch's iterator, refused half built, fails again as it is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_prefetch_factor_of_zero_is_refused_as_an_epoch_starts_like_torch() -> None:
    outcomes = []
    for loader_class in (tud.DataLoader, minato.DataLoader):
        loader = loader_class(RangeDataset(), num_workers=2, prefetch_factor=0)
        with pytest.raises(Exception) as raised:
            iter(loader)
        outcomes.append((type(raised.value), str(raised.value)))
    assert outcomes[1] == outcomes[0]


@pytest.mark.parametrize(
    "attr", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_frozen_attributes_refuse_assignment_like_torch(attr: str) -> None:
    loader = minato.DataLoader(RangeDataset())
    with pytest.raises(
        ValueError, match=f"^{attr} attribute should not be set after DataLoader is initialized$"
    ):
        setattr(loader, attr, None)


def test_other_attributes_may_be_assigned_after_construction() -> None:
    # A fixed pool: the adaptive one may add workers (ids 1, 2, ...) while
    # the loop waits, and each runs worker_init_fn too.
    loader = minato.DataLoader(RangeDataset(), num_workers=1, adaptive=False)
    seen = []
    loader.worker_init_fn = seen.append
    list(loader)
    assert seen == [0]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 37])
@pytest.mark.parametrize("batch_size", [None, 1, 4, 8])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_matches_torch_for_map_style(n, batch_size, drop_last, num_workers) -> None:
    if batch_size is None and drop_last:
        return
    kwargs = dict(batch_size=batch_size, drop_last=drop_last, num_workers=num_workers)
    ours = minato.DataLoader(RangeDataset(n), **kwargs)
    assert len(ours) == len(tud.DataLoader(RangeDataset(n), **kwargs))
    assert len(list(ours)) == len(ours)


@pytest.mark.parametrize("drop_last", [False, True])
def test_len_matches_torch_for_iterable_and_batch_sampler(drop_last) -> None:
    it = minato.DataLoader(ShardedIterable(50), batch_size=8, drop_last=drop_last)
    assert len(it) == (50 // 8 if drop_last else math.ceil(50 / 8))
    batch_sampler = tud.BatchSampler(tud.RandomSampler(RangeDataset(10)), 3, drop_last)
    assert len(minato.DataLoader(RangeDataset(10), batch_sampler=batch_sampler)) == len(
        batch_sampler
    )


def test_len_of_iterable_without_len_raises_typeerror_like_torch() -> None:
    class NoLen(tud.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError):
        len(tud.DataLoader(NoLen()))
    with pytest.raises(TypeError):
        len(minato.DataLoader(NoLen()))


def test_no_warning_for_more_threads_than_cores(recwarn) -> None:
    minato.DataLoader(RangeDataset(), num_workers=64)
    assert not [w for w in recwarn if "worker" in str(w.message)]


def test_pin_memory_without_accelerator_warns_like_torch() -> None:
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present")
    with pytest.warns(UserWarning, match="no accelerator is found"):
        list(minato.DataLoader(RangeDataset(4), pin_memory=True, num_workers=1))


class _SlowFirst(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 0:
            time.sleep(0.5)
        return index


@pytest.mark.timeout(120)
def test_a_loader_re_created_as_torchs_class_keeps_torchs_order() -> None:
    # As Accelerate's prepare() does: torch's class, torch's keyword
    # arguments read from the loader's attributes.
    loader = minato.DataLoader(_SlowFirst(), batch_size=1, num_workers=2)
    names = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    kwargs = {
        name: getattr(loader, name, parameter.default)
        for name, parameter in names.items()
        if name != "self"
    }
    kwargs["sampler"] = kwargs["batch_sampler"] = None
    kwargs["batch_size"] = 1
    kwargs["multiprocessing_context"] = "fork"
    recreated = torch.utils.data.DataLoader(**kwargs)
    assert [int(batch) for batch in recreated] == list(range(8))
