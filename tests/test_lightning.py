"""minato.DataLoader under PyTorch Lightning (issue 7): hooks and data modules,
loaders Lightning re-creates, DDP's injected DistributedSampler, seeding of
worker threads, and mid-epoch checkpoint resume of the loader's state."""

from __future__ import annotations

import json
import random
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from ddp.launch import run_with_port

import minato

L = pytest.importorskip("lightning")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

pytestmark = [
    # Lightning's own deprecation notice against this torch: not minato's.
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    # Test modules define a validation_step some runs have no loader for.
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no"),
]

ROOT = Path(__file__).resolve().parent.parent
DDP_SCRIPT = Path(__file__).resolve().parent / "ddp" / "lightning_ddp_script.py"

N = 40
BATCH = 4
# minato's own options, all different from their defaults, so that a loader
# Lightning re-created without them would show it.
MINATO_OPTIONS: dict[str, Any] = {"sample_timeout": 0.5, "max_workers": 7, "adaptive": False}


class IndexDataset(tud.Dataset):
    """Item i carries its index (to count what the loop saw) and a feature vector."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"index": i, "x": torch.full((4,), i / self.n)}


def make_loader(shuffle: bool = False, **kwargs: Any) -> minato.DataLoader:
    options = {"batch_size": BATCH, "num_workers": 2, **MINATO_OPTIONS, **kwargs}
    return minato.DataLoader(IndexDataset(), shuffle=shuffle, **options)


def assert_minato_options(loader: object) -> None:
    assert isinstance(loader, minato.DataLoader), type(loader)
    for name, value in MINATO_OPTIONS.items():
        assert getattr(loader, name) == value, name
    assert loader.num_workers == 2


class IndexModule(L.LightningModule):
    """A linear layer; records the indices each loop step saw."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.train_seen: dict[int, list[int]] = defaultdict(list)
        self.val_seen: dict[int, list[int]] = defaultdict(list)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.train_seen[self.current_epoch].extend(batch["index"].tolist())
        return self.layer(batch["x"]).pow(2).mean()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.val_seen[self.current_epoch].extend(batch["index"].tolist())

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return batch["index"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class HookModule(IndexModule):
    """Returns minato loaders from its *_dataloader hooks (Lightning captures their init args)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: dict[str, minato.DataLoader] = {}

    def _made(self, stage: str, loader: minato.DataLoader) -> minato.DataLoader:
        self.made[stage] = loader
        return loader

    def train_dataloader(self) -> minato.DataLoader:
        return self._made("train", make_loader(shuffle=True))

    def val_dataloader(self) -> minato.DataLoader:
        return self._made("val", make_loader())

    def predict_dataloader(self) -> minato.DataLoader:
        return self._made("predict", make_loader())


class MinatoDataModule(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self.made: dict[str, minato.DataLoader] = {}

    def train_dataloader(self) -> minato.DataLoader:
        self.made["train"] = make_loader(shuffle=True)
        return self.made["train"]

    def val_dataloader(self) -> minato.DataLoader:
        self.made["val"] = make_loader()
        return self.made["val"]

    def predict_dataloader(self) -> minato.DataLoader:
        self.made["predict"] = make_loader()
        return self.made["predict"]


def make_trainer(tmp_path: Path, **kwargs: Any) -> L.Trainer:
    options: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "max_epochs": 2,
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "logger": False,
        "enable_checkpointing": False,
        "default_root_dir": tmp_path,
        **kwargs,
    }
    return L.Trainer(**options)


def predicted_indices(predictions: Any) -> list[int]:
    return torch.cat(predictions).tolist()


def assert_each_epoch_saw_all(seen: dict[int, list[int]], epochs: int) -> None:
    assert sorted(seen) == list(range(epochs))
    for epoch, indices in seen.items():
        # Sorted equals range: every index exactly once, none twice.
        assert sorted(indices) == list(range(N)), f"epoch {epoch}"


# 1. One process: hooks, a data module, and the loaders Lightning re-creates.


def test_hooks_fit_validate_predict(tmp_path: Path) -> None:
    model = HookModule()
    trainer = make_trainer(tmp_path)
    trainer.fit(model)

    assert_each_epoch_saw_all(model.train_seen, epochs=2)
    # A shuffled epoch: the two epochs' orders differ.
    assert model.train_seen[0] != model.train_seen[1]
    # The validation loader keeps the sequential order (nothing shuffles it).
    assert model.val_seen == {0: list(range(N)), 1: list(range(N))}
    # One device: the training loader is used as the hook returned it.
    assert trainer.train_dataloader is model.made["train"]
    assert_minato_options(trainer.train_dataloader)
    assert_minato_options(trainer.val_dataloaders)

    model.val_seen.clear()
    trainer.validate(model)
    assert model.val_seen[trainer.current_epoch] == list(range(N))

    predictions = trainer.predict(model)
    assert predicted_indices(predictions) == list(range(N))
    # Predicting, Lightning always re-creates the loader (to track indices)
    # from the hook's captured init args: still minato's, options intact.
    predict_loader = trainer.predict_dataloaders
    assert predict_loader is not model.made["predict"]
    assert_minato_options(predict_loader)
    assert type(predict_loader.batch_sampler).__name__ == "_IndexBatchSamplerWrapper"


def test_datamodule_fit_validate_predict(tmp_path: Path) -> None:
    model, datamodule = IndexModule(), MinatoDataModule()
    trainer = make_trainer(tmp_path)
    trainer.fit(model, datamodule=datamodule)
    assert_each_epoch_saw_all(model.train_seen, epochs=2)
    assert model.val_seen == {0: list(range(N)), 1: list(range(N))}
    assert trainer.train_dataloader is datamodule.made["train"]
    assert_minato_options(trainer.train_dataloader)

    model.val_seen.clear()
    trainer.validate(model, datamodule=datamodule)
    assert model.val_seen[trainer.current_epoch] == list(range(N))

    assert predicted_indices(trainer.predict(model, datamodule=datamodule)) == list(range(N))
    assert trainer.predict_dataloaders is not datamodule.made["predict"]
    assert_minato_options(trainer.predict_dataloaders)


def test_loaders_passed_directly_are_recreated_from_attributes(tmp_path: Path) -> None:
    # Made outside any hook, Lightning has no captured init args: it re-creates
    # the loader from its public attributes, which is why minato keeps its
    # options as attributes of the same names.
    model = IndexModule()
    trainer = make_trainer(tmp_path)
    trainer.fit(model, train_dataloaders=make_loader(shuffle=True), val_dataloaders=make_loader())
    assert_each_epoch_saw_all(model.train_seen, epochs=2)

    loader = make_loader(in_order=True, log_interval=30.0)
    assert predicted_indices(trainer.predict(model, dataloaders=loader)) == list(range(N))
    recreated = trainer.predict_dataloaders
    assert recreated is not loader
    assert_minato_options(recreated)
    assert recreated.in_order is True
    assert recreated.log_interval == 30.0


# 2. strategy="ddp", 2 CPU processes: Lightning injects DistributedSampler.


def expected_shard(rank: int, epoch: int, *, shuffle: bool = True) -> list[int]:
    """What DistributedSampler gives a rank: Lightning seeds it with
    PL_GLOBAL_SEED, 0 when seed_everything was not called."""
    sampler = tud.DistributedSampler(range(N), num_replicas=2, rank=rank, shuffle=shuffle, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_ddp_two_processes_shard_with_distributed_sampler(tmp_path: Path) -> None:
    # Lightning's "ddp" starts rank 1 by re-running sys.argv, which inside
    # pytest would be pytest itself: the run is a script, each rank reports in JSON.
    result = run_with_port(lambda _port: [sys.executable, str(DDP_SCRIPT), str(tmp_path)])
    assert result.returncode == 0, result.stdout
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    for rank, record in enumerate(ranks):
        assert record["rank"] == rank and record["world_size"] == 2
        for key in ("train_loader", "val_loader"):
            loader = record[key]
            # Re-created by Lightning with its sampler: still minato's, options intact.
            assert loader["type"] == "minato.dataloader.DataLoader", key
            assert loader["options"] == MINATO_OPTIONS, key
            assert loader["worker_method"] == "thread", key
            assert loader["num_workers"] == 2, key
            assert loader["sampler"] == "DistributedSampler", key
            assert (loader["num_replicas"], loader["sampler_rank"]) == (2, rank), key
            assert loader["seed"] == 0, key
        assert record["train_loader"]["shuffle"] is True
        assert record["val_loader"]["shuffle"] is False
        # Shuffled by DistributedSampler, so minato may reorder within the shard.
        assert record["train_loader"]["reorders"] is True
        # Lightning calls set_epoch before each epoch.
        assert record["sampler_epochs"] == {"0": 0, "1": 1}
        # Loaded by minato's worker threads (the script pins them: its run is
        # about sharding), in the rank's own process.
        assert record["batch_pids"] == [record["pid"]]
        assert record["all_thread_workers"] is True
    assert ranks[0]["pid"] != ranks[1]["pid"]

    for epoch in range(2):
        shards = [record["train"][str(epoch)] for record in ranks]
        for rank, shard in enumerate(shards):
            # Exactly DistributedSampler's shard for that epoch, each index once
            # (the order within a shard may differ: minato reorders).
            assert sorted(shard) == sorted(expected_shard(rank, epoch)), (rank, epoch)
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(N))
        # Same number of steps on each rank, or DDP's all-reduce would hang.
        assert ranks[0]["batches"][str(epoch)] == ranks[1]["batches"][str(epoch)] == N // 2 // BATCH
        val = [record["val"][str(epoch)] for record in ranks]
        for rank in range(2):
            # Not shuffled: kept in the sampler's order.
            assert val[rank] == expected_shard(rank, epoch, shuffle=False)
        assert sorted(val[0] + val[1]) == list(range(N))
    # set_epoch took effect: each rank's shard changes between epochs.
    assert expected_shard(0, 0) != expected_shard(0, 1)
    for record in ranks:
        assert set(record["train"]["0"]) != set(record["train"]["1"])


# 3. seed_everything(workers=True): Lightning's worker_init_fn in worker threads.


class SeedRecordingDataset(IndexDataset):
    """Records, per (epoch, worker thread), the WorkerInfo seed and the first
    draw of the numpy generator it holds (get_worker_info().rng, a stream of
    the worker's own), and per (epoch, sample) the sample's draws from the
    thread's torch and random generators (seeded per sample by minato)."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch = 0
        self.first: dict[tuple[int, int], dict[str, Any]] = {}
        self.draws: dict[tuple[int, int], tuple[list[float], float]] = {}

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = tud.get_worker_info()
        if info is not None:
            key = (self.epoch, info.id)
            rng = info.rng
            # Each key is written by one thread only: no lock needed.
            if key not in self.first:
                self.first[key] = {
                    "seed": info.seed,
                    "method": info.worker_method,
                    "numpy": float(rng.numpy_generator.random()),
                }
            self.draws[(self.epoch, i)] = (
                torch.rand(3, generator=rng.torch_generator).tolist(),
                rng.random_generator.random(),
            )
            # Slow enough that both workers get samples in every epoch.
            time.sleep(0.005)
        return super().__getitem__(i)


class SeededModule(IndexModule):
    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self.num_workers = num_workers
        self.dataset = SeedRecordingDataset()
        self.loop_draws: list[tuple[float, float, float]] = []

    def train_dataloader(self) -> minato.DataLoader:
        return minato.DataLoader(
            self.dataset,
            batch_size=BATCH,
            shuffle=True,
            num_workers=self.num_workers,
            adaptive=False,
        )

    def on_train_epoch_start(self) -> None:
        self.dataset.epoch = self.current_epoch

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        # The training loop's own randomness (dropout, augmentation on the
        # batch): process-wide generators worker threads must leave alone.
        self.loop_draws.append((torch.rand(()).item(), random.random(), float(np.random.rand())))
        return super().training_step(batch, batch_idx)


def seeded_run(tmp_path: Path, num_workers: int) -> tuple[SeededModule, L.Trainer]:
    L.seed_everything(123, workers=True, verbose=False)
    model = SeededModule(num_workers)
    trainer = make_trainer(tmp_path, limit_val_batches=0)
    trainer.fit(model)
    return model, trainer


@pytest.fixture
def seeded_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """seed_everything sets PL_GLOBAL_SEED and PL_SEED_WORKERS in os.environ:
    put them back afterwards so later tests are not seeded."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    state = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    yield
    torch.set_rng_state(state[0])
    random.setstate(state[1])
    np.random.set_state(state[2])


def test_seed_everything_workers_seeds_threads_per_worker_reproducibly(
    tmp_path: Path, seeded_env: None
) -> None:
    first_model, first_trainer = seeded_run(tmp_path, num_workers=2)
    # Lightning attached its seeding function (it does only when worker_init_fn is None).
    init_fn = first_trainer.train_dataloader.worker_init_fn
    assert getattr(init_fn, "func", None).__name__ == "pl_worker_init_function"
    second_model, _ = seeded_run(tmp_path, num_workers=2)

    first, second = first_model.dataset.first, second_model.dataset.first
    assert set(first) == set(second) == {(e, w) for e in range(2) for w in range(2)}
    for key in first:
        assert first[key]["method"] == "thread"
        # Reproducible: the same seed and numpy stream in an identical run.
        assert first[key] == second[key], key
    for epoch in range(2):
        workers = [first[(epoch, w)] for w in range(2)]
        # Per worker: distinct seeds and distinct generator streams.
        assert workers[0]["seed"] != workers[1]["seed"]
        assert workers[0]["numpy"] != workers[1]["numpy"], epoch
    # A new epoch's workers are seeded anew (a new base seed), as torch does.
    assert first[(0, 0)]["seed"] != first[(1, 0)]["seed"]
    # Each sample's torch and random draws: the same in an identical run,
    # whichever worker loaded it, and distinct from every other sample's.
    draws = first_model.dataset.draws
    assert draws == second_model.dataset.draws
    assert len({value[1] for value in draws.values()}) == len(draws)


def test_seed_everything_workers_leaves_the_loops_global_rng_alone(
    tmp_path: Path, seeded_env: None
) -> None:
    # Lightning's pl_worker_init_function reseeds torch, random and numpy
    # globally: right in a worker process, wrong in a thread of the training
    # process. The loop's draws must be those of a run without worker threads.
    with_threads, _ = seeded_run(tmp_path, num_workers=2)
    again, _ = seeded_run(tmp_path, num_workers=2)
    without_threads, _ = seeded_run(tmp_path, num_workers=0)
    assert len(with_threads.loop_draws) == 2 * N // BATCH
    assert with_threads.loop_draws == without_threads.loop_draws
    assert with_threads.loop_draws == again.loop_draws


# 4. Mid-epoch checkpoints hold minato's loader state; fit(ckpt_path=...) resumes it.

CHECKPOINT_EVERY = 3


class StepRecorder(IndexModule):
    """Records (epoch, batch_idx, global_step, indices) of every training step."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make
        self.steps: list[tuple[int, int, int, list[int]]] = []

    def train_dataloader(self) -> minato.DataLoader:
        return self.make()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        indices = batch["index"].tolist()
        self.steps.append((self.current_epoch, batch_idx, self.global_step, indices))
        return super().training_step(batch, batch_idx)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        return [indices for e, _, _, indices in self.steps if e == epoch]


def fit_with_checkpoints(tmp_path: Path, make: Any) -> tuple[StepRecorder, Path]:
    """An uninterrupted 2-epoch run saving a checkpoint every 3 steps; returns
    it and the checkpoint saved mid-epoch 0, after its 3rd step."""
    model = StepRecorder(make)
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpts",
        filename="{epoch}-{step}",
        every_n_train_steps=CHECKPOINT_EVERY,
        save_top_k=-1,
    )
    trainer = make_trainer(
        tmp_path, enable_checkpointing=True, callbacks=[checkpoints], limit_val_batches=0
    )
    trainer.fit(model)
    return model, tmp_path / "ckpts" / f"epoch=0-step={CHECKPOINT_EVERY}.ckpt"


def loader_state(checkpoint: Path) -> dict[str, Any]:
    saved = torch.load(checkpoint, weights_only=False)
    states = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    # One stateful loader in the CombinedLoader: minato's.
    assert len(states) == 1
    state = states[0]
    assert state["format"] == "minato.DataLoader"
    # Saved mid-epoch: the epoch's position is in it.
    assert state["epoch"] is not None
    return state


def resume(
    tmp_path: Path, make: Any, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[StepRecorder, list[dict[str, Any]]]:
    loaded: list[dict[str, Any]] = []
    load_state_dict = minato.DataLoader.load_state_dict

    def spy(self: minato.DataLoader, state: dict[str, Any]) -> None:
        loaded.append(state)
        load_state_dict(self, state)

    monkeypatch.setattr(minato.DataLoader, "load_state_dict", spy)
    model = StepRecorder(make)
    trainer = make_trainer(tmp_path / "resumed", limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, ckpt_path=checkpoint)
    # Lightning sees a resumable loader (it has state_dict/load_state_dict).
    assert not [w for w in caught if "dataloader is not resumable" in str(w.message)]
    return model, loaded


def map_loader(in_order: bool | None) -> minato.DataLoader:
    # A generator of the loader's own: its state is in the loader's state_dict,
    # so the epochs after the resumed one draw the same orders too (the
    # process-wide generator is the training program's, and Lightning does
    # not checkpoint it).
    return make_loader(shuffle=True, in_order=in_order, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("in_order", [True, None], ids=["in_order", "reordered"])
def test_checkpoint_resume_map_dataset_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_order: bool | None
) -> None:
    make = lambda: map_loader(in_order)  # noqa: E731
    full, checkpoint = fit_with_checkpoints(tmp_path, make)
    batches = N // BATCH
    assert_each_epoch_saw_all(full.train_seen, epochs=2)
    trained_before = [i for batch in full.epoch_batches(0)[:CHECKPOINT_EVERY] for i in batch]

    state = loader_state(checkpoint)
    # Indices taken from the sampler but not delivered when it was saved (the
    # rest of the epoch comes from the sampler's position): none was trained.
    undelivered = state["epoch"]["undelivered"]
    flat = [i for item in undelivered for i in (item if isinstance(item, list) else [item])]
    assert not set(flat) & set(trained_before)

    resumed, loaded = resume(tmp_path, make, checkpoint, monkeypatch)
    assert len(loaded) == 1
    # The state the checkpoint holds (its epoch_rng holds tensors: compare the rest).
    for key in ("undelivered", "pulled", "mode"):
        assert loaded[0]["epoch"][key] == state["epoch"][key], key
    steps = [(e, b, g) for e, b, g, _ in resumed.steps]
    # Training goes on at epoch 0's 4th batch and the global step it stopped at.
    expected_steps = [(0, b, b) for b in range(CHECKPOINT_EVERY, batches)]
    expected_steps += [(1, b, batches + b) for b in range(batches)]
    assert steps == expected_steps
    # The interrupted epoch: before + after the resume is every index exactly
    # once. A sized loader: Lightning's fetcher does not fetch ahead (it knows
    # the length), so the state saved after step 3 counts 3 batches delivered.
    trained_after = resumed.train_seen[0]
    assert sorted(trained_before + trained_after) == list(range(N))
    # The next epoch is complete too.
    assert sorted(resumed.train_seen[1]) == list(range(N))
    if in_order:
        # Nothing reordered: batch for batch what the uninterrupted run trained,
        # and epoch 1 draws the same order (the loader's generator was restored).
        assert resumed.epoch_batches(0) == full.epoch_batches(0)[CHECKPOINT_EVERY:]
        assert resumed.epoch_batches(1) == full.epoch_batches(1)


class UnsizedStream(tud.IterableDataset):
    """range(N) without __len__, each worker an interleaved shard (torch's docs' recipe)."""

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, N, step):
            yield {"index": i, "x": torch.full((4,), i / N)}


def test_checkpoint_resume_unsized_loader_skips_the_batch_lightning_prefetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a length, Lightning's _PrefetchDataFetcher fetches one batch
    ahead (to know which batch is the last). A checkpoint saved after step k
    therefore holds a loader state that counts k+1 batches delivered: the
    batch sitting in the fetcher, never trained, is not loaded again after the
    resume. Over the interrupted epoch: no index twice, and exactly that one
    batch (batch k, 0-based) missing; the epoch has one step fewer. A loader
    cannot tell a batch the fetcher holds from one that was trained."""
    make = lambda: minato.DataLoader(UnsizedStream(), batch_size=BATCH, num_workers=2)  # noqa: E731
    full, checkpoint = fit_with_checkpoints(tmp_path, make)
    full_batches = full.epoch_batches(0)
    assert len(full_batches) == N // BATCH
    # Iterable streams: worker w's stream delivers batches w, w+2, ... in turn.
    state = loader_state(checkpoint)
    assert state["epoch"]["mode"] == "streams"
    # Three trained, one more held by Lightning's fetcher: 2 from each stream.
    assert state["epoch"]["delivered_per_stream"] == {0: 2, 1: 2}

    resumed, loaded = resume(tmp_path, make, checkpoint, monkeypatch)
    assert len(loaded) == 1
    prefetched = full_batches[CHECKPOINT_EVERY]
    # Resumed epoch 0: the full run's batches after the prefetched one.
    assert resumed.epoch_batches(0) == full_batches[CHECKPOINT_EVERY + 1 :]
    trained = [i for b in full_batches[:CHECKPOINT_EVERY] for i in b] + resumed.train_seen[0]
    assert len(trained) == len(set(trained)) == N - BATCH
    assert set(range(N)) - set(trained) == set(prefetched)
    # The next epoch is whole, and identical (deterministic streams).
    assert resumed.epoch_batches(1) == full.epoch_batches(1)


# 6. The example runs as documented.


def test_lightning_example() -> None:
    example = ROOT / "examples" / "lightning_example.py"
    result = run_with_port(lambda _port: [sys.executable, str(example)])
    assert result.returncode == 0, result.stdout
    assert "each sample exactly once" in result.stdout, result.stdout
