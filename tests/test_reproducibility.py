"""A seeded program repeats its run: the batches, their order and every
sample's random draws are a function of the seeds and the program, not of
timing, of which worker ran a sample, or of how many workers there were.

Each case runs twice, in fresh processes, beside torch's DataLoader (whose
seeded runs repeat too)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest
import torch
import torch.utils.data as tud

import minato

pytestmark = pytest.mark.timeout(300)

_PROGRAM = textwrap.dedent(
    """
    import hashlib, json, random, sys, time
    import numpy as np
    import torch
    import torch.utils.data as tud
    import minato

    class Augmented(tud.Dataset):
        # Samples of uneven cost; each draws from torch's, numpy's and random's
        # process-wide generators, as transforms do.
        def __len__(self):
            return 96

        def __getitem__(self, index):
            time.sleep(0.0005 * (index % 5))
            return index, torch.rand(()), np.random.rand(), random.random()

    def mixup(samples):
        # A collate_fn that draws (MixUp-like).
        batch = tud.default_collate(samples)
        return (*batch, torch.rand(()))

    def digest(loader, epochs, stop_after=None):
        h = hashlib.sha256()
        batches = 0
        for _ in range(epochs):
            for batch in loader:
                for part in batch:
                    h.update(part.numpy().tobytes())
                batches += 1
                if stop_after is not None and batches == stop_after:
                    return h.hexdigest(), loader.state_dict()
        return h.hexdigest()

    cases = json.loads(sys.argv[1])
    out = {}
    for name, case in cases.items():
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        options = dict(batch_size=8, shuffle=True, num_workers=2)
        if case.get("mixup"):
            options["collate_fn"] = mixup
        if case["loader"] == "torch":
            loader = tud.DataLoader(Augmented(), **options)
        else:
            options.update(case.get("options", {}))
            loader = minato.DataLoader(Augmented(), **options)
        out[name] = digest(loader, case.get("epochs", 3))
        if case["loader"] != "torch":
            out[name + " moved"] = loader.stats().moved_samples
        del loader
    print(json.dumps(out))
    """
)


# Away from the checkout: there, `import minato` would find the source
# folder (without its extension) before the installed package.
_ELSEWHERE = tempfile.gettempdir()


def _run(cases: dict) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", _PROGRAM, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=_ELSEWHERE,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


_CASES = {"torch": {"loader": "torch"}, "torch mixup": {"loader": "torch", "mixup": True}}
for _method in ("thread", "multiprocessing"):
    for _adaptive in (True, False):
        for _persistent in (False, True):
            _CASES[f"{_method} adaptive={_adaptive} persistent={_persistent}"] = {
                "loader": "minato",
                "options": {
                    "worker_method": _method,
                    "adaptive": _adaptive,
                    "persistent_workers": _persistent,
                },
            }
_CASES["defaults"] = {"loader": "minato"}
_CASES["defaults mixup"] = {"loader": "minato", "mixup": True}
_CASES["a pool of 4"] = {"loader": "minato", "options": {"num_workers": 4}}
# A collate_fn that draws: its batches are collated on whichever worker
# thread completes them, or on the collate thread beside worker processes.
for _method, _workers in (("thread", 2), ("thread", 4), ("multiprocessing", 2)):
    _CASES[f"{_method} mixup, {_workers} workers"] = {
        "loader": "minato",
        "mixup": True,
        "options": {"worker_method": _method, "num_workers": _workers, "adaptive": False},
    }

# Whole batches (in order, no sample timeout) draw what the same samples
# draw loaded one by one, and so does a collate that draws.
for _method in ("thread", "multiprocessing"):
    for _mixup in (False, True):
        _CASES[f"{_method} whole batches{' mixup' if _mixup else ''}"] = {
            "loader": "minato",
            "mixup": _mixup,
            "options": {"worker_method": _method, "in_order": True, "sample_timeout": None},
        }


def test_a_seeded_run_repeats_itself_on_every_path() -> None:
    first, second = _run(_CASES), _run(_CASES)
    assert first == second
    # The same samples draw the same numbers however many workers ran them,
    # on threads or processes, adaptive or not. (A persistent iterator draws
    # its base seed once, as torch's does; a fresh one each epoch.)
    for persistent in (False, True):
        digests = {
            first[name]
            for name, case in _CASES.items()
            if case["loader"] == "minato"
            and not case.get("mixup")
            and case.get("options", {}).get("persistent_workers", False) == persistent
        }
        assert len(digests) == 1, first
    # A collate's draws too, wherever and on whichever thread it ran.
    mixups = {
        first[name]
        for name, case in _CASES.items()
        if case["loader"] == "minato"
        and case.get("mixup")
        and not case.get("options", {}).get("persistent_workers", False)
    }
    assert len(mixups) == 1, first
    assert all(first[name] == 0 for name in first if name.endswith(" moved"))


def test_a_seeded_run_resumed_mid_epoch_computes_the_uninterrupted_one() -> None:
    program = _PROGRAM.replace("print(json.dumps(out))", "")
    script = textwrap.dedent(
        """
        import io
        results = {}
        for method in ("thread", "multiprocessing"):
            options = dict(batch_size=8, shuffle=True, num_workers=2, worker_method=method)
            torch.manual_seed(0)
            loader = minato.DataLoader(Augmented(), **options)
            uninterrupted = [[p.numpy().tolist() for p in b] for _ in range(2) for b in loader]
            torch.manual_seed(0)
            loader = minato.DataLoader(Augmented(), **options)
            taken, state = [], None
            for count, batch in enumerate(loader, 1):
                taken.append([part.numpy().tolist() for part in batch])
                if count == 5:
                    buffer = io.BytesIO()
                    torch.save(loader.state_dict(), buffer)
                    state = buffer.getvalue()
                    break
            del loader
            torch.manual_seed(123)  # a restarted program's own draws differ
            resumed = minato.DataLoader(Augmented(), **options)
            resumed.load_state_dict(torch.load(io.BytesIO(state), weights_only=True))
            taken.extend([part.numpy().tolist() for part in b] for b in resumed)
            results[method] = taken == uninterrupted[: len(taken)]
        print(json.dumps(results))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program + script, "{}"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=_ELSEWHERE,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "thread": True,
        "multiprocessing": True,
    }


# ------------------------------------------ torch's test_dataloader.py, with minato


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_reproducibility(num_workers: int) -> None:
    """torch's test_shuffle_reproducibility: a loader whose generator is
    seeded gives the same batches twice."""
    dataset = tud.TensorDataset(torch.randn(100, 2, 3, 5), torch.randperm(100))

    def batches(loader_type: type) -> list:
        loader = loader_type(
            dataset,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(42),
        )
        return [[part.tolist() for part in batch] for batch in loader]

    assert batches(minato.DataLoader) == batches(minato.DataLoader)
    assert batches(minato.DataLoader) == batches(tud.DataLoader)


class SynchronizedSeedDataset(tud.Dataset):
    """torch's: each of the workers loads one sample (all wait for each other
    before returning), which returns torch.initial_seed()."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        self.barrier.wait(timeout=30)
        return torch.initial_seed()


def test_worker_seed_reproducibility() -> None:
    """torch's test_worker_seed_reproducibility: the seeds samples see are
    the same in two runs of a loader with a seeded generator."""

    def seeds(loader_type: type, **options: object) -> set[int]:
        loader = loader_type(
            SynchronizedSeedDataset(6),
            batch_size=1,
            num_workers=6,
            generator=torch.Generator().manual_seed(42),
            **options,
        )
        return {int(batch) for batch in loader}

    ours = seeds(minato.DataLoader, worker_method="thread", adaptive=False)
    assert ours == seeds(minato.DataLoader, worker_method="thread", adaptive=False)
    # One per worker: base_seed + worker id, as torch's processes see.
    base = min(ours)
    assert ours == {base + worker for worker in range(6)}
