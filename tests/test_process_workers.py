"""Worker processes (worker_method="multiprocessing") and the automatic choice.

Side by side with torch's DataLoader where torch has the behaviour; fault
tests (a worker killed, a sample hung past the hard limit, Ctrl-C,
interpreter exit, the loader's process killed) count the processes left.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from helpers import os_thread_count, wait_for_thread_count
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import minato
from minato._process import ipc as _ipc
from minato._process import method as _worker_method
from minato._process import workers as _process
from minato._process.method import WorkerMethod

pytestmark = pytest.mark.timeout(120)

MARK = "MINATO_PROCESS_TEST_MARK"


class Described(Dataset):
    """Each sample says which process and worker loaded it, and how seeded.

    Each takes a little time, so that both workers load some: a worker free
    again takes the next task at once, and instant samples may all go to
    the first."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int):
        time.sleep(0.02)
        info = get_worker_info()
        return {
            "index": index,
            "pid": os.getpid(),
            "worker": info.id,
            "method": info.worker_method,
            "seed": torch.initial_seed(),
            "info_seed": info.seed,
        }


class Payloads(Dataset):
    """Large and small tensors and arrays, bfloat16 included."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return {
            "big": torch.full((64, 1024), float(index)),
            "small": torch.tensor([index, -index]),
            "array": np.full((128, 256), index, dtype=np.int32),
            "half": torch.full((40_000,), index, dtype=torch.bfloat16),
            "view": torch.arange(100_000)[index : index + 20_000],
        }


class Raises(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 3:
            raise KeyError(f"no sample {index}")
        return index


class KillsItself(Dataset):
    """Sample 5 kills its worker process (as ``kill -9`` would)."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> int:
        if index == 5 and get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return index


class ExitsHard(Dataset):
    """Sample 5 ends its worker process at once, with status 5 (a crash
    handler's ``os._exit``, say)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if index == 5 and get_worker_info() is not None:
            os._exit(5)
        return index


FORK_CONTEXT = multiprocessing.get_context("fork")


class PutsOnAQueue(Dataset):
    """Each sample puts its index on a ``multiprocessing.Queue`` the dataset
    holds, made in the 'fork' context (a worker reporting to the training
    loop), and returns its worker process's pid."""

    def __init__(self) -> None:
        self.queue = FORK_CONTEXT.Queue()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        self.queue.put(index)
        return os.getpid()


class KnowsItsProcess(Dataset):
    """Each sample says what multiprocessing and the system tell the process
    that loads it about itself (its number left out: the test counts)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        time.sleep(0.02)  # both workers load some
        me = multiprocessing.current_process()
        parent = multiprocessing.parent_process()
        kind, number = me.name.rsplit("-", 1)
        comm = Path(f"/proc/{os.getpid()}/comm").read_text().strip()
        return repr(
            (
                kind,
                me.daemon,
                len(me._identity),
                parent is not None and (parent.name, parent.pid, parent.is_alive()),
                multiprocessing.get_start_method(allow_none=True),
                comm,
            )
        ), int(number)


class WritesInTheBackground(Dataset):
    """Each sample has a thread pool of its worker's write a file a moment
    later (a cache written behind, say)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(2)
        self.pool.submit(self._write, index)
        return index

    def _write(self, index: int) -> None:
        time.sleep(0.2)
        (self.out / str(index)).write_text("written")


class Hangs(Dataset):
    """Sample 3 never finishes."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> int:
        if index == 3:
            time.sleep(600)
        return index


class Sharded(IterableDataset):
    """torch's documented recipe: each worker takes its share of the range."""

    def __init__(self, start: int = 0, end: int = 30) -> None:
        self.start, self.end = start, end

    def __iter__(self):
        return iter(range(self.start, self.end))


def shard(worker_id: int) -> None:
    info = get_worker_info()
    dataset = info.dataset
    per = (dataset.end - dataset.start + info.num_workers - 1) // info.num_workers
    dataset.start = dataset.start + worker_id * per
    dataset.end = min(dataset.start + per, dataset.end)


class PurePython(Dataset):
    """Python that holds the GIL: parsing, tokenising and the like. A sample
    takes about 0.2 ms of CPU here, clear of the 0.1 ms under which auto
    keeps threads (MIN_SAMPLE_WORK_S): at 3,000 steps it read 95-106 us, and
    a test waiting for a move waited in vain on a fast day."""

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, index: int) -> int:
        total = 0
        for k in range(6000):
            total += k * index % 7
        return index


class Sleeps(Dataset):
    """Work that releases the GIL (I/O)."""

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, index: int) -> int:
        time.sleep(0.002)
        return index


class Hashes(Dataset):
    """Work that computes with the GIL released (hashlib over a large buffer),
    as image decoding does."""

    data = bytes(2_000_000)

    def __len__(self) -> int:
        return 1500

    def __getitem__(self, index: int) -> int:
        hashlib.sha256(self.data).digest()
        return index


def live_processes() -> dict[int, Path]:
    """Every process but this one and zombies, by pid, with its /proc folder."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # exited meanwhile
        if state not in "ZX":
            found[int(entry.name)] = entry
    return found


def _parent(entry: Path) -> int | None:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _environ(entry: Path) -> bytes:
    try:
        return (entry / "environ").read_bytes()
    except OSError:
        return b""


def processes_marked(mark: str) -> list[int]:
    """Processes whose environment carries `mark` (a test's fork server and workers)."""
    needle = f"{MARK}={mark}".encode()
    return [pid for pid, entry in live_processes().items() if needle in _environ(entry)]


def fork_servers() -> set[int]:
    """The fork servers this process runs: the shared one, and the fresh
    interpreters of loaders whose context is "spawn"."""
    zygotes = [_process._the_zygote] + [each.own_zygote for each in list(_process._live)]
    return {zygote.process.pid for zygote in zygotes if zygote is not None}


def _command(entry: Path) -> bytes:
    try:
        return (entry / "cmdline").read_bytes()
    except OSError:
        return b""


def workers_of_this_process() -> list[int]:
    """Live worker processes started for this process: its children forked
    from it that are no fork server (forced loaders' workers; not
    multiprocessing's resource tracker or fork server, which run a command
    of their own), and the children of its children (the fork servers'
    workers)."""
    live = live_processes()
    children = {pid for pid, entry in live.items() if _parent(entry) == os.getpid()}
    servers = fork_servers()
    ours = _command(Path("/proc/self"))

    def forked_worker(pid: int, entry: Path) -> bool:
        return pid in children and pid not in servers and _command(entry) == ours

    return [
        pid
        for pid, entry in live.items()
        if forked_worker(pid, entry) or _parent(entry) in children
    ]


def wait_until(condition, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        gc.collect()
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# torch's worker processes, and minato's: forked directly, from a server
# (more workers than are forked directly), and threads.
TORCHS_AND_MINATOS_WORKERS = pytest.mark.parametrize(
    ("loader_type", "options"),
    [
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
        (minato.DataLoader, {"worker_method": "multiprocessing", "num_workers": 3}),
        (minato.DataLoader, {"worker_method": "thread"}),
    ],
    ids=["torch", "minato-processes", "minato-processes-from-a-server", "minato-threads"],
)


def run_script(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs `script` in a fresh interpreter from `cwd` (not the checkout:
    the installed minato), with `env` added to the environment."""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def indices(loader) -> list[int]:
    return sorted(int(i) for batch in loader for i in batch)


@pytest.mark.parametrize("shuffle", [False, True])
def test_workers_are_processes_seeded_as_torch_seeds_them(shuffle: bool) -> None:
    seeded = {}
    for name, cls, extra in [
        ("torch", tud.DataLoader, {}),
        ("minato", minato.DataLoader, {"worker_method": "multiprocessing"}),
    ]:
        loader = cls(
            Described(),
            batch_size=4,
            shuffle=shuffle,
            num_workers=2,
            generator=torch.Generator().manual_seed(7),
            **extra,
        )
        samples = [s for batch in loader for s in _rows(batch)]
        assert sorted(s["index"] for s in samples) == list(range(40))
        assert {s["method"] for s in samples} == {"multiprocessing"}
        assert os.getpid() not in {s["pid"] for s in samples}
        seeded[name] = {(s["worker"], s["seed"], s["info_seed"]) for s in samples}
        for _worker, seed, info_seed in seeded[name]:
            assert seed == info_seed
    assert seeded["minato"] == seeded["torch"]


def _rows(batch: dict) -> list[dict]:
    size = len(batch["index"])
    return [{key: _plain(value[i]) for key, value in batch.items()} for i in range(size)]


def _plain(value):
    return value.item() if isinstance(value, torch.Tensor) else value


def test_large_payloads_arrive_in_shared_memory_equal_to_torchs() -> None:
    torch_batches = list(tud.DataLoader(Payloads(), batch_size=3, num_workers=2))
    loader = minato.DataLoader(
        Payloads(), batch_size=3, num_workers=2, worker_method="multiprocessing"
    )
    ours = list(loader)
    assert len(ours) == len(torch_batches)
    for mine, theirs in zip(ours, torch_batches, strict=True):
        for key in theirs:
            assert mine[key].dtype == theirs[key].dtype
            assert torch.equal(mine[key], theirs[key]), key


def test_samples_reordered_across_processes_keep_large_payloads_intact() -> None:
    loader = minato.DataLoader(
        Payloads(), batch_size=3, shuffle=True, num_workers=2, worker_method="multiprocessing"
    )
    seen = []
    for batch in loader:
        for row in range(len(batch["small"])):
            index = int(batch["small"][row][0])
            seen.append(index)
            assert torch.all(batch["big"][row] == index)
            assert torch.all(batch["array"][row] == index)
            assert torch.all(batch["half"][row] == index)
            assert torch.equal(batch["view"][row], torch.arange(index, index + 20_000))
    assert sorted(seen) == list(range(12))


@pytest.mark.parametrize("persistent", [False, True])
def test_iterable_sharding_recipe_as_torch(persistent: bool) -> None:
    def run(cls, **extra):
        loader = cls(
            Sharded(),
            batch_size=4,
            num_workers=3,
            worker_init_fn=shard,
            persistent_workers=persistent,
            **extra,
        )
        return [sorted(int(i) for batch in loader for i in batch) for _ in range(2)]

    theirs = run(tud.DataLoader)
    ours = run(minato.DataLoader, worker_method="multiprocessing")
    assert ours == theirs == [list(range(30))] * 2


def test_exception_keeps_type_worker_and_index() -> None:
    loader = minato.DataLoader(
        Raises(), batch_size=2, num_workers=2, worker_method="multiprocessing"
    )
    with pytest.raises(KeyError) as caught:
        list(loader)
    message = str(caught.value)
    assert "DataLoader worker process" in message
    assert "sample index" in message and "3" in message


def test_a_worker_killed_fails_its_sample_and_a_new_process_takes_over() -> None:
    loader = minato.DataLoader(
        KillsItself(), batch_size=4, num_workers=2, worker_method="multiprocessing"
    )
    # The training process's own child (forked from it, as torch's): its
    # status is read, and told as torch tells it.
    with pytest.raises(RuntimeError, match="exited unexpectedly: killed by signal: Killed"):
        list(loader)
    skipping = minato.DataLoader(
        KillsItself(),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        worker_method="multiprocessing",
        on_error="skip",
    )
    assert indices(skipping) == [i for i in range(24) if i != 5]
    assert [failure.index for failure in skipping.stats().failures] == [5]


@pytest.mark.parametrize("workers", [2, 3], ids=["forked directly", "from a server"])
def test_a_worker_processs_exit_status_is_told_where_this_process_is_its_parent(
    workers: int,
) -> None:
    loader = minato.DataLoader(
        ExitsHard(), batch_size=4, num_workers=workers, worker_method="multiprocessing"
    )
    with pytest.raises(RuntimeError, match="exited unexpectedly") as caught:
        list(loader)
    message = str(caught.value)
    del caught, loader
    if workers <= _process.FORKED_DIRECTLY:
        assert "exited unexpectedly with exit code 5" in message, message
    else:  # the server reaps it: its status is not to be read here
        assert "exited unexpectedly (killed, or crashed)" in message, message


@pytest.mark.parametrize(
    "loader",
    [
        "torch.utils.data.DataLoader(Crashes(), num_workers=2)",
        'minato.DataLoader(Crashes(), num_workers=2, worker_method="multiprocessing")',
        'minato.DataLoader(Crashes(), num_workers=3, worker_method="multiprocessing")',
    ],
    ids=["torch", "minato-forked-directly", "minato-from-a-server"],
)
def test_a_worker_process_that_crashes_says_so_on_stderr_as_torchs_do(
    tmp_path: Path, loader: str
) -> None:
    """torch's worker signal handlers: a segmentation fault in a worker's
    sample is told on its stderr as a worker's, then kills it; minato's
    loader raises that the worker exited unexpectedly."""
    script = textwrap.dedent(f"""
        import ctypes, sys
        import torch, minato
        from torch.utils.data import Dataset, get_worker_info

        class Crashes(Dataset):
            def __len__(self):
                return 8

            def __getitem__(self, index):
                if index == 5 and get_worker_info() is not None:
                    ctypes.string_at(0)
                return index

        try:
            list({loader})
        except Exception as error:
            print(type(error).__name__, error)
        """)
    run = run_script(script, tmp_path)
    assert "Unexpected segmentation fault encountered in worker" in run.stderr, run.stderr
    # (torch's own raises this, or, its worker's death racing its queue's
    # read, an EOFError.)
    if loader.startswith("minato"):
        assert run.stdout.startswith("RuntimeError"), run.stdout
        assert "exited unexpectedly" in run.stdout, run.stdout


@TORCHS_AND_MINATOS_WORKERS
def test_what_workers_put_on_a_multiprocessing_queue_arrives_as_from_torchs(
    loader_type: type, options: dict[str, Any]
) -> None:
    """torch's worker processes start as multiprocessing starts a process:
    a fork-context Queue the dataset holds forgets the training process's
    feeder thread (run by its put below) and starts its own, and what it
    buffers is flushed as the worker exits. A daemonic child of the
    training process is no child of the workers': their exit leaves it be."""
    dataset = PutsOnAQueue()
    dataset.queue.put("the training loop's own")
    assert dataset.queue.get(timeout=30) == "the training loop's own"
    bystander = FORK_CONTEXT.Process(target=time.sleep, args=(120,), daemon=True)
    bystander.start()
    try:
        options = {"num_workers": 2, **options}
        pids = {int(pid) for pid in loader_type(dataset, batch_size=None, **options)}
        received = sorted(dataset.queue.get(timeout=30) for _ in range(8))
        assert received == list(range(8))
        if os.getpid() not in pids:
            assert wait_until(lambda: not pids & set(live_processes()))
        assert bystander.is_alive()
    finally:
        bystander.kill()
        bystander.join()


@pytest.mark.parametrize("context", [None, "fork", "forkserver"])
@pytest.mark.parametrize("workers", [2, 3], ids=["forked directly", "from a server"])
def test_a_worker_process_is_told_what_torchs_are_told_of_itself(
    context: str | None, workers: int
) -> None:
    """multiprocessing's current_process() in a worker is a daemonic
    ``Process-N`` (or the context's kind), numbered from the training
    process's counter; parent_process() the training process, alive; the
    start method the context's; the process named as torch names its
    workers."""

    def told(loader_type: type, **options: Any) -> tuple[set[str], list[int], int]:
        counter_before = int(multiprocessing.Process().name.rsplit("-", 1)[1])
        loader = loader_type(
            KnowsItsProcess(),
            batch_size=None,
            num_workers=workers,
            multiprocessing_context=context,
            **options,
        )
        samples = list(loader)
        counter_after = int(multiprocessing.Process().name.rsplit("-", 1)[1])
        numbers = sorted({number - counter_before for _, number in samples})
        return {what for what, _ in samples}, numbers, counter_after - counter_before - 1

    torchs = told(tud.DataLoader)
    minatos = told(minato.DataLoader, worker_method="multiprocessing")
    assert minatos[0] == torchs[0], (minatos, torchs)
    ((kind, daemon, depth, parent, _method, comm),) = (
        ast.literal_eval(what) for what in minatos[0]
    )
    assert (daemon, depth, parent) == (True, 1, ("MainProcess", os.getpid(), True))
    assert comm == "pt_data_worker"
    assert kind == (
        "Process" if context is None else multiprocessing.get_context(context).Process.__name__
    )
    # Numbered as the training process starts them, none twice: each one it
    # started took a number of its counter, as torch's.
    for numbers, started in (torchs[1:], minatos[1:]):
        assert 1 <= len(numbers) <= started and numbers[-1] <= started


def test_auto_processes_see_this_process_as_each_epoch_starts_as_torchs_do(
    tmp_path: Path,
) -> None:
    """Processes auto decided on (here for an earlier loader) are forked as
    each epoch starts, as torch's: they see the environment and a module's
    globals as the training process set them for that epoch, not as they
    were when the shared fork server was forked."""
    module = tmp_path / "epoch_settings.py"
    module.write_text(
        textwrap.dedent("""
            import os
            import torch.utils.data as tud

            SETTING = "as imported"

            class Reads(tud.Dataset):
                def __len__(self):
                    return 16

                def __getitem__(self, index):
                    return f"{SETTING} {os.environ.get('EPOCH_SETTING')} {os.getpid()}"
            """)
    )
    script = textwrap.dedent("""
        import os, sys
        import torch, minato
        import epoch_settings
        from minato._process import method

        method._decided_for[epoch_settings.Reads] = (True, "auto: decided for the test", True)
        for loader_type in (torch.utils.data.DataLoader, minato.DataLoader):
            loader = loader_type(epoch_settings.Reads(), batch_size=4, num_workers=2)
            for epoch in range(3):
                epoch_settings.SETTING = f"global {epoch}"
                os.environ["EPOCH_SETTING"] = f"environ {epoch}"
                seen = {sample.rsplit(" ", 1)[0] for batch in loader for sample in batch}
                pids = {sample.rsplit(" ", 1)[1] for batch in loader for sample in batch}
                print(loader_type.__module__.split(".")[0], sorted(seen), str(os.getpid()) in pids)
            if loader_type is minato.DataLoader:
                print(loader.stats().worker_method)
        """)
    run = run_script(script, tmp_path, PYTHONPATH=str(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    torchs = [line.removeprefix("torch ") for line in lines if line.startswith("torch ")]
    minatos = [line.removeprefix("minato ") for line in lines if line.startswith("minato ")]
    assert (
        minatos == torchs == [f"['global {epoch} environ {epoch}'] False" for epoch in range(3)]
    ), run.stdout
    assert lines[-1] == "multiprocessing", run.stdout


def test_the_shared_fork_server_goes_once_its_loader_forks_its_workers_at_each_start(
    tmp_path: Path,
) -> None:
    """A loader whose processes came from the shared fork server (auto's
    move within an epoch) forks them from this process from its next epoch
    on: the server, which keeps its own copy of every page this process
    writes, goes once its workers have left."""
    script = textwrap.dedent("""
        import time
        import minato
        from minato._process import method, workers

        class Sleeps(list):
            def __getitem__(self, index):
                time.sleep(0.002)
                return index

        method.DECIDED_PROCESSES_FORKED_AT_START = False
        method._decided_for[Sleeps] = (True, "auto: decided for the test", True)
        loader = minato.DataLoader(Sleeps(range(400)), batch_size=4, num_workers=2)
        assert sorted(int(i) for batch in loader for i in batch) == list(range(400))
        print("shared server", workers._the_zygote is not None)
        method.DECIDED_PROCESSES_FORKED_AT_START = True
        for _ in range(20):
            assert sorted(int(i) for batch in loader for i in batch) == list(range(400))
            if workers._the_zygote is None:
                break
        print("released", workers._the_zygote is None)
        """)
    run = run_script(script, tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["shared server True", "released True"], run.stdout


@TORCHS_AND_MINATOS_WORKERS
def test_what_a_workers_own_threads_were_given_is_done_as_in_torchs(
    tmp_path: Path, loader_type: type, options: dict[str, Any]
) -> None:
    """A worker process exits as the interpreter does: threading's exit
    callbacks and non-daemon threads finish first (within torch's bound),
    so a thread pool's queued work is done, as in torch's workers."""
    options = {"num_workers": 2, **options}
    loader = loader_type(WritesInTheBackground(tmp_path), batch_size=2, **options)
    assert sorted(int(index) for batch in loader for index in batch) == list(range(8))
    del loader
    assert wait_until(lambda: len(list(tmp_path.iterdir())) == 8), sorted(tmp_path.iterdir())


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_sample_past_the_hard_limit_is_killed_and_reported_once(shuffle: bool) -> None:
    loader = minato.DataLoader(
        Hangs(),
        batch_size=4,
        shuffle=shuffle,
        num_workers=2,
        worker_method="multiprocessing",
        sample_hard_timeout=1.0,
        on_error="skip",
    )
    started = time.monotonic()
    delivered = indices(loader)
    assert time.monotonic() - started < 60
    failures = loader.stats().failures
    if shuffle:  # single samples: only the one that hung fails
        assert delivered == [i for i in range(24) if i != 3]
        assert [failure.index for failure in failures] == [3]
    else:  # a batch of fixed indices fails as a whole, as in torch
        assert 3 in {failure.index for failure in failures}
        assert sorted(delivered + [f.index for f in failures]) == list(range(24))
    assert "sample_hard_timeout" in failures[0].message
    raising = minato.DataLoader(
        Hangs(),
        batch_size=4,
        num_workers=1,
        worker_method="multiprocessing",
        sample_hard_timeout=1.0,
    )
    with pytest.raises(RuntimeError, match="sample_hard_timeout"):
        list(raising)


def test_no_worker_process_outlives_break_exception_or_collection() -> None:
    loader = minato.DataLoader(
        Raises(), batch_size=1, num_workers=2, worker_method="multiprocessing"
    )
    with pytest.raises(KeyError):
        list(loader)
    assert wait_until(lambda: not workers_of_this_process())
    loader = minato.DataLoader(
        Sleeps(), batch_size=2, num_workers=2, worker_method="multiprocessing"
    )
    for _ in zip(range(3), loader, strict=False):
        pass  # break mid-epoch
    assert wait_until(lambda: not workers_of_this_process())
    # A user's collate_fn over shuffled samples runs on the collate thread,
    # which the engine holds: nothing it is given may hold the iterator.
    collated = minato.DataLoader(
        Sleeps(),
        batch_size=2,
        num_workers=2,
        shuffle=True,
        collate_fn=list,
        worker_method="multiprocessing",
    )
    for _ in zip(range(3), collated, strict=False):
        pass
    assert wait_until(lambda: not workers_of_this_process())
    persistent = minato.DataLoader(
        Sleeps(),
        batch_size=2,
        num_workers=2,
        worker_method="multiprocessing",
        persistent_workers=True,
    )
    iterator = iter(persistent)
    next(iterator)
    # Each worker starts its process with its first task: the second may
    # still be starting when the first batch arrives.
    assert wait_until(lambda: len(workers_of_this_process()) == 2)
    del iterator, persistent
    assert wait_until(lambda: not workers_of_this_process())


_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import minato
    from torch.utils.data import Dataset

    class Slow(Dataset):
        def __len__(self):
            return 10_000
        def __getitem__(self, index):
            time.sleep(0.01)
            return index

    loader = minato.DataLoader(Slow(), batch_size=2, num_workers=2,
                               worker_method="multiprocessing", persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    print("ready", flush=True)
    sys.stdin.readline()  # the test has counted the worker processes
    if sys.argv[1] == "exit":
        sys.exit(0)
    for _ in iterator:
        pass
    """
)


@pytest.mark.parametrize("how", ["exit", "ctrl-c", "kill -9"])
def test_no_worker_process_outlives_its_loaders_process(how: str, tmp_path: Path) -> None:
    """No ``if __name__ == "__main__"`` guard: worker processes never import the script."""
    script = tmp_path / "train.py"
    script.write_text(_SCRIPT)
    mark = f"{how}-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, MARK: mark}
    child = subprocess.Popen(
        [sys.executable, str(script), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == b"ready"
        # The fork server and 2 workers; each worker starts its process with
        # its first task: the second may still be starting at the first batch.
        assert wait_until(lambda: len(processes_marked(mark)) >= 3), processes_marked(mark)
        child.stdin.write(b"go\n")
        child.stdin.flush()
        if how == "ctrl-c":
            child.send_signal(signal.SIGINT)
        elif how == "kill -9":
            child.kill()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert wait_until(lambda: not processes_marked(mark)), processes_marked(mark)
    if how == "ctrl-c":
        assert b"KeyboardInterrupt" in (child.stderr.read() if child.stderr else b"")


def test_auto_moves_a_gil_bound_dataset_to_processes() -> None:
    loader = minato.DataLoader(PurePython(), batch_size=8, shuffle=True, num_workers=2)
    assert loader.worker_method == "auto"
    for _ in range(5):
        assert indices(loader) == list(range(4000))
        if loader.stats().worker_method == "multiprocessing":
            break
        reason = loader.stats().worker_method_reason or ""
        if "on processes (" in reason or "no core is spare" in reason:
            # The trial ran within an epoch and found threads faster, or
            # the threads waited for a core before the GIL showed: with no
            # spare core (this machine's two kept busy beside the run),
            # processes cannot run the dataset's Python faster.
            break
    stats = loader.stats()
    reason = stats.worker_method_reason
    if "no core is spare" in reason:
        return
    assert stats.worker_method == "multiprocessing" or "on processes (" in reason, reason
    # Three rules see this dataset: its threads wait for the GIL; or, where
    # the ready queue fills first (a loaded machine slows this loop's own
    # share of the GIL), the loop sets the pace and threads may slow it; or,
    # where the GIL waits read short (a fresh-clone CI run), its workers
    # compute, on a CPU for nearly all their fetch time.
    assert "GIL" in reason or "sets the pace" in reason or "compute" in reason, reason


class FewPurePython(PurePython):
    def __len__(self) -> int:
        return 48


def test_a_loop_that_sets_the_pace_moves_at_the_batch_that_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A GPU-like loop (long steps, the GIL released) beside one worker
    # thread: once auto decides that the loop sets the pace, the training
    # thread waits for the workers' spec and the fork server (here as long
    # as they take) and moves the workers there, so that the loop's next
    # step does not run beside the threads too.
    monkeypatch.setattr(_worker_method, "MOVE_WAIT_S", 60.0)
    marks: list[tuple[str, int]] = []
    decide, activate = WorkerMethod._decide, WorkerMethod.activate

    def decided(self, processes, reason):
        marks.append(("decide", self._batches_received))
        return decide(self, processes, reason)

    def activated(self, *args, **kwargs):
        marks.append(("activate", self._batches_received))
        return activate(self, *args, **kwargs)

    monkeypatch.setattr(WorkerMethod, "_decide", decided)
    monkeypatch.setattr(WorkerMethod, "activate", activated)
    loader = minato.DataLoader(FewPurePython(), batch_size=4, num_workers=1)
    seen = []
    for batch in loader:
        seen.extend(batch.tolist())
        time.sleep(0.15)
    assert seen == list(range(48))
    reason = loader.stats().worker_method_reason or ""
    assert "sets the pace" in reason, reason
    (decided_at,) = [at for what, at in marks if what == "decide"]
    assert ("activate", decided_at) in marks, marks


class PurePythonHoldingALock(PurePython):
    """PurePython's samples, from a dataset no process can be sent: a lock
    cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_auto_keeps_threads_for_a_gil_bound_dataset_that_cannot_be_pickled() -> None:
    loader = minato.DataLoader(PurePythonHoldingALock(), batch_size=8, shuffle=True, num_workers=2)
    for _ in range(5):
        assert indices(loader) == list(range(4000))
        if "cannot be pickled" in (loader.stats().worker_method_reason or ""):
            break
    stats = loader.stats()
    assert stats.worker_method == "thread"
    # Or, on a machine whose cores are kept busy beside the run, threads for
    # that before the GIL showed (see test_auto_moves_a_gil_bound_...).
    reason = stats.worker_method_reason or ""
    assert "cannot be pickled" in reason or "no core is spare" in reason, reason


class SleepsHoldingALock(Sleeps):
    """Sleeps's samples, from a dataset no process can be sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


@pytest.mark.parametrize("verdict", ["warm", "move"])
def test_a_pool_grows_again_once_auto_keeps_threads(
    monkeypatch: pytest.MonkeyPatch, verdict: str
) -> None:
    # The first signs lean to processes ("warm": the pool is left to grow),
    # or auto decides on them ("move": the pool keeps num_workers, the size
    # processes will have) and then finds that the dataset cannot be sent to
    # one. Auto keeps threads: the adaptive pool of a persistent loader
    # grows for its I/O, as it would have.
    verdicts = iter([verdict])

    def observe(self, figures, can_trial=True):
        if self.decided:
            return None
        first = next(verdicts, None)
        if first == "move":
            self._decide(True, "auto: processes, by the test")
        elif first is None:
            self._decide(False, "auto: threads, by the test")
        return first

    monkeypatch.setattr(WorkerMethod, "observe", observe)
    dataset = Sleeps() if verdict == "warm" else SleepsHoldingALock()
    loader = minato.DataLoader(dataset, batch_size=8, num_workers=2, persistent_workers=True)
    grew = False
    for _ in range(5):
        assert indices(loader) == list(range(4000))
        if any(size > 2 for _, size in loader.stats().worker_history):
            grew = True
            break
    stats = loader.stats()
    assert stats.worker_method == "thread", stats.worker_method_reason
    if verdict == "move":
        assert "cannot be pickled" in (stats.worker_method_reason or "")
    assert grew, stats.worker_history


def test_auto_pickles_the_workers_spec_off_the_training_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The training thread forks the fork server and goes on: pickling the
    # dataset (megabytes, for one that holds its data) is another thread's.
    pickled_on: list[str] = []
    spec_payload = _process.ProcessWorkers.spec_payload

    def recorded(self):
        pickled_on.append(threading.current_thread().name)
        return spec_payload(self)

    monkeypatch.setattr(_process.ProcessWorkers, "spec_payload", recorded)
    loader = minato.DataLoader(PurePython(), batch_size=8, shuffle=True, num_workers=2)
    for _ in range(5):
        assert indices(loader) == list(range(4000))
        if pickled_on:  # auto went for processes
            break
    assert pickled_on, loader.stats().worker_method_reason
    assert threading.main_thread().name not in pickled_on, pickled_on


def test_auto_keeps_threads_where_the_work_releases_the_gil() -> None:
    loader = minato.DataLoader(
        Sleeps(), batch_size=8, shuffle=True, num_workers=2, persistent_workers=True
    )
    # Kept at once, or (a loaded machine delays the loop's probes) after
    # a trial on processes that found them slower.
    for _ in range(10):
        assert indices(loader) == list(range(4000))
        reason = loader.stats().worker_method_reason or ""
        if "releases the GIL" in reason or "on processes" in reason:
            break
    stats = loader.stats()
    assert stats.worker_method == "thread", stats.worker_method_reason
    assert wait_until(lambda: not workers_of_this_process())


def _run_script(script: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs `script` (with `args`) in a fresh interpreter (no other test's
    loader holds the fork server there) and checks that it succeeded."""
    run = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=tmp_path,  # the installed minato, not the checkout's sources
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return run


class CountsInPlace(Dataset):
    """Each worker counts its samples in its dataset's array, in place."""

    def __init__(self) -> None:
        self.table = np.zeros(1 << 16, dtype=np.int64)  # 512 KiB: in shared memory

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[int, int]:
        self.table[0] += 1
        return int(self.table[0]), os.getpid()


def _counts_per_worker(loader: Any) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {}
    for count, pid in loader:
        seen.setdefault(int(pid), []).append(int(count))
    return seen


def test_a_workers_writes_to_its_datasets_arrays_are_its_own_as_in_torch() -> None:
    # torch's forked workers write to their own copy of the dataset's pages;
    # an array copied into shared memory for minato's must be no less private.
    torch_dataset = CountsInPlace()
    torch_seen = _counts_per_worker(tud.DataLoader(torch_dataset, batch_size=1, num_workers=2))
    dataset = CountsInPlace()
    dataset.table = dataset.table + 0  # made now: copied for the workers, not inherited
    loader = minato.DataLoader(
        dataset, batch_size=1, num_workers=2, worker_method="multiprocessing"
    )
    seen = _counts_per_worker(loader)
    for counts in [*torch_seen.values(), *seen.values()]:
        assert counts == list(range(1, len(counts) + 1)), counts  # each worker counts alone
    assert dataset.table[0] == torch_dataset.table[0] == 0


class _Blob:
    """Pickles its bytes as a ``pickle.PickleBuffer``, as pyarrow's buffers do."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _Blob, (pickle.PickleBuffer(self.data),)


def test_large_pickle_buffers_travel_in_shared_memory_as_they_were() -> None:
    writable = _Blob(bytearray(range(256)) * 4096)  # 1 MiB
    frozen = _Blob(bytes(range(256)) * 4096)
    small = _Blob(bytearray(b"tiny"))
    payload = _ipc.dumps((writable, frozen, small))
    # Out of the pickle: neither copied into it nor rebuilt from it.
    assert len(payload.data) < 10_000 and len(payload.fds) == 2
    received = _ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds])
    got_writable, got_frozen, got_small = received
    assert bytes(got_writable.data) == bytes(writable.data)
    assert bytes(got_frozen.data) == bytes(frozen.data) and memoryview(got_frozen.data).readonly
    assert bytes(got_small.data) == b"tiny"
    # Writable, as sent, and this process's own: a forked worker's copy.
    got_writable.data[0] = 99
    assert writable.data[0] == 0
    again = _ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds])[0]
    assert again.data[0] == 0


def test_pickling_leaves_no_cycle_to_keep_what_it_pickled() -> None:
    gc.disable()
    try:
        tensor = torch.zeros(3, 64, 64)
        alive = weakref.ref(tensor)
        payload = _ipc.dumps([tensor, _Blob(bytearray(1 << 20))])
        del tensor, payload
        assert alive() is None
    finally:
        gc.enable()


class CountsLiveSamples(Dataset):
    """Each sample says how many samples this worker returned earlier are
    still alive in it."""

    def __init__(self) -> None:
        self.returned: list[weakref.ref[torch.Tensor]] = []

    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> torch.Tensor:
        live = sum(ref() is not None for ref in self.returned)
        sample = torch.full((1000,), live)
        self.returned.append(weakref.ref(sample))
        return sample


def _no_cycle_collector(_worker_id: int) -> None:
    gc.disable()


def test_a_worker_process_frees_its_samples_once_sent_without_the_cycle_collector() -> None:
    loader = minato.DataLoader(
        CountsLiveSamples(),
        batch_size=8,
        num_workers=2,
        worker_method="multiprocessing",
        worker_init_fn=_no_cycle_collector,
    )
    live = torch.cat(list(loader))
    # At most a task's samples wait to be sent; before, every sample a
    # worker pickled stayed alive until Python's cycle collector ran.
    assert live.shape == (400, 1000) and int(live.max()) <= 32


class ArrowNames(Dataset):
    def __init__(self) -> None:
        pyarrow = pytest.importorskip("pyarrow")
        self.names = pyarrow.array([f"image{i}.jpg" for i in range(200_000)])  # 2.7 MB

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> str:
        return self.names[index * 1000].as_py()


def test_a_datasets_arrow_array_reaches_worker_processes_by_shared_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not the fork server's inherited copy (test_inherit.py): one that was
    # never registered with it, as when it was forked for an earlier loader.
    # The spec is pickled for the shared server's workers (auto's).
    monkeypatch.setattr(_process.inherit, "register", lambda dataset: None)
    monkeypatch.setattr(_worker_method, "DECIDED_PROCESSES_FORKED_AT_START", False)
    monkeypatch.setitem(
        _worker_method._decided_for, ArrowNames, (True, "auto: decided for the test", True)
    )
    loader = minato.DataLoader(ArrowNames(), batch_size=8, num_workers=2)
    iterator = iter(loader)
    names = list(next(iterator))
    payload = iterator._processes.spec_payload()  # type: ignore[attr-defined]
    # The array's buffers lie beside the pickle, not in it (nor in a spilled one).
    assert payload.fds and len(payload.data) < 100_000, (len(payload.fds), len(payload.data))
    assert b"_with_buffers" in payload.data and b"_spilled" not in payload.data
    names += [name for batch in iterator for name in batch]
    assert names == [f"image{i * 1000}.jpg" for i in range(64)]


class ArrowFrame(Dataset):
    """A pandas frame whose column pyarrow holds: pickling it copies the
    column (pandas combines its chunks) in pyarrow's allocator."""

    def __init__(self) -> None:
        pandas = pytest.importorskip("pandas")
        pytest.importorskip("pyarrow")
        names = pandas.array([f"image{i}.jpg" for i in range(100_000)], dtype="string[pyarrow]")
        self.frame = pandas.DataFrame({"name": names})

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> str:
        return str(self.frame["name"].iloc[index])


def test_pyarrows_freed_copy_of_a_pickled_column_is_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pyarrow

    dataset = ArrowFrame()
    released_on: list[int] = []
    pool = pyarrow.default_memory_pool()

    class Spy:
        def release_unused(self) -> None:
            released_on.append(threading.get_ident())
            pool.release_unused()

    pickled_on: list[int] = []
    dumps = _ipc.dumps

    def spec_dumps(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("inherit"):  # a worker's spec
            pickled_on.append(threading.get_ident())
        return dumps(obj, *args, **kwargs)

    monkeypatch.setattr(pyarrow, "default_memory_pool", Spy)
    monkeypatch.setattr(_ipc, "dumps", spec_dumps)
    # The spec is pickled for the shared server's workers (auto's).
    monkeypatch.setattr(_worker_method, "DECIDED_PROCESSES_FORKED_AT_START", False)
    monkeypatch.setitem(
        _worker_method._decided_for, ArrowFrame, (True, "auto: decided for the test", True)
    )
    loader = minato.DataLoader(dataset, batch_size=4, num_workers=2)
    assert [name for batch in loader for name in batch] == [f"image{i}.jpg" for i in range(16)]
    # mimalloc keeps freed pages per thread: given back by the thread that
    # pickled the frame (and so freed its copy).
    assert pickled_on and set(pickled_on) <= set(released_on)


def test_shared_memory_held_at_interpreter_exit_closes_quietly(tmp_path: Path) -> None:
    # A script's globals are collected as the interpreter exits, after the
    # modules' own globals may be gone: closing a descriptor must not need them.
    run = _run_script(
        textwrap.dedent("""
        import numpy as np, torch.utils.data as tud
        import minato
        from minato._process import ipc

        class Rows(tud.Dataset):
            def __init__(self):
                self.data = np.arange(1 << 18, dtype=np.int64)  # shared memory
                self.table = {i: str(i) for i in range(200_000)}  # a spilled message
            def __len__(self):
                return 100
            def __getitem__(self, i):
                return int(self.data[i]), self.table[i]

        payload = ipc.spill(ipc.dumps(Rows()))
        buffer = ipc.SharedBuffer(1 << 16)
        assert payload.fds and len(payload.keep) > 0
        print("held")
        """),
        tmp_path,
    )
    assert run.stdout.strip() == "held"
    assert "Exception ignored" not in run.stderr, run.stderr


def test_auto_forks_no_fork_server_while_it_keeps_threads(tmp_path: Path) -> None:
    # Forked, it comes to hold a copy of every page the training process
    # writes: auto forks it only once its measurements point to processes; a
    # forced loader forks a server of its own as its engine starts, never
    # the shared one. A fresh interpreter: no other test's loader may hold it.
    script = textwrap.dedent("""
        import time
        import minato
        from minato._process import workers

        class Sleeps:
            def __len__(self):
                return 2000

            def __getitem__(self, index):
                time.sleep(0.002)
                return index

        loader = minato.DataLoader(Sleeps(), batch_size=8, num_workers=2, persistent_workers=True)
        print("started", workers._zygote_running())
        for _ in range(20):
            assert sorted(int(i) for batch in loader for i in batch) == list(range(2000))
            if not loader.stats().worker_method_reason.startswith("auto: threads until"):
                break
        print("kept", loader.stats().worker_method, loader.stats().worker_method_reason)
        print("running", workers._zygote_running())
        forced = minato.DataLoader(
            list(range(16)), batch_size=4, num_workers=2, worker_method="multiprocessing"
        )
        assert sorted(int(i) for batch in forced for i in batch) == list(range(16))
        print("again", workers._zygote_running())
        """)
    run = _run_script(script, tmp_path)
    lines = run.stdout.splitlines()
    assert lines[0] == "started False", run.stdout
    assert lines[1].startswith("kept thread auto: "), run.stdout
    assert lines[2:] == ["running False", "again False"], run.stdout


def test_the_fork_server_is_forked_with_no_worker_thread_inside_the_datasets_code(
    tmp_path: Path,
) -> None:
    # Auto forks the server while its threads load. Each sample holds a lock
    # of the dataset's module, the GIL released, for most of its time: a
    # fork made meanwhile would leave the lock held for good in the server
    # and every worker process it forks (their samples would hang until the
    # hard timeout failed them).
    (tmp_path / "locked_dataset.py").write_text(
        textwrap.dedent("""
            import threading
            import time

            LOCK = threading.Lock()

            class Locked:
                def __len__(self):
                    return 400

                def __getitem__(self, index):
                    with LOCK:
                        time.sleep(0.002)
                    return index
            """)
    )
    script = textwrap.dedent("""
        import minato
        from minato._process.method import WorkerMethod
        from locked_dataset import Locked

        def point_to_processes(self, figures, can_trial=True):
            return self._decide(True, "auto: told to, by the test")

        WorkerMethod.observe = point_to_processes
        loader = minato.DataLoader(
            Locked(), batch_size=4, num_workers=2, sample_hard_timeout=20, on_error="skip"
        )
        seen = sorted(int(i) for batch in loader for i in batch)
        print(loader.stats().worker_method, len(seen), seen == list(range(400)))
        """)
    run = _run_script(script, tmp_path)
    assert run.stdout.split() == ["multiprocessing", "400", "True"], run.stdout + run.stderr


# For a script run by _run_script (which imported time, minato's method
# module, and may set GAIN_WANTED): a dataset of 400 samples that sleep a
# millisecond each, and auto's measurements replaced by a move at its first
# look, on a clear sign, or on a trial that wants a gain (GAIN_WANTED).
_MOVED_AT_FIRST_LOOK = textwrap.dedent("""
    class Sleeps:
        def __len__(self):
            return 400

        def __getitem__(self, index):
            time.sleep(0.001)
            return index

    def observe(self, figures, can_trial=True):
        if self.decided:
            return None
        self._gain_wanted = globals().get("GAIN_WANTED", False)
        # Threads that loaded 4 samples/s while undecided: the move waits for
        # the spec's pickle up to about one of their batches, 2 s at 8 a
        # batch, or MOVE_WAIT_S.
        self._seen = (10.0, 40)
        self._decide(True, "auto: moved by the test")
        return "move"

    method.WorkerMethod.observe = observe
    method.WorkerMethod.ready_for_processes = lambda self: True
""")


def test_the_fork_server_goes_once_a_trial_back_to_threads_has_ended_its_processes(
    tmp_path: Path,
) -> None:
    # Auto's measurements are replaced: a move at the first look, and a
    # trial judged slower once worker processes have run tasks. The loader
    # is back on threads for good; its processes exit as its threads take
    # their next tasks, and the fork server, kept while they live (it is
    # their parent), goes after them, leaving no child of its own behind.
    # The training thread does not wait for its exit (a process as large as
    # the training one takes tens of milliseconds to go on busy cores).
    script = (
        textwrap.dedent("""
        import os, threading, time
        import minato
        from minato._process import method, workers

        waited_on = []
        wait = workers._ForkedServer.wait

        def recorded_wait(self, timeout=None):
            waited_on.append(threading.get_ident())
            return wait(self, timeout)

        workers._ForkedServer.wait = recorded_wait
        """)
        + _MOVED_AT_FIRST_LOOK
        + textwrap.dedent("""
        received = method.WorkerMethod.batch_received
        on_processes = []

        def batch_received(self, now, waited=0.0, samples=0):
            pids = [p.pid for w in list(workers._live) for p in list(w._processes)]
            if self.processes and pids:
                on_processes.append(pids)
                if len(on_processes) == 5:
                    self._back_to_threads("auto: threads, sent back by the test")
                    return "revert"
            return received(self, now, waited, samples)

        method.WorkerMethod.batch_received = batch_received

        loader = minato.DataLoader(Sleeps(), batch_size=8, num_workers=2, persistent_workers=True)
        server = None
        for epoch in range(100):
            assert sorted(int(i) for batch in loader for i in batch) == list(range(400))
            if workers._the_zygote is not None:
                server = workers._the_zygote.process.pid
            if len(on_processes) >= 5 and not workers._zygote_running():
                break
        print("reason", loader.stats().worker_method_reason)
        print("ran on processes", len(on_processes) >= 5)
        print("server running", workers._zygote_running())
        pids = {pid for seen in on_processes for pid in seen}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
            os.path.exists(f"/proc/{pid}") for pid in pids | {server}
        ):
            time.sleep(0.05)
        print("left", sorted(pid for pid in pids | {server} if os.path.exists(f"/proc/{pid}")))
        print("waited for on this thread", threading.get_ident() in waited_on, bool(waited_on))
        """)
    )
    run = _run_script(script, tmp_path)
    assert run.stdout.splitlines() == [
        "reason auto: threads, sent back by the test",
        "ran on processes True",
        "server running False",
        "left []",
        "waited for on this thread False True",
    ], run.stdout


# The opening of a script whose move comes from a clear sign of the GIL
# ("serialised") or from a trial that wants a gain ("trial"), by its argument.
_SERIALISED_OR_TRIAL = textwrap.dedent("""
    import sys, threading, time
    import minato
    from minato._process import method, workers

    serialised = sys.argv[1] == "serialised"
    GAIN_WANTED = not serialised
""")


@pytest.mark.parametrize("serialised", [True, False])
def test_a_move_the_gil_decided_starts_each_process_in_its_workers_next_task(
    tmp_path: Path, serialised: bool
) -> None:
    # Threads the GIL runs one at a time load little while their processes
    # start, and slow the starts (each socket call waits for the GIL): a
    # worker starts its process in its next task. A trial that wants a gain
    # starts it beside the thread, which loads meanwhile.
    script = (
        _SERIALISED_OR_TRIAL
        + textwrap.dedent("""
        started_on = []
        init = workers.WorkerProcess.__init__

        def recorded_init(self, *args, **kwargs):
            name = threading.current_thread().name
            if name.startswith("Dummy"):  # an engine thread: its name is the OS's
                with open(f"/proc/self/task/{threading.get_native_id()}/comm") as comm:
                    name = comm.read().strip()
            started_on.append(name.rstrip("0123456789"))
            init(self, *args, **kwargs)

        workers.WorkerProcess.__init__ = recorded_init
        """)
        + _MOVED_AT_FIRST_LOOK
        + textwrap.dedent("""
        loader = minato.DataLoader(Sleeps(), batch_size=8, num_workers=2, persistent_workers=True)
        for epoch in range(3):
            assert sorted(int(i) for batch in loader for i in batch) == list(range(400))
        print(loader.stats().worker_method, sorted(set(started_on)))
        """)
    )
    run = _run_script(script, tmp_path, "serialised" if serialised else "trial")
    where = "minato-worker-" if serialised else "minato-process-start"
    assert run.stdout.split("\n")[0] == f"multiprocessing ['{where}']", run.stdout


@pytest.mark.parametrize("serialised", [True, False], ids=["serialised", "trial"])
def test_a_move_the_gil_decided_holds_the_threads_out_of_the_dataset_until_it_is_made(
    tmp_path: Path, serialised: bool
) -> None:
    # Threads the GIL runs one at a time take it from the training thread
    # for a switch interval at each of its turns: the server's fork, the
    # spec's pickle and the move ran several times slower beside them. They
    # wait at the door to the user's code until the workers have moved. A
    # trial that wants a gain lets them load meanwhile.
    script = (
        _SERIALISED_OR_TRIAL
        + textwrap.dedent("""
        from minato._util import user_code

        # However loaded the machine, the move is made within the wait (what
        # is checked is where the threads are as it is made).
        method.MOVE_WAIT_S = 60.0
        at_activation = []
        activate = method.WorkerMethod.activate

        def recorded_activate(self, *args, **kwargs):
            me = threading.get_ident()
            inside = [ident for ident in list(user_code._depth) if ident != me]
            at_activation.append((user_code._door.is_set(), inside))
            activate(self, *args, **kwargs)

        method.WorkerMethod.activate = recorded_activate
        """)
        + _MOVED_AT_FIRST_LOOK
        + textwrap.dedent("""
        loader = minato.DataLoader(Sleeps(), batch_size=8, num_workers=2, persistent_workers=True)
        for epoch in range(2):
            assert sorted(int(i) for batch in loader for i in batch) == list(range(400))
        print(loader.stats().worker_method, at_activation[0][0], at_activation[0][1])
        print("door open after", user_code._door.is_set())
        """)
    )
    run = _run_script(script, tmp_path, "serialised" if serialised else "trial")
    lines = run.stdout.split("\n")
    if serialised:
        assert lines[0] == "multiprocessing False []", run.stdout
    else:
        assert lines[0].startswith("multiprocessing True"), run.stdout
    assert lines[1] == "door open after True", run.stdout


def test_a_loader_after_a_decision_on_processes_loads_every_sample_on_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An earlier loader of the dataset's type chose processes: this one's
    # workers start on them, as forced ones do, with no sample loaded on
    # their threads beside the starts (the GIL slowed both).
    monkeypatch.setitem(
        _worker_method._decided_for, Described, (True, "auto: decided for the test", True)
    )
    loader = minato.DataLoader(Described(), batch_size=4, num_workers=2)
    samples = [sample for batch in loader for sample in _rows(batch)]
    assert sorted(s["index"] for s in samples) == list(range(40))
    assert os.getpid() not in {s["pid"] for s in samples}
    assert {s["method"] for s in samples} == {"multiprocessing"}
    assert loader.stats().worker_method == "multiprocessing"
    del loader
    assert wait_until(lambda: not workers_of_this_process())


@pytest.mark.parametrize("forked_at_start", [True, False])
def test_a_loader_after_a_decision_on_processes_where_its_dataset_cannot_be_pickled(
    monkeypatch: pytest.MonkeyPatch, forked_at_start: bool
) -> None:
    # Its processes forked from this process as its engine starts hold the
    # dataset as it is, as torch's: no pickle. From the shared server (a
    # move within an epoch), threads are kept.
    monkeypatch.setattr(_worker_method, "DECIDED_PROCESSES_FORKED_AT_START", forked_at_start)
    monkeypatch.setitem(
        _worker_method._decided_for, SleepsHoldingALock, (True, "auto: decided for the test", True)
    )
    loader = minato.DataLoader(SleepsHoldingALock(), batch_size=8, num_workers=2)
    assert indices(loader) == list(range(len(loader.dataset)))
    stats = loader.stats()
    if forked_at_start:
        assert stats.worker_method == "multiprocessing", stats.worker_method_reason
        return
    assert stats.worker_method == "thread"
    assert "cannot be pickled" in (stats.worker_method_reason or ""), stats.worker_method_reason


# In a script: a list dataset's loaders start on processes from the shared
# fork server (auto, after an earlier loader's decision, kept off the forks
# at each engine's start, as when auto moves within an epoch). Forced ones
# fork theirs as each engine starts.
ON_THE_SHARED_SERVER = (
    "from minato._process import method\n"
    "method.DECIDED_PROCESSES_FORKED_AT_START = False\n"
    "method._decided_for[list] = (True, 'auto: decided for the test', True)\n"
)


def test_a_stopped_fork_server_is_reaped_where_no_thread_can_be_started(tmp_path: Path) -> None:
    # Its exit is waited for on a thread of its own; where none can be
    # started (a process at its thread limit), the caller waits, as before,
    # rather than fail the training loop.
    script = (
        textwrap.dedent("""
        import gc, os
        import minato
        from minato._process import workers
        """)
        + ON_THE_SHARED_SERVER
        + textwrap.dedent("""

        loader = minato.DataLoader(
            list(range(16)), batch_size=4, num_workers=2
        )
        assert sorted(int(i) for batch in loader for i in batch) == list(range(16))
        server = workers._the_zygote.process.pid
        del loader
        gc.collect()

        def no_thread(function, args):
            raise RuntimeError("can't start new thread")

        workers._thread.start_new_thread = no_thread
        workers._stop_fork_server(kill=True)
        print("running", workers._zygote_running())
        print("left", os.path.exists(f"/proc/{server}"))
        """)
    )
    run = _run_script(script, tmp_path)
    assert run.stdout.splitlines() == ["running False", "left False"], run.stdout


@pytest.mark.parametrize("how", ["let go", "written"])
def test_a_fork_server_holding_memory_let_go_or_written_since_is_forked_again(
    how: str, tmp_path: Path
) -> None:
    # Forked as the loader is built, the server keeps its own copy of what
    # this process frees or writes afterwards (a CPU model moved to the GPU,
    # or trained in place): torch's workers, forked as each epoch starts,
    # never hold it. The next epoch's workers come from a server forked
    # again; one that holds nothing more is kept.
    script = (
        textwrap.dedent("""
        import os, sys, time
        import numpy as np
        import minato
        from minato._process import workers
        """)
        + ON_THE_SHARED_SERVER
        + textwrap.dedent("""

        held = np.arange(48 << 17, dtype=np.int64)  # 48 MiB, written
        loader = minato.DataLoader(
            list(range(16)), batch_size=4, num_workers=2
        )
        first = workers._the_zygote.process.pid
        data = sorted(int(i) for batch in loader for i in batch) == list(range(16))
        print("first epoch, same server", workers._the_zygote.process.pid == first)
        if sys.argv[1] == "let go":
            del held
        else:
            held += 1
            # Read where no worker of it is left (one exiting shares its pages).
            deadline = time.monotonic() + 60
            while workers._server_has_children() and time.monotonic() < deadline:
                time.sleep(0.02)
        data &= sorted(int(i) for batch in loader for i in batch) == list(range(16))
        second = workers._the_zygote.process.pid
        print("second epoch, server forked again", second != first)
        deadline = time.monotonic() + 60  # it leaves once the first epoch's workers have
        while os.path.exists(f"/proc/{first}") and time.monotonic() < deadline:
            time.sleep(0.02)
        print("the first left", not os.path.exists(f"/proc/{first}"))
        data &= sorted(int(i) for batch in loader for i in batch) == list(range(16))
        print("third epoch, same server", workers._the_zygote.process.pid == second)
        print("data", data)
        """)
    )
    run = _run_script(script, tmp_path, how)
    assert run.stdout.splitlines() == [
        "first epoch, same server True",
        "second epoch, server forked again True",
        "the first left True",
        "third epoch, same server True",
        "data True",
    ], run.stdout


def test_a_fork_server_stopped_aside_leaves_after_its_last_worker(tmp_path: Path) -> None:
    # Replaced while a loader's worker processes still live, it stays their
    # parent until they have exited (orphaned, they would be left to the
    # machine's init), then leaves and is reaped.
    script = (
        textwrap.dedent("""
        import gc, os, time
        import minato
        from minato._process import workers
        """)
        + ON_THE_SHARED_SERVER
        + textwrap.dedent("""

        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
            except OSError:
                return False

        def parent(pid):
            with open(f"/proc/{pid}/stat") as stat:
                return int(stat.read().rsplit(")", 1)[1].split()[1])

        loader = minato.DataLoader(
            list(range(64)), batch_size=4, num_workers=2, persistent_workers=True,
        )
        it = iter(loader)
        next(it)
        server = workers._the_zygote.process.pid

        def kids_now():
            with open(f"/proc/{server}/task/{server}/children") as children:
                return [int(pid) for pid in children.read().split()]

        deadline = time.monotonic() + 60
        while len(kids_now()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        kids = kids_now()
        print("workers", len(kids))
        workers._stop_fork_server(aside=True)
        time.sleep(0.5)
        stays = alive(server) and all(parent(k) == server for k in kids)
        print("stays beside its workers", stays or [server, alive(server), kids, kids_now()])
        del it, loader
        gc.collect()
        deadline = time.monotonic() + 60
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Its workers gone by then: it left last.
        workers_gone = not any(alive(k) for k in kids)
        while os.path.exists(f"/proc/{server}") and time.monotonic() < deadline:
            time.sleep(0.01)  # reaped on a thread of its own
        print("left", not os.path.exists(f"/proc/{server}"), workers_gone)
        """)
    )
    run = _run_script(script, tmp_path)
    assert run.stdout.splitlines() == [
        "workers 2",
        "stays beside its workers True",
        "left True True",
    ], run.stdout


def test_the_option_forces_either_way() -> None:
    threads = minato.DataLoader(PurePython(), batch_size=8, num_workers=2, worker_method="thread")
    assert indices(threads) == list(range(4000))
    assert threads.stats().worker_method == "thread"
    sleeps = minato.DataLoader(
        Sleeps(), batch_size=8, num_workers=2, worker_method="multiprocessing"
    )
    assert indices(sleeps) == list(range(4000))
    assert sleeps.stats().worker_method == "multiprocessing"


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="worker_method"):
        minato.DataLoader(Sleeps(), num_workers=2, worker_method="fork")
    with pytest.raises(ValueError, match="a thread cannot be stopped"):
        minato.DataLoader(Sleeps(), num_workers=2, worker_method="thread", sample_hard_timeout=5)
    with pytest.raises(ValueError, match="positive"):
        minato.DataLoader(Sleeps(), num_workers=2, sample_hard_timeout=0)
    with pytest.raises(TypeError, match="sample_hard_timeout"):
        minato.DataLoader(Sleeps(), num_workers=2, sample_hard_timeout="1")


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_epoch_with_processes_delivers_the_rest_once(shuffle: bool) -> None:
    def make():
        return minato.DataLoader(
            Sleeps(),
            batch_size=10,
            shuffle=shuffle,
            num_workers=2,
            worker_method="multiprocessing",
            generator=torch.Generator().manual_seed(3),
        )

    first = make()
    iterator = iter(first)
    before = [int(i) for _, batch in zip(range(30), iterator, strict=False) for i in batch]
    state = first.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    after = [int(i) for batch in resumed for i in batch]
    assert sorted(before + after) == list(range(4000))


class OneSlow(Dataset):
    """Sample 0 takes 1.5 s (I/O-like), the rest are instant."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> int:
        if index == 0:
            time.sleep(1.5)
        return index


def test_a_slow_sample_lands_in_a_later_batch_with_processes() -> None:
    loader = minato.DataLoader(
        OneSlow(),
        batch_size=4,
        in_order=False,
        num_workers=2,
        worker_method="multiprocessing",
        sample_timeout=0.1,
    )
    batches = [[int(i) for i in batch] for batch in loader]
    assert 0 not in batches[0]
    assert sorted(i for batch in batches for i in batch) == list(range(64))
    assert loader.stats().slow_samples >= 1


class OneHeavy(Dataset):
    """Sample 0 takes a second computing (a busy loop), or three blocked (a
    sleep); the rest are instant."""

    def __init__(self, blocks: bool) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> int:
        if index == 0:
            if self.blocks:
                # Its replacement lives only while it sleeps: long enough
                # to be seen on a loaded machine.
                time.sleep(3.0)
            else:
                end = time.perf_counter() + 1.0
                while time.perf_counter() < end:
                    pass
        return index


class HeavyInTheSecondEpoch(tud.Sampler[int]):
    """All but sample 0 in the first epoch (the processes start), then all."""

    def __init__(self) -> None:
        self.epochs = 0

    def __len__(self) -> int:
        return 31 if self.epochs == 0 else 32

    def __iter__(self):
        self.epochs += 1
        return iter(range(1 if self.epochs == 1 else 0, 32))


@pytest.mark.parametrize("blocks", [False, True], ids=["computing", "blocked"])
def test_a_sample_computing_in_its_process_on_a_full_pool_gets_no_replacement(
    blocks: bool,
) -> None:
    # The worker's thread only waits on its socket: whether the sample
    # computes is read from its process. A process per core is a full pool.
    workers = os.cpu_count() or 1
    loader = minato.DataLoader(
        OneHeavy(blocks),
        batch_size=4,
        sampler=HeavyInTheSecondEpoch(),
        in_order=False,
        num_workers=workers,
        worker_method="multiprocessing",
        sample_timeout=0.02,
        adaptive=False,  # a fixed pool: only replacements change its size
        # The processes' start (a first epoch) is past before sample 0 runs:
        # a start can take longer than four timeouts, and gets replacements.
        persistent_workers=True,
    )
    assert len(list(loader)) == 8
    it = iter(loader)
    batches = [[int(i) for i in next(it)]]
    engine = it._engine
    if blocks:
        assert wait_until(lambda: engine.num_workers == workers + 1)
    else:
        # Past four timeouts many times over, still no replacement.
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            assert engine.num_workers == workers
            time.sleep(0.01)
    batches += [[int(i) for i in batch] for batch in it]
    assert sorted(i for batch in batches for i in batch) == list(range(32))
    assert loader.stats().slow_samples >= 1
    del it, loader


def test_auto_on_free_threaded_python_keeps_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    from minato._process import method as _worker_method

    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    method = _worker_method.WorkerMethod("auto")
    assert method.decided and not method.processes
    assert "free-threaded" in method.reason
    loader = minato.DataLoader(PurePython(), batch_size=8, shuffle=True, num_workers=2)
    assert indices(loader) == list(range(4000))
    assert loader.stats().worker_method == "thread"


def test_the_fork_server_imports_the_datasets_modules_once(tmp_path: Path) -> None:
    # Each worker would otherwise import them again when it unpickles the
    # dataset (a second or more for torchvision), every loader anew.
    (tmp_path / "probe_mod.py").write_text(
        textwrap.dedent("""
            import os
            import torch.utils.data as tud

            with open(os.environ["IMPORTS_LOG"], "a") as log:
                log.write(f"{os.getpid()}\\n")

            class Pids(tud.Dataset):
                def __len__(self):
                    return 8

                def __getitem__(self, i):
                    return os.getpid()
            """)
    )
    script = textwrap.dedent("""
        import os
        import minato
        from probe_mod import Pids

        workers = set()
        for _ in range(2):
            loader = minato.DataLoader(
                Pids(), batch_size=2, num_workers=2, worker_method="multiprocessing"
            )
            workers |= {int(pid) for batch in loader for pid in batch}
            del loader
        print(sorted(workers))
        """)
    log = tmp_path / "imports.log"
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, IMPORTS_LOG=str(log))
    run = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert run.returncode == 0, run.stderr
    worker_pids = set(eval(run.stdout.strip().splitlines()[-1]))
    importers = [int(line) for line in log.read_text().split()]
    # Two loaders of two worker processes (one may have served no batch).
    assert 2 <= len(worker_pids) <= 4, worker_pids
    # The loader's process alone: the fork server, forked from it, had it
    # already, and no worker imported it again.
    assert len(importers) == 1 and not worker_pids & set(importers), importers


def test_auto_moves_only_once_the_fork_server_has_imported_the_datasets_modules() -> None:
    # Moving earlier would stall every worker until those imports are done
    # (seconds for torchvision on a busy machine); threads go on meanwhile.
    zygote = _process._zygote_now()
    assert _process.fork_server_ready([])
    assert not _process.fork_server_ready(["colorsys", "json"])
    zygote.preload(["colorsys", "json"])
    assert _process.fork_server_ready(["colorsys", "json"])


def test_a_warm_up_asked_again_for_the_same_modules_starts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warm = _process._warm
    started: list[list[str]] = []

    def counted(modules: list[str]) -> None:
        started.append(modules)
        warm(modules)

    monkeypatch.setattr(_process, "_warm", counted)
    for _ in range(5):
        _process.warm_up(["colorsys", "fractions"])
    _process.warm_up(["fractions"])
    assert wait_until(lambda: _process.fork_server_ready(["colorsys", "fractions"]))
    assert len(started) <= 1, started  # none when an earlier test asked for them


def test_a_pickles_modules_are_found_without_unpickling() -> None:
    from collections import OrderedDict
    from fractions import Fraction

    payload = _ipc.dumps({"a": Fraction(1, 3), "b": OrderedDict(), "c": [Fraction(2)]})
    assert _ipc.modules_named(payload) == ["fractions", "collections"]


def _trial(threads_interval: float, processes_interval: float) -> tuple[WorkerMethod, list]:
    """Runs auto's trial on synthetic batch times: 12 batches on threads,
    the move, then batches on processes until it is judged."""
    method = WorkerMethod("auto")
    now, verdicts = 0.0, []
    for _ in range(12):
        now += threads_interval
        verdicts.append(method.batch_received(now))
    method._decide(True, "auto: the training loop waited 2.0 ms ...")
    assert method.ready_for_processes()
    method.activate(batches_in_flight=4)
    for _ in range(40):
        if not method.on_trial:
            break
        now += processes_interval
        verdicts.append(method.batch_received(now))
    return method, verdicts


def test_auto_keeps_processes_when_the_loop_runs_faster_on_them() -> None:
    method, verdicts = _trial(threads_interval=0.2, processes_interval=0.1)
    assert set(verdicts) == {None}
    assert method.processes and method.name == "multiprocessing"
    assert "10.0 batches/s on them against 5.0 on threads" in method.reason


def test_auto_goes_back_to_threads_when_the_loop_runs_slower_on_processes() -> None:
    method, verdicts = _trial(threads_interval=0.1, processes_interval=0.2)
    assert verdicts[-1] == "revert" and verdicts.count("revert") == 1
    assert not method.processes and not method.wants_processes and method.decided
    assert method.name == "thread"
    assert "10.0 batches/s on them against 5.0 on processes" in method.reason
    # The batches threads had loaded before the move were not counted.
    assert len(verdicts) == 12 + 5 + 8


@pytest.mark.parametrize("sign", ["clear", "clear, nothing loaded seen", "gain wanted"])
def test_a_clear_sign_moves_at_once(sign: str) -> None:
    method = WorkerMethod("auto")
    now = 0.0
    method.batch_received(now, samples=16)  # the first batch starts the intervals
    if sign != "clear, nothing loaded seen":
        method._seen = (0.05, 30)  # what the threads loaded while undecided
    if sign.startswith("clear"):
        method._decide(True, "auto: worker threads waited for the GIL 40% of their fetch time")
        assert method.threads_serialised
    else:
        method._gain_wanted = True  # the loop sets the pace: processes must gain
        method._decide(True, "auto: the training loop sets the pace ...")
        assert not method.threads_serialised
    moved_at = now if method.ready_for_processes() else None
    while moved_at is None and now < 2:
        now += 0.0625  # exact in binary: 8 of them are half a second
        method.batch_received(now, samples=16)
        if method.ready_for_processes():
            moved_at = now
    # At once after a clear sign: the threads' side is what they loaded
    # (see the test below); two batch intervals on threads where that is
    # unknown; else the whole arm, 8 batches and a second.
    assert moved_at == {"clear": 0.0, "clear, nothing loaded seen": 0.125}.get(sign, 1.0)


def test_a_clear_sign_waits_for_the_move_about_a_batch_of_the_threads() -> None:
    # The threads loaded 600 samples a second: a batch of 16 in 27 ms, which
    # the loop would wait for anyway. Processes start in the workers' next
    # tasks, not beside threads that hold the GIL.
    method = WorkerMethod("auto")
    method.batch_received(0.0, waited=0.05, samples=16)
    method._seen = (0.05, 30)
    method._decide(True, "auto: worker threads waited for the GIL 60% of their fetch time")
    assert method.move_wait() == pytest.approx(16 / 600)
    method._seen = (0.5, 30)
    method._decide(True, "auto: worker threads waited for the GIL 60% of their fetch time")
    assert method.move_wait() == _worker_method.MOVE_WAIT_S


def test_a_clear_signs_threads_side_is_what_they_loaded_before_any_interval() -> None:
    # Decided at the first batch: no interval on threads. The threads loaded
    # 600 samples a second, 37.5 batches of 16; processes run the loop at
    # 80 batches a second, or at 20.
    for interval, kept in ((1 / 80, True), (1 / 20, False)):
        method = WorkerMethod("auto")
        now = 0.0
        method.batch_received(now, waited=0.05, samples=16)
        method._seen = (0.05, 30)
        method._decide(True, "auto: worker threads waited for the GIL 60% of their fetch time")
        assert method.ready_for_processes()
        method.activate(batches_in_flight=1)
        while method.on_trial:
            now += interval
            method.batch_received(now, samples=16)
        assert method.processes is kept, method.reason
        if kept:
            assert "80.0 batches/s on them against 37.5 as threads loaded them" in method.reason
        else:
            assert "37.5 batches/s on them against 20.0 on processes" in method.reason


def test_a_clear_signs_threads_side_counts_no_faster_than_the_threads_loaded() -> None:
    # A GIL-bound dataset, a loop that waits for data: the two batches of the
    # threads' side were loaded before the loop asked (at start-up) and
    # arrived at once, where the threads loaded 600 samples a second, 37.5
    # batches of 16. Processes run the loop at 80 batches a second.
    method = WorkerMethod("auto")
    now = 0.0
    method.batch_received(now, waited=0.05, samples=16)
    method._seen = (0.05, 30)  # the window that found the sign
    method._decide(True, "auto: worker threads waited for the GIL 60% of their fetch time")
    for _ in range(2):
        now += 0.001
        method.batch_received(now, samples=16)
    assert method.ready_for_processes()
    method.activate(batches_in_flight=2)
    verdicts = []
    while method.on_trial:
        now += 1 / 80
        verdicts.append(method.batch_received(now, samples=16))
    assert set(verdicts) == {None} and method.processes, method.reason
    assert "80.0 batches/s on them against 37.5 as threads loaded them" in method.reason


def test_a_loop_that_sets_the_pace_is_judged_by_its_steps_on_threads() -> None:
    # Its steps are the rate, whatever the threads loaded beside it.
    method = WorkerMethod("auto")
    method.batch_received(0.0, waited=0.05, samples=16)
    method._seen = (0.05, 16)
    method._try_for_the_loop("the training loop sets the pace ...")
    method.batch_received(0.1, samples=16)
    assert method.ready_for_processes()
    assert method._threads_rate() == (pytest.approx(10.0), "on threads")


def test_workers_plainly_serialised_by_the_gil_move_after_a_few_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock, method, figures = _auto_on_a_clock(monkeypatch)
    # 30 ms and 16 samples in, the two threads waited half their time.
    clock.now = _worker_method.CLEAR_WINDOW_S
    figures = {"samples_loaded": 16, "busy": 0.06, "gil_wait": 0.03, "cpu": 0.03}
    assert method.observe(figures) == "move"
    assert "waited for the GIL 50%" in method.reason
    # A lesser share waits for the usual window.
    other = WorkerMethod("auto")
    clock.now = 0.0
    other.observe({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
    clock.now = _worker_method.CLEAR_WINDOW_S
    figures = {"samples_loaded": 16, "busy": 0.06, "gil_wait": 0.018, "cpu": 0.04}
    assert other.observe(figures) != "move" and not other.decided


@pytest.mark.parametrize(
    ("busy", "cpu", "cores", "gil_share", "moves"),
    [
        # two threads of pure Python: one core between them, though the wait
        # to enter Python reads low (cheap samples in runs pay it once a run)
        (0.06, 0.028, 2, 0.02, True),
        # sixteen, taking turns: they wait to enter too (64 % measured,
        # which the plain GIL sign moves; here under that sign's bound)
        (0.48, 0.03, 16, 0.35, True),
        (0.06, 0.057, 2, 0.1, False),  # GIL-free work: both cores
        (0.54, 0.0105, 2, 0.1, False),  # sleeping samples: a third of a core
        (0.06, 0.028, 1, 0.1, False),  # one core: processes would share it too
        # 33 threads sleeping 3 ms each (an I/O pool grown to 64): about a
        # core between them, handing round a GIL that is mostly free
        (1.0, 0.025, 2, 0.07, False),
    ],
)
def test_workers_that_run_one_at_a_time_move_after_a_few_samples(
    monkeypatch: pytest.MonkeyPatch,
    busy: float,
    cpu: float,
    cores: int,
    gil_share: float,
    moves: bool,
) -> None:
    """The GIL's hand-overs inside the dataset's Python are seen by the
    workers' CPU clocks, not by the wait to enter it: workers in their tasks
    together that use one core between them, and wait to enter Python, are
    serialised; many threads that sleep use as little, and find it free."""
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    monkeypatch.setattr(_worker_method, "_cores", lambda: cores)
    method = WorkerMethod("auto")
    method.observe({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
    clock.now = _worker_method.CLEAR_WINDOW_S
    # 30 ms and 36 samples in.
    figures = {"samples_loaded": 36, "busy": busy, "gil_wait": gil_share * busy, "cpu": cpu}
    verdict = method.observe(figures)
    assert (verdict == "move") is moves, method.reason
    if moves:
        assert "one at a time" in method.reason


@pytest.mark.parametrize(("runnable", "moves"), [(0.1, True), (0.95, False)])
def test_threads_that_lack_a_core_are_not_taken_for_threads_the_gil_serialises(
    monkeypatch: pytest.MonkeyPatch, runnable: float, moves: bool
) -> None:
    """Two threads that use one core between them: run one at a time by the
    GIL where they were blocked (waiting for it), or short of cores where
    they were runnable, waiting for one (another process takes the other
    core): processes would get no more of it."""
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    monkeypatch.setattr(_worker_method, "_cores", lambda: 2)
    method = WorkerMethod("auto")
    method.observe({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
    clock.now = _worker_method.CLEAR_WINDOW_S
    # `runnable` of the process's threads waited for a core, on average.
    clock.runnable = runnable * clock.now
    figures = {"samples_loaded": 36, "busy": 0.06, "gil_wait": 0.0012, "cpu": 0.03}
    verdict = method.observe(figures)
    assert (verdict == "move") is moves, method.reason


def _data_bound_decision(
    monkeypatch: pytest.MonkeyPatch,
    *,
    process_cores: float,
    workers_cores: float,
    busy_threads: float,
    gil_share: float = 0.0,
    probe_delay: float = 0.0,
    others: float = 0.0,
    samples: int = 16,
) -> tuple[WorkerMethod, _Clock, str | None]:
    """Auto on 2 cores until it decides (or 40 batches): a loop that waits
    for data (a batch every 20 ms, 18 of them waited), its GIL probes each
    waiting `probe_delay`; the process keeps `process_cores` busy, other
    processes `others`; `busy_threads` workers at work on average, waiting
    for the GIL `gil_share` of their time, using `workers_cores` together."""
    clock = _Clock(probe_delay)
    _use_clock(monkeypatch, clock)
    monkeypatch.setattr(_worker_method, "_cores", lambda: 2)
    method = WorkerMethod("auto")
    method.observe({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
    verdict = None
    for batch in range(1, 40):
        clock.now = batch * 0.02
        method.batch_received(clock.now, waited=0.018)
        method.probe()
        clock.cpu = process_cores * clock.now
        clock.others = others * clock.now
        busy = busy_threads * clock.now
        figures = {
            "samples_loaded": samples * batch,
            "busy": busy,
            "gil_wait": gil_share * busy,
            "cpu": workers_cores * clock.now,
        }
        verdict = method.observe(figures)
        if method.decided:
            break
    return method, clock, verdict


@pytest.mark.parametrize(("process_cores", "kept"), [(0.9, True), (0.5, False)])
def test_threads_that_keep_the_cores_busy_stay_while_the_loop_waits_for_data(
    monkeypatch: pytest.MonkeyPatch, process_cores: float, kept: bool
) -> None:
    """Processes cannot load faster on cores the threads already keep busy:
    however long the loop waits to take the GIL back, a loop that waits for
    data keeps threads (a loop that sets the pace still gets its trial)."""
    # 8 threads, each on a CPU a fifth of its time: 2 ms of CPU a sample;
    # every probe waits 3 ms to take the GIL back.
    method, _, verdict = _data_bound_decision(
        monkeypatch,
        process_cores=2 * process_cores,
        workers_cores=1.6,
        busy_threads=8,
        gil_share=0.05,
        probe_delay=0.003,
    )
    assert method.decided
    assert (not method.wants_processes) is kept, method.reason
    assert ("cores busy" in method.reason) is kept, method.reason
    assert verdict == (None if kept else "move")


@pytest.mark.parametrize(("others", "kept"), [(0.4, True), (0.0, False)])
def test_threads_stay_where_other_processes_leave_no_core_for_processes_to_gain_on(
    monkeypatch: pytest.MonkeyPatch, others: float, kept: bool
) -> None:
    """Two threads that compute keep 1.4 of 2 cores busy while the loop waits
    for data; another process (a sampler, another rank's workers) takes 0.4
    of a core: processes could load on at most 1.6, short of the gain a
    trial wants, so threads stay without one. On an idle machine the trial
    runs."""
    # Two threads at work, on a CPU 65% of their time.
    method, _, verdict = _data_bound_decision(
        monkeypatch, process_cores=1.4, workers_cores=1.3, busy_threads=2, others=others, samples=4
    )
    assert method.decided
    assert (not method.wants_processes) is kept, method.reason
    if kept:
        assert verdict is None
        assert method.reason == (
            "auto: processes could load at most 1.14x as fast (other processes left this "
            "one 1.6 of the 2 cores and its threads used 1.4) while the training loop waits "
            "for data"
        )
    else:
        assert verdict == "move" and "the workers compute" in method.reason


@pytest.mark.parametrize(("processes_rate", "kept"), [(24.0, True), (22.0, False)])
def test_a_loading_trial_times_threads_from_its_decision_and_wants_a_clear_gain(
    processes_rate: float, kept: bool
) -> None:
    """Workers that compute, a loop that waits for data: threads are timed
    from the decision on (their cold start before it, a batch every 0.2 s,
    is left out, as are the two batches after it, loaded before it), at 20
    batches a second; processes stay only where they run the loop a clear
    margin faster."""
    method = WorkerMethod("auto")
    now = 0.0
    method.batch_received(now, waited=0.1, samples=16)
    for _ in range(10):
        now += 0.2
        method.batch_received(now, waited=0.19, samples=16)
    method._seen = (now, 160)  # what the threads loaded before the decision
    method._gain_wanted = method._loading_trial = method._threads_from_decision = True
    decided_at = now
    method._decide(True, "auto: the workers compute (70% of their fetch time on a CPU)")
    for _ in range(2):  # loaded before the decision: they arrive at once
        now += 0.001
        method.batch_received(now, waited=0.0, samples=16)
    while not method.ready_for_processes():
        now += 0.05
        method.batch_received(now, waited=0.04, samples=16)
    # A second of threads after the decision (and a batch, where the
    # intervals' sum rounds below it).
    assert 1.0 < now - decided_at < 1.06
    method.activate(batches_in_flight=2)
    verdicts = []
    while method.on_trial:
        now += 1 / processes_rate
        verdicts.append(method.batch_received(now, samples=16))
    assert ("revert" in verdicts) is not kept, method.reason
    assert method.processes is kept
    if kept:
        assert f"{processes_rate:.1f} batches/s on them against 20.0 on threads" in method.reason
    else:
        assert f"20.0 batches/s on them against {processes_rate:.1f} on processes" in method.reason


@pytest.mark.parametrize(("workers_cores", "loading"), [(1.6, True), (0.9, False)])
def test_a_loop_that_waits_for_data_is_not_moved_for_its_gil_delay_without_a_loading_trial(
    monkeypatch: pytest.MonkeyPatch, workers_cores: float, loading: bool
) -> None:
    """The loop waits to take the GIL back, but it waits for data too: the
    delay costs it time it would have waited. Where the workers compute
    together on more than a core, processes are tried as for workers that
    compute: threads timed for a second first, and kept unless processes
    load clearly faster. On a core or less, the GIL may be what runs them
    one at a time: they move after two batches, as after a clear sign."""
    method, clock, verdict = _data_bound_decision(
        monkeypatch,
        process_cores=1.0,
        workers_cores=workers_cores,
        busy_threads=8,
        gil_share=0.05,
        probe_delay=0.003,
    )
    assert verdict == "move" and "to take the GIL back" in method.reason, method.reason
    assert method._loading_trial is loading
    for _ in range(2):
        clock.now += 0.02
        method.batch_received(clock.now, waited=0.018)
    assert method.ready_for_processes() is not loading


def test_threads_waiting_for_a_core_stay_while_the_loop_waits_for_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process keeps only half the cores busy, but its threads waited for
    a core (other processes take the rest): no core is spare for worker
    processes to load faster on."""
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    monkeypatch.setattr(_worker_method, "_cores", lambda: 2)
    method = WorkerMethod("auto")
    method.observe({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
    for batch in range(1, 20):
        clock.now = batch * 0.02
        method.batch_received(clock.now, waited=0.018)  # the loop waits for data
        clock.cpu = 0.5 * 2 * clock.now
        clock.runnable = 2.0 * clock.now  # two threads waiting for a core
        method.observe(
            {
                "samples_loaded": 16 * batch,
                "busy": 8 * clock.now,
                "gil_wait": 0.05 * 8 * clock.now,
                "cpu": 1.0 * clock.now,
            }
        )
        if method.decided:
            break
    assert method.decided and not method.wants_processes
    assert "waited for a core" in method.reason


def test_the_loops_gil_delay_leaves_out_its_wait_for_a_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each probe takes 3 ms to come back, 2.5 of them runnable without a core.
    clock = _Clock(0.003, probe_queued=0.0025)
    _use_clock(monkeypatch, clock)
    method = WorkerMethod("auto")
    for _ in range(4):
        method.probe()
    assert method.probe_total / method.probes == pytest.approx(0.0005)


class _Clock:
    """Stands in for the time module in minato._process.method, and for the
    kernel's count of the time threads waited for a core."""

    def __init__(self, probe_delay: float, probe_queued: float = 0.0) -> None:
        self.now = 0.0
        self.probe_delay = probe_delay
        # Of each probe's delay, the time its thread was runnable, waiting
        # for a core (not for the GIL).
        self.probe_queued = probe_queued
        self.cpu = 0.0  # this process's CPU time
        self.runnable = 0.0  # its threads' time waiting for a core, in all
        self.thread_runnable = 0.0  # the training loop's thread's
        self.others = 0.0  # other processes' CPU time on this one's cores

    def perf_counter(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.cpu

    def sleep(self, _seconds: float) -> None:
        self.now += self.probe_delay  # the probe's wait to take the GIL back
        self.thread_runnable += self.probe_queued


def _use_clock(monkeypatch: pytest.MonkeyPatch, clock: _Clock) -> None:
    monkeypatch.setattr(_worker_method, "time", clock)
    monkeypatch.setattr(_worker_method, "_runnable_wait", lambda: clock.runnable)
    monkeypatch.setattr(_worker_method, "_thread_runnable_wait", lambda: clock.thread_runnable)
    monkeypatch.setattr(_worker_method, "_cores_busy_time", lambda: clock.cpu + clock.others)


def _auto_on_a_clock(
    monkeypatch: pytest.MonkeyPatch, **figures: float
) -> tuple[_Clock, WorkerMethod, dict[str, float]]:
    """An auto WorkerMethod on a clock of the test's, having seen the engine's
    first figures (nothing loaded yet; `figures` adds or replaces some)."""
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    method = WorkerMethod("auto")
    first = {"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0, **figures}
    method.observe(first)
    return clock, method, first


def _loop_bound_run(
    monkeypatch: pytest.MonkeyPatch,
    waited: float,
    processes_interval: float,
    can_trial=True,
    probe_delay: float = 0.0,
    cpu_share: float | None = None,
    gil_share: float = 0.0,
    occupancy: float | None = None,
    kind: type | None = None,
    first_wait: float = 0.06,
) -> tuple[WorkerMethod, list]:
    """A loop (over a dataset of type `kind`) that receives a batch every 50
    ms after waiting `waited` for it (the first one `first_wait`, the
    workers' start-up: longer than a step, so that no single step shows the
    loop's pace, see the next test), its probes finding the GIL free (the
    workers idle, as a full queue leaves them) or waiting `probe_delay`,
    then, if moved, a batch every `processes_interval`. Its workers wait for
    the GIL `gil_share` of their fetch time and spend `cpu_share` of the
    rest on a CPU (None: the engine does not say). Each of its requests
    finds the ready queue `occupancy` full (None: the engine does not
    say)."""
    clock = _Clock(probe_delay)
    _use_clock(monkeypatch, clock)
    method = WorkerMethod("auto", kind)
    figures = {"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "fetch_p50": 0.005}
    if cpu_share is not None:
        figures["cpu"] = 0.0
    method.observe(figures)
    verdicts = []
    for batch in range(1, 40):
        clock.now = batch * 0.05
        verdicts.append(method.batch_received(clock.now, first_wait if batch == 1 else waited))
        method.probe()
        busy = 0.09 * batch  # 5.6 ms a sample
        figures = dict(figures, samples_loaded=16 * batch, busy=busy, gil_wait=gil_share * busy)
        if cpu_share is not None:
            figures["cpu"] = cpu_share * (1 - gil_share) * busy
        if occupancy is not None:
            figures.update(queue_asks=batch, queue_occupancy=occupancy)
        verdicts.append(method.observe(figures, can_trial=can_trial))
        if method.wants_processes:
            break
    if not method.wants_processes:
        return method, verdicts
    while not method.ready_for_processes():  # the loop's rate on threads is measured first
        clock.now += 0.05
        verdicts.append(method.batch_received(clock.now, waited))
    method.activate(batches_in_flight=2)
    while method.on_trial:
        clock.now += processes_interval
        verdicts.append(method.batch_received(clock.now, 0.0))
    return method, verdicts


def test_a_loop_that_sets_the_pace_tries_processes_and_keeps_them_if_it_runs_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The probes read nothing (a full queue leaves the workers idle when the
    # loop takes a batch), but the loop, which waits for no batch, is what
    # counts: the trial asks whether threads slowed it.
    method, verdicts = _loop_bound_run(monkeypatch, waited=0.001, processes_interval=0.04)
    assert "warm" in verdicts and verdicts.count("move") == 1
    assert "sets the pace" in method.reason
    assert method.processes and "25.0 batches/s on them against 20.0" in method.reason


def test_a_loop_that_never_waits_but_finds_the_queue_short_does_not_set_the_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Batches do not pile up before it: its own steps are slowed (many
    # worker threads handing the GIL around), and a trial on threads that
    # slow it would read processes faster whatever they then run at.
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.001, processes_interval=0.04, occupancy=0.17
    )
    assert "move" not in verdicts and not method.wants_processes, method.reason
    assert "sets the pace" not in method.reason
    # Finding it full, the same loop sets the pace.
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.001, processes_interval=0.04, occupancy=0.9
    )
    assert verdicts.count("move") == 1 and "sets the pace" in method.reason


def _after_a_first_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[_Clock, WorkerMethod, dict[str, float]]:
    """Auto on a clock, after the workers' first batch of 16 samples (5.6
    ms each, on a CPU about half of it), which the loop waited 100 ms for,
    finding the queue empty: the loop's pace is still unknown."""
    clock, method, figures = _auto_on_a_clock(monkeypatch, fetch_p50=0.005)
    clock.now = 0.1
    method.batch_received(clock.now, 0.1)
    first = dict(figures, samples_loaded=16, busy=0.09, cpu=0.05, queue_asks=1)
    assert method.observe(dict(first, queue_occupancy=0.0)) is None
    return clock, method, figures


def test_a_loop_that_sets_the_pace_tries_processes_once_its_second_batch_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A short epoch of GPU-like steps (10 batches): the wait for the workers'
    # first batch is their start-up, not the loop waiting for data, nor a
    # short queue (one worker: that request found it empty, the next ones
    # half full), and the trial's threads side is the loop's steps so far,
    # not a second more of them slowed by the threads.
    clock, method, figures = _after_a_first_batch(monkeypatch)
    verdicts, batches = [], 1
    while not method.wants_processes and batches < 20:
        clock.now += 0.08
        batches += 1
        method.batch_received(clock.now, 0.002)
        figures = dict(figures, samples_loaded=16 * batches, busy=0.09 * batches)
        # The engine's mean over every request, the first one's included.
        queue = {"queue_asks": batches, "queue_occupancy": 0.5 * (batches - 1) / batches}
        verdicts.append(method.observe(dict(figures, cpu=0.05 * batches, **queue)))
    assert verdicts == ["move"] and "sets the pace" in method.reason, method.reason
    # Its steps so far are the trial's threads side: it moves now.
    assert method.ready_for_processes()


@pytest.mark.parametrize("step", [0.2, 0.05])
def test_a_loop_whose_first_step_outlasts_the_first_batch_tries_processes_at_once(
    monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    # A GPU-like loop beside one worker thread (neighbour.py): its first
    # step took longer than the workers' start-up and first batch together,
    # and the next batch, loaded by a thread slowed beside it, kept it
    # waiting a little. That step is the trial's threads side; the training
    # thread may wait up to about one more for the move. A loop whose step
    # is shorter than that first wait has shown nothing yet.
    clock, method, figures = _after_a_first_batch(monkeypatch)
    clock.now += step + 0.01
    method.batch_received(clock.now, 0.01)
    second = dict(figures, samples_loaded=32, busy=0.18, cpu=0.1, queue_asks=2)
    verdict = method.observe(dict(second, queue_occupancy=0.0))
    if step < 0.1:
        assert verdict is None and not method.wants_processes, method.reason
        assert method.move_wait() == 0.0
        return
    assert verdict == "move" and method.wants_processes, method.reason
    assert "sets the pace (its steps took 200 ms" in method.reason, method.reason
    assert "first batch, 100 ms" in method.reason, method.reason
    assert method.ready_for_processes()
    assert method.move_wait() == pytest.approx(0.1)


@pytest.mark.parametrize("busy", [0.18, 6.4])
def test_a_first_step_beside_more_threads_at_work_than_cores_does_not_show_the_pace(
    monkeypatch: pytest.MonkeyPatch, busy: float
) -> None:
    # 32 worker threads at work at once on 2 cores beside a loop that only
    # takes its batches: its first step outlasted the first batch's wait,
    # the cores and the GIL taken from it in turns. That step is no pace.
    monkeypatch.setattr(_worker_method, "_cores", lambda: 2)
    clock, method, figures = _after_a_first_batch(monkeypatch)
    clock.now += 0.2
    method.batch_received(clock.now, 0.0)
    second = dict(figures, samples_loaded=32, busy=busy, cpu=0.1, queue_asks=2)
    verdict = method.observe(dict(second, queue_occupancy=0.0))
    if busy > 2 * 0.2:
        assert verdict != "move" and not method.wants_processes, method.reason
    else:
        assert verdict == "move" and "sets the pace (its steps" in method.reason, method.reason


def test_a_loop_that_waits_for_data_after_a_long_first_step_does_not_set_the_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A long first step (a model's warm-up), then a wait for the next batch
    # a third of the loop's time: the data sets the pace.
    clock, method, figures = _after_a_first_batch(monkeypatch)
    clock.now += 0.3
    method.batch_received(clock.now, 0.1)
    verdict = method.observe(dict(figures, samples_loaded=32, busy=0.18, cpu=0.1))
    assert verdict != "move" and not method.wants_processes, method.reason


@pytest.mark.parametrize("processes_interval,kept", [(0.05, True), (0.06, False)])
def test_a_loop_that_sets_the_pace_goes_back_to_threads_where_processes_run_it_clearly_slower(
    monkeypatch: pytest.MonkeyPatch, processes_interval: float, kept: bool
) -> None:
    # Its threads side is a few steps, as noisy as a step: equal rates keep
    # processes (what torch runs); a loop 17% slower on them goes back.
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.001, processes_interval=processes_interval
    )
    assert method.processes is kept, method.reason
    if not kept:
        assert verdicts[-1] == "revert"
        assert "20.0 batches/s on them against 16.7 on processes" in method.reason


def test_a_trial_with_a_full_threads_side_keeps_processes_only_on_a_gain() -> None:
    # Workers that compute, a loop waiting for data: a second and 8 batches
    # on threads, then processes no faster.
    method = WorkerMethod("auto")
    now = 0.0
    method.batch_received(now)
    method._gain_wanted = method._loading_trial = method._threads_from_decision = True
    method._decide(True, "auto: the workers compute ...")
    while not method.ready_for_processes():
        now += 0.125
        method.batch_received(now)
    method.activate(batches_in_flight=0)
    verdicts = []
    while method.on_trial:
        now += 0.125
        verdicts.append(method.batch_received(now))
    assert verdicts[-1] == "revert" and not method.processes


@pytest.mark.parametrize("cpu_share", [None, 0.1])
def test_a_loop_that_waits_for_data_keeps_threads_when_nothing_points_to_the_gil(
    monkeypatch: pytest.MonkeyPatch, cpu_share: float | None
) -> None:
    # Workers that mostly wait (I/O), or whose CPU time is not known.
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.04, processes_interval=0.04, cpu_share=cpu_share
    )
    assert set(verdicts) == {None} and method.decided and not method.wants_processes
    assert "releases the GIL" in method.reason


@pytest.mark.parametrize("processes_interval,kept", [(0.04, True), (0.05, False)])
def test_workers_that_compute_try_processes_wanting_a_gain(
    monkeypatch: pytest.MonkeyPatch, processes_interval: float, kept: bool
) -> None:
    # PIL's decode on 16 cores: the GIL reads free (its waits are inside
    # the work), yet threads of one process loaded half as fast as processes.
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.04, processes_interval=processes_interval, cpu_share=0.9
    )
    assert verdicts.count("move") == 1
    assert "the workers compute (90% of their fetch time on a CPU" in method.reason
    assert method.processes is kept
    if not kept:
        assert verdicts[-1] == "revert"


def test_a_loop_gil_delay_beside_workers_that_wait_keeps_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Workers that sleep (I/O) in a pool grown past num_workers: the loop's
    # GIL delay is their hand-overs; processes, num_workers of them, would
    # not replace the pool.
    method, verdicts = _loop_bound_run(
        monkeypatch,
        waited=0.04,
        processes_interval=0.01,
        probe_delay=2 * _worker_method.LOOP_DELAY_BOUND_S,
        cpu_share=0.05,
    )
    assert "move" not in verdicts and method.decided and not method.wants_processes
    assert "workers on a CPU 5% of their time" in method.reason


def test_a_samples_cost_leaves_out_each_worker_threads_first_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two threads' first tasks took 2 ms of CPU each (their first torch
    # op, the process's first), the other 14 samples 50 us each: over the
    # whole window they read 294 us a sample, worth a process; they cost 50.
    clock, method, _ = _auto_on_a_clock(monkeypatch, first_task_cpu=0.0, first_task_samples=0)
    clock.now = _worker_method.DECIDE_AFTER_S
    figures = {
        "samples_loaded": 16,
        "busy": 0.006,
        "gil_wait": 0.0,
        "cpu": 2 * 0.002 + 14 * 50e-6,
        "first_task_cpu": 2 * 0.002,
        "first_task_samples": 2,
    }
    assert method.observe(figures) is None
    assert method.decided and not method.wants_processes
    assert "samples take 50 us of CPU, too little" in method.reason


def test_a_samples_cost_counts_first_tasks_where_no_other_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every sample so far was in a first task (runs of 8): those are all
    # there is to time.
    clock, method, _ = _auto_on_a_clock(monkeypatch)
    clock.now = _worker_method.DECIDE_AFTER_S
    figures = {
        "samples_loaded": 16,
        "busy": 0.0008,
        "gil_wait": 0.0,
        "cpu": 16 * 50e-6,
        "first_task_cpu": 16 * 50e-6,
        "first_task_samples": 16,
    }
    method.observe(figures)
    assert method.decided and not method.wants_processes
    assert "samples take 50 us of CPU, too little" in method.reason


def test_many_threads_waiting_for_the_gil_over_cheap_samples_keep_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 32 threads whose samples sleep: they wait for the GIL half their time,
    # handing it around, but each sample takes 17 us of CPU. A process's
    # round trip would cost more than it saves.
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.04, processes_interval=0.01, cpu_share=0.006, gil_share=0.5
    )
    assert "move" not in verdicts and method.decided and not method.wants_processes
    assert "us of CPU, too little for a worker process's round trip" in method.reason


def test_thousands_of_cheap_samples_keep_threads_within_the_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 32 threads on samples that sleep 1 ms and take 60 us of CPU each: an
    # undecided loader neither hands over to whole batches nor lets its fork
    # server go, so DECIDE_AFTER_SAMPLES readings settle it before
    # DECIDE_AFTER_S.
    clock, method, figures = _auto_on_a_clock(monkeypatch)
    clock.now = 0.2
    few = _worker_method.DECIDE_AFTER_SAMPLES // 2
    figures = {"samples_loaded": few, "busy": few * 0.0015, "gil_wait": 0.0, "cpu": few * 6e-5}
    assert method.observe(figures) is None and not method.decided
    many = _worker_method.DECIDE_AFTER_SAMPLES
    figures = {"samples_loaded": many, "busy": many * 0.0015, "gil_wait": 0.0, "cpu": many * 6e-5}
    assert method.observe(figures) is None
    assert method.decided and not method.wants_processes
    assert "samples take 60 us of CPU, too little" in method.reason
    assert clock.now < _worker_method.DECIDE_AFTER_S


def test_epochs_shorter_than_the_decision_window_add_up_to_a_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loader of short epochs (a small evaluation set) starts new workers,
    # and so a new window, every epoch: each alone too short to settle, yet
    # the loader must decide (an undecided one keeps its fork server, probes
    # its loop and never hands over to whole batches).
    clock, method, _ = _auto_on_a_clock(monkeypatch)
    epoch_s, samples = 0.15, 400  # samples that sleep, 60 us of CPU each
    epochs = 0
    while not method.decided:
        assert epochs < 20
        start = clock.now
        method.restart_window({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
        for step in range(1, 5):
            clock.now = start + epoch_s * step / 4
            loaded = samples * step // 4
            figures = {
                "samples_loaded": loaded,
                "busy": loaded * 0.0015,
                "gil_wait": 0.0,
                "cpu": loaded * 6e-5,
            }
            assert method.observe(figures) is None
            if method.decided:
                break
        epochs += 1
    assert not method.wants_processes
    assert "samples take 60 us of CPU, too little" in method.reason
    # Settled by the samples timed over the epochs (DECIDE_AFTER_SAMPLES),
    # in the epoch that reached them.
    assert epochs == -(-_worker_method.DECIDE_AFTER_SAMPLES // samples)
    assert method.decided_after is not None
    assert method.decided_after[0] == pytest.approx(clock.now)


def test_how_soon_auto_chose_is_in_the_stats() -> None:
    # A method given: nothing to time.
    given = minato.DataLoader(Sleeps(), batch_size=8, num_workers=2, worker_method="thread")
    assert given.stats().worker_method_decided_after is None
    # Auto on a GIL-bound dataset: chosen within the first epoch, and how
    # soon is said (the first decision, or the trial's verdict).
    auto = minato.DataLoader(PurePython(), batch_size=8, num_workers=2)
    batches = len(list(auto))
    stats = auto.stats()
    assert not stats.worker_method_reason.startswith("auto: threads until"), stats
    assert stats.worker_method_decided_after is not None
    assert stats.worker_method_decided_after > 0
    assert 0 < stats.worker_method_decided_at_batch <= batches
    assert "worker method chosen" in str(stats)
    # Until a trial on processes is judged, nothing holds for later loaders.
    for _ in range(4):
        if "trying worker processes" not in (auto.stats().worker_method_reason or ""):
            break
        assert indices(auto) == list(range(4000))
    # A later loader over the same type starts from that choice: at once.
    later = minato.DataLoader(PurePython(), batch_size=8, num_workers=2)
    assert later.stats().worker_method_decided_after == 0.0
    assert later.stats().worker_method_decided_at_batch == 0
    del given, auto, later
    assert wait_until(lambda: not workers_of_this_process())


class ShortEpochs(Dataset):
    """A small dataset of cheap samples that release the GIL: an epoch takes
    a small share of the time auto watches a loader before keeping threads."""

    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int) -> int:
        time.sleep(0.001)
        return index


def test_a_loader_of_short_epochs_decides_over_them() -> None:
    loader = minato.DataLoader(ShortEpochs(), batch_size=16, num_workers=2)
    for _ in range(30):
        assert indices(loader) == list(range(400))
        if loader.stats().worker_method_decided_after is not None:
            break
    stats = loader.stats()
    # Chosen, whichever way (a loaded machine may show other signs first).
    assert stats.worker_method_decided_after is not None, stats.worker_method_reason
    assert not stats.worker_method_reason.startswith("auto: threads until")
    del loader
    assert wait_until(lambda: not workers_of_this_process())


def test_workers_that_wait_for_the_gil_while_computing_move(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.04, processes_interval=0.04, cpu_share=0.9, gil_share=0.5
    )
    assert verdicts.count("move") == 1 and method.processes
    assert "waited for the GIL 50% of their fetch time" in method.reason


@pytest.mark.parametrize("processes_interval,kept", [(0.04, True), (0.05, False)])
def test_a_loop_gil_delay_past_half_the_bound_tries_processes_wanting_a_gain(
    monkeypatch: pytest.MonkeyPatch, processes_interval: float, kept: bool
) -> None:
    delay = 0.6 * _worker_method.LOOP_DELAY_BOUND_S
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.04, processes_interval=processes_interval, probe_delay=delay
    )
    assert "warm" in verdicts and verdicts.count("move") == 1
    assert method.processes is kept
    assert "0.18 ms on average to take the GIL back" in method.reason


def test_a_loop_bound_loader_that_cannot_go_back_keeps_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Workers dealt batches in turn (or an IterableDataset's) cannot leave
    # processes once moved: no trial, so no move on this evidence alone.
    method, verdicts = _loop_bound_run(
        monkeypatch, waited=0.001, processes_interval=0.04, can_trial=False
    )
    assert "move" not in verdicts and method.decided and not method.wants_processes


def test_a_loader_back_on_threads_delivers_every_sample_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Processes judged slower whatever they do: the workers go back to
    # threads mid-epoch, each stopping its process after its last task.
    monkeypatch.setattr(_worker_method, "TRIAL_TOLERANCE", -100.0)
    monkeypatch.setattr(_worker_method, "SHORT_SIDE_TOLERANCE", -100.0)
    monkeypatch.setattr(_worker_method, "TRIAL_GAIN", 100.0)
    monkeypatch.setattr(_worker_method, "TRIAL_MIN_S", 0.05)
    loader = minato.DataLoader(PurePython(), batch_size=8, shuffle=True, num_workers=2)
    reasons = []
    for _ in range(6):
        assert indices(loader) == list(range(4000))
        reasons.append(loader.stats().worker_method_reason)
        if "on processes" in reasons[-1]:
            break
    stats = loader.stats()
    assert stats.worker_method == "thread", reasons
    assert "on them against" in stats.worker_method_reason
    del loader
    assert wait_until(lambda: not workers_of_this_process())


class EpochCounter(IterableDataset):
    """Hugging Face ``datasets``' way to reach persistent workers: the epoch
    is a shared 0-dim tensor that ``set_epoch`` updates in place."""

    def __init__(self) -> None:
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self.epoch += epoch - self.epoch

    def __iter__(self):
        info = get_worker_info()
        for index in range(info.id, 12, info.num_workers):
            yield int(self.epoch), index


@pytest.mark.parametrize("method", ["thread", "multiprocessing"])
def test_a_shared_tensor_updated_in_place_reaches_persistent_workers(method: str) -> None:
    seen = {}
    for loader_type, options in (
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": method}),
    ):
        dataset = EpochCounter()
        loader = loader_type(
            dataset, batch_size=3, num_workers=2, persistent_workers=True, **options
        )
        epochs = []
        for epoch in range(3):
            dataset.set_epoch(epoch)
            epochs.append(sorted({int(e) for epochs_seen, _ in loader for e in epochs_seen}))
        seen[loader_type] = epochs
        del loader
    assert seen[tud.DataLoader] == [[0], [1], [2]]
    assert seen[minato.DataLoader] == seen[tud.DataLoader]


def test_a_small_tensor_in_shared_memory_travels_shared() -> None:
    shared = torch.zeros(3).share_memory_()
    payload = _ipc.dumps({"value": shared, "plain": torch.zeros(3)})
    assert len(payload.fds) == 1  # the shared one; the plain one goes by value
    received = _ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds])
    shared += 1
    assert received["value"].tolist() == [1.0, 1.0, 1.0]
    assert received["plain"].tolist() == [0.0, 0.0, 0.0]


def test_large_payloads_travel_in_minatos_own_shared_memory(monkeypatch) -> None:
    # No private torch storage method is needed for what minato shares itself.
    def private(*args, **kwargs):
        raise AssertionError("a private torch storage method was called")

    for name in ("_new_shared", "_new_shared_fd_cpu", "_share_fd_cpu_"):
        monkeypatch.setattr(torch.UntypedStorage, name, private, raising=False)
    monkeypatch.setattr(_ipc, "_from_torch_fd", None)
    tensor = torch.arange(50_000, dtype=torch.float64).reshape(500, 100)[:, ::2]
    array = np.arange(40_000, dtype=np.int32)
    payload = _ipc.dumps({"tensor": tensor, "array": array})
    assert len(payload.fds) == 2
    received = _ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds])
    del payload
    assert torch.equal(received["tensor"], tensor)
    assert np.array_equal(received["array"], array)


def test_a_shared_tensor_without_torchs_methods_is_copied(monkeypatch) -> None:
    monkeypatch.setattr(_ipc, "_from_torch_fd", None)
    shared = torch.zeros(20_000).share_memory_()
    payload = _ipc.dumps(shared)
    received = _ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds])
    shared += 1
    assert received.sum().item() == 0  # a copy: right data, not the same pages


def test_hugging_face_set_epoch_reshuffles_persistent_worker_processes() -> None:
    datasets = pytest.importorskip("datasets")
    source = datasets.Dataset.from_dict({"x": list(range(64))}).to_iterable_dataset(num_shards=4)
    shuffled = source.shuffle(seed=0, buffer_size=8)
    orders = {}
    for loader_type, options in (
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ):
        loader = loader_type(
            shuffled, batch_size=8, num_workers=2, persistent_workers=True, **options
        )
        epochs = []
        for epoch in range(3):
            shuffled.set_epoch(epoch)
            epochs.append([int(x) for batch in loader for x in batch["x"]])
        orders[loader_type] = epochs
        del loader
    # Each epoch its own shuffle, every sample once, as with torch.
    for epochs in orders.values():
        assert all(sorted(order) == list(range(64)) for order in epochs)
        assert len({tuple(order) for order in epochs}) == 3
    assert [sorted(o) for o in orders[minato.DataLoader]] == [
        sorted(o) for o in orders[tud.DataLoader]
    ]


class SignalsTheLoop(Dataset):
    """torch's test_worker_seed / test_proper_exit pattern: a dataset holding
    multiprocessing primitives that its workers use."""

    def __init__(self, context: Any) -> None:
        self.loaded = context.Event()
        self.count = context.Value("i", 0)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        with self.count.get_lock():
            self.count.value += 1
        self.loaded.set()
        return index


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_dataset_holding_multiprocessing_primitives_on_worker_processes(
    start_method: str,
) -> None:
    results = {}
    for loader_type, options in (
        (tud.DataLoader, {"multiprocessing_context": start_method}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ):
        dataset = SignalsTheLoop(multiprocessing.get_context(start_method))
        delivered = indices(loader_type(dataset, batch_size=2, num_workers=2, **options))
        results[loader_type] = (delivered, dataset.loaded.is_set(), dataset.count.value)
    assert results[tud.DataLoader] == (list(range(8)), True, 8)
    assert results[minato.DataLoader] == results[tud.DataLoader]


def test_forced_worker_processes_inherit_fork_context_primitives_as_torchs_do() -> None:
    """A lock or Value made in the 'fork' context reaches only processes
    forked from this one: torch's (fork), and forced worker processes, which
    then come from a fork server forked as the epoch starts."""
    results = {}
    for loader_type, options in (
        (tud.DataLoader, {"multiprocessing_context": "fork"}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ):
        dataset = SignalsTheLoop(multiprocessing.get_context("fork"))
        delivered = indices(loader_type(dataset, batch_size=2, num_workers=2, **options))
        results[loader_type] = (delivered, dataset.loaded.is_set(), dataset.count.value)
    assert results[tud.DataLoader] == (list(range(8)), True, 8)
    assert results[minato.DataLoader] == results[tud.DataLoader]
    # "auto" stays on threads for it, where it works.
    dataset = SignalsTheLoop(multiprocessing.get_context("fork"))
    auto = minato.DataLoader(dataset, batch_size=2, num_workers=2)
    assert indices(auto) == list(range(8)) and dataset.count.value == 8


def test_a_fork_context_lock_names_itself_and_the_remedy_where_the_server_is_execd(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fresh interpreter forked from no one cannot inherit it: the error
    says what to do."""
    monkeypatch.setenv("MINATO_FORK_SERVER", "exec")
    dataset = SignalsTheLoop(multiprocessing.get_context("fork"))
    loader = minato.DataLoader(
        dataset, batch_size=2, num_workers=2, worker_method="multiprocessing"
    )
    with pytest.raises(RuntimeError, match=r"'fork' context.*get_context\(\"forkserver\"\)"):
        list(loader)


class HoldsWhatNoPickleCarries(Dataset):
    """What torch's forked workers inherit and no pickle carries: an open
    file (read by position), a lock, a generator. `scale` is changed by the
    training loop between epochs."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "rb")  # noqa: SIM115  # held, as such datasets do
        self.lock = threading.Lock()
        self.pending = iter(range(3))
        self.scale = 1

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> dict[str, int]:
        with self.lock:
            byte = os.pread(self.file.fileno(), 1, index)[0]
        return {"index": index, "value": byte * self.scale, "pid": os.getpid()}


def _children_of_this_process() -> set[int]:
    return {pid for pid, entry in live_processes().items() if _parent(entry) == os.getpid()}


@pytest.mark.parametrize("persistent", [False, True])
def test_forced_worker_processes_inherit_a_dataset_no_pickle_carries_as_torchs_do(
    tmp_path: Path, persistent: bool
) -> None:
    """As torch's workers, forked as each epoch starts (once, persistent),
    they see the dataset as it was then: a change between epochs reaches a
    new epoch's workers, not persistent ones. None is left behind."""
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(100, 116)))
    before = _children_of_this_process()
    results = {}
    for loader_type, options in (
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ):
        dataset = HoldsWhatNoPickleCarries(path)
        loader = loader_type(
            dataset,
            batch_size=4,
            shuffle=True,
            num_workers=2,
            persistent_workers=persistent,
            **options,
        )
        epochs, pids = [], set()
        for scale in (1, 3):
            dataset.scale = scale
            batches = list(loader)
            epochs.append(
                sorted(
                    (int(i), int(v))
                    for b in batches
                    for i, v in zip(b["index"], b["value"], strict=True)
                )
            )
            pids |= {int(pid) for b in batches for pid in b["pid"]}
        assert os.getpid() not in pids
        results[loader_type] = epochs
        del loader, batches
        assert wait_until(lambda pids=pids: not pids & set(live_processes())), pids
    assert results[tud.DataLoader][0] == [(i, 100 + i) for i in range(16)]
    assert results[minato.DataLoader] == results[tud.DataLoader]
    # Nothing the loader forked is left (its workers, or a server of its own).
    assert wait_until(lambda: _children_of_this_process() <= before | _fork_servers())


def test_forced_worker_processes_never_pickle_the_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forked with it, as torch's are: never pickled (in vain for this one,
    whose large arrays would have been copied into shared memory first)."""
    tried = []
    check = _process.ProcessWorkers.check_picklable

    def counted(self):
        tried.append(self)
        return check(self)

    monkeypatch.setattr(_process.ProcessWorkers, "check_picklable", counted)
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(100, 116)))
    loader = minato.DataLoader(
        HoldsWhatNoPickleCarries(path), batch_size=4, num_workers=2, worker_method="multiprocessing"
    )
    for _ in range(3):
        assert sorted(int(i) for batch in loader for i in batch["index"]) == list(range(16))
    assert tried == []


class Counts(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return index


class SumsALoadersBatches(Dataset):
    """Each sample loads another dataset through a loader of its own, on
    worker processes."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        inner = minato.DataLoader(
            Counts(), batch_size=2, num_workers=1, worker_method="multiprocessing"
        )
        return index + sum(int(batch.sum()) for batch in inner)


@pytest.mark.timeout(60)
def test_a_loader_on_worker_processes_inside_a_worker_process() -> None:
    """torch's daemonic workers may start no process (an AssertionError);
    minato's may. Its locks held as the fork server was forked are found
    released there (minato._util.fork), not waited on for ever."""
    loader = minato.DataLoader(
        SumsALoadersBatches(), batch_size=1, num_workers=1, worker_method="multiprocessing"
    )
    assert [int(batch) for batch in loader] == [6, 7]


@pytest.mark.parametrize("persistent", [False, True])
def test_forced_worker_processes_see_the_training_process_as_each_epoch_starts_as_torchs(
    monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    """torch forks its workers as each epoch starts: they see the module
    globals the training process has then (set after the loader was built,
    changed between epochs); persistent ones keep those of their start."""
    import helpers

    seen = {}
    for loader_type, options in (
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ):
        monkeypatch.setattr(helpers, "PARENT_MARK", 0)
        loader = loader_type(
            helpers.MarkedByItsModule(),
            batch_size=4,
            num_workers=2,
            persistent_workers=persistent,
            **options,
        )
        marks = []
        for mark in (1, 2):
            monkeypatch.setattr(helpers, "PARENT_MARK", mark)
            marks.append({sample[1] for batch in loader for sample in batch.tolist()})
        seen[loader_type] = marks
        del loader
    assert seen[tud.DataLoader] == ([{1}, {1}] if persistent else [{1}, {2}])
    assert seen[minato.DataLoader] == seen[tud.DataLoader]


def _in_context(
    loader_type: type, dataset: Any, context: str | None, given: bool, **options: Any
) -> Any:
    """A loader given `context` as it is built, or assigned it after."""
    if given:
        return loader_type(dataset, multiprocessing_context=context, **options)
    loader = loader_type(dataset, **options)
    loader.multiprocessing_context = context
    return loader


@pytest.mark.parametrize("given", [True, False], ids=["given", "assigned"])
@pytest.mark.parametrize("context", ["spawn", "forkserver", None])
def test_forced_worker_processes_start_as_the_loaders_context_asks_as_torchs(
    monkeypatch: pytest.MonkeyPatch, context: str | None, given: bool
) -> None:
    """ "spawn" and "forkserver": from a fresh interpreter, which sees none of
    what the training process changed (nor its CUDA context), and gets the
    dataset pickled; the default: forked, which sees it all. The same where
    the context is assigned after the loader is built."""
    import helpers

    monkeypatch.setattr(helpers, "PARENT_MARK", 1)
    seen = {}
    for loader_type, options in (
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ):
        loader = _in_context(
            loader_type,
            helpers.MarkedByItsModule(),
            context,
            given,
            batch_size=4,
            num_workers=2,
            **options,
        )
        samples = [sample.tolist() for batch in loader for sample in batch]
        assert os.getpid() not in {pid for _, _, pid in samples}
        seen[loader_type] = (sorted(i for i, _, _ in samples), {mark for _, mark, _ in samples})
        locked = _in_context(
            loader_type, helpers.MarkedHoldingALock(), context, given, num_workers=2, **options
        )
        try:
            seen[loader_type] += (len(list(locked)),)
        except TypeError as error:  # a lock cannot be pickled
            seen[loader_type] += (type(error),)
    assert seen[tud.DataLoader] == (
        list(range(8)),
        {0} if context else {1},
        TypeError if context else 8,
    )
    assert seen[minato.DataLoader] == seen[tud.DataLoader]


@pytest.fixture
def spawn_set() -> Any:
    """multiprocessing's start method set to "spawn" for the test."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    yield
    multiprocessing.set_start_method(before, force=True)


@pytest.mark.parametrize("asked", ["context", "context assigned", "start method"])
def test_auto_keeps_threads_where_worker_processes_are_asked_to_start_fresh(
    request: pytest.FixtureRequest, asked: str
) -> None:
    """Auto's processes are forked: a loader that asks for "spawn" (CUDA in
    its dataset, say) keeps threads, decided from the start."""
    options: dict[str, Any] = {"multiprocessing_context": "spawn"}
    if asked != "context":
        options = {}
    if asked == "start method":
        request.getfixturevalue("spawn_set")
    loader = minato.DataLoader(PurePython(), batch_size=8, num_workers=2, **options)
    if asked == "context assigned":
        loader.multiprocessing_context = "spawn"
    assert indices(loader) == list(range(4000))
    stats = loader.stats()
    assert stats.worker_method == "thread"
    assert "'spawn'" in (stats.worker_method_reason or ""), stats.worker_method_reason


def _fork_servers() -> set[int]:
    zygote = _process._the_zygote
    return set() if zygote is None else {zygote.process.pid}


class StreamsItsOpenFile(IterableDataset):
    """An iterable dataset holding an open file: each worker reads its share."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "rb")  # noqa: SIM115

    def __iter__(self):
        info = get_worker_info()
        for index in range(info.id, 12, info.num_workers):
            yield os.pread(self.file.fileno(), 1, index)[0]


def test_forced_worker_processes_stream_an_iterable_dataset_no_pickle_carries(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(12)))
    delivered = {}
    for loader_type, options in (
        (tud.DataLoader, {}),
        (minato.DataLoader, {"worker_method": "multiprocessing"}),
    ):
        loader = loader_type(StreamsItsOpenFile(path), batch_size=2, num_workers=2, **options)
        delivered[loader_type] = [batch.tolist() for batch in loader]
    assert sorted(sum(delivered[tud.DataLoader], [])) == list(range(12))
    assert delivered[minato.DataLoader] == delivered[tud.DataLoader]


def _descriptor_links(pid: int | str) -> list[str]:
    links = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            links.append(os.readlink(entry))
    return links


@pytest.mark.parametrize("workers", [2, 3], ids=["forked directly", "from a server"])
def test_forced_worker_processes_keep_only_the_users_descriptors(
    tmp_path: Path, workers: int
) -> None:
    """Forked from the training process (up to two; more from a server of
    the loader's own, forked from it), they keep the dataset's open files,
    not minato's sockets and shared memory: another loader's workers still
    leave when that loader goes, and none holds this process's end of a
    socket (it would never see this process gone, kill -9)."""
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(100, 116)))
    other = minato.DataLoader(
        Described(),
        batch_size=4,
        num_workers=2,
        worker_method="multiprocessing",
        persistent_workers=True,
    )
    other_pids = {int(pid) for batch in other for pid in batch["pid"]}
    held = minato.DataLoader(
        HoldsWhatNoPickleCarries(path),
        batch_size=4,
        num_workers=workers,
        worker_method="multiprocessing",
        persistent_workers=True,
    )
    assert len(list(held)) == 4
    # Every worker up (one may still be starting when the epoch ends: its
    # socket is then on its way to the server).
    processes = held._iterator._processes
    assert wait_until(lambda: len(processes._processes) == workers)
    pids = {process.pid for process in processes._processes}
    assert not pids & other_pids
    ours = {link for link in _descriptor_links("self") if link.startswith("socket:")}
    own = processes.own_zygote
    if workers <= _process.FORKED_DIRECTLY:
        assert own is None
        assert {_parent(Path(f"/proc/{pid}")) for pid in pids} == {os.getpid()}
        holders = pids
    else:  # the server forked them, and holds what they hold
        holders = {own.process.pid}
        assert {_parent(Path(f"/proc/{pid}")) for pid in pids} == holders
    for pid in holders:
        links = _descriptor_links(pid)
        assert str(path) in links, links
        assert not ours & set(links), (ours & set(links), links)
        if pid not in pids:  # a worker maps its own slots and arenas; a server none
            assert not [link for link in links if link.startswith("/memfd:minato-")], links
    del other
    assert wait_until(lambda: not other_pids & set(live_processes())), other_pids
    assert len(list(held)) == 4  # its own workers go on
    del held
    # This process reaps the workers it forked: none is left a zombie.
    assert wait_until(lambda: not pids & (_zombie_children() | set(live_processes())))


def _zombie_children() -> set[int]:
    zombies = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            if state == "Z" and int(parent) == os.getpid():
                zombies.add(int(entry.name))
    return zombies


def test_a_later_loader_over_the_same_dataset_type_starts_from_the_decision() -> None:
    first = minato.DataLoader(PurePython(), batch_size=8, shuffle=True, num_workers=2)
    for _ in range(5):
        assert indices(first) == list(range(4000))
        if "on them against" in (first.stats().worker_method_reason or ""):
            break
    decided = first.stats()
    # The trial's verdict (processes, unless a loaded machine slowed them).
    assert "on them against" in decided.worker_method_reason, decided.worker_method_reason
    # A second loader (an evaluation loader, say) starts from it: on
    # processes as soon as its workers can, no thread phase, no trial. (A
    # threads verdict is only provisional: the second loader's own loop may
    # still start a trial.)
    second = minato.DataLoader(PurePython(), batch_size=8, num_workers=2)
    assert indices(second) == list(range(4000))
    stats = second.stats()
    if decided.worker_method == "multiprocessing":
        assert stats.worker_method == "multiprocessing", stats.worker_method_reason
        assert "decided for an earlier loader of PurePython" in stats.worker_method_reason
    else:
        reason = stats.worker_method_reason
        assert (
            "decided for an earlier loader of PurePython" in reason
            or "where an earlier loader of this dataset kept threads" in reason
        ), reason
    # Another dataset type decides for itself.
    other = minato.DataLoader(Sleeps(), batch_size=8, num_workers=2)
    assert "earlier loader" not in (other.stats().worker_method_reason or "")
    del first, second, other
    assert wait_until(lambda: not workers_of_this_process())


def test_a_dataset_that_computes_without_the_gil_tries_processes_in_its_first_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Where its threads leave cores free (on this machine's two cores they
    # keep both busy, and stay: see the cores-busy test above), and no other
    # process takes them (a loaded CI machine's threads wait for a core).
    monkeypatch.setattr(_worker_method, "CORES_BUSY", 2.0)
    monkeypatch.setattr(_worker_method, "NO_SPARE_CORE_RUNNABLE", float("inf"))
    monkeypatch.setattr(_worker_method, "_processes_gain_short", lambda *_: None)
    loader = minato.DataLoader(
        Hashes(), batch_size=8, shuffle=True, num_workers=2, persistent_workers=True
    )
    assert len(list(loader)) == len(loader)
    reason = loader.stats().worker_method_reason or ""
    # Processes were tried in the first epoch: the trial is under way, or
    # the reason gives its rates on both sides, whichever side won.
    assert "trying worker processes" in reason or "batches/s on them against" in reason, reason
    # What sent it to the trial: the workers' CPU clocks; or, on a loaded
    # machine, the loop's GIL probe (whose re-take waits for a core too)
    # past its bound first; or, where other processes hold a core, threads
    # that together get about one core while at work at once, which is
    # what GIL-bound threads look like; or, its cores shared with another
    # test run, threads that waited for the GIL past its line (the Python
    # around each hash holds it, and a thread preempted holding it keeps
    # the others waiting).
    signs = (
        "the workers compute",
        "to take the GIL back",
        "runs them one at a time",
        "worker threads waited for the GIL",
    )
    assert any(sign in reason for sign in signs), reason
    del loader
    assert wait_until(lambda: not workers_of_this_process())


@pytest.mark.parametrize(("server", "workers"), [("fork", 2), ("fork", 3), ("exec", 2)])
def test_worker_processes_and_the_fork_server_run_none_of_the_loaders_signal_handlers(
    tmp_path: Path, server: str, workers: int
) -> None:
    # Forked from the loader's process, a worker must not run a trainer's
    # SIGTERM handler (a checkpoint, say); started fresh
    # (MINATO_FORK_SERVER=exec), the fork server never had one. Either way
    # the workers load the data.
    script = textwrap.dedent("""
        import os, signal, sys
        import minato
        from minato._process import workers

        def checkpoint(*_):
            with open(sys.argv[1], "a") as out:
                out.write(f"{os.getpid()}\\n")

        signal.signal(signal.SIGTERM, checkpoint)
        loader = minato.DataLoader(
            list(range(16)), batch_size=4, num_workers=int(sys.argv[2]),
            worker_method="multiprocessing", persistent_workers=True,
        )
        assert sorted(int(i) for batch in loader for i in batch) == list(range(16))
        processes = loader._iterator._processes
        if processes.direct:  # forked from here, as torch's
            pid = next(iter(processes._processes)).pid
            os.kill(pid, signal.SIGTERM)
            _, status = os.waitpid(pid, 0)
            # torch's worker signal handlers: terminated by its parent, a
            # worker exits quietly.
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        else:  # forked: the loader's own server; a fresh interpreter: the shared one
            server = (processes.own_zygote or workers._the_zygote).process
            os.kill(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        print("served")
        """)
    ran = tmp_path / "handler_ran"
    run = subprocess.run(
        [sys.executable, "-c", script, str(ran), str(workers)],
        env=dict(os.environ, MINATO_FORK_SERVER=server),
        cwd=tmp_path,  # the installed minato, not the checkout's sources
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("served")
    assert not ran.exists(), ran.read_text()


class HoldsItsData(Dataset):
    """A dataset that holds its data in memory (JPEG bytes, say): its pickle
    is larger than what goes through a worker's socket."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.blobs = [rng.bytes(300_000) for _ in range(12)]

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, index: int) -> str:
        return hashlib.sha256(self.blobs[index]).hexdigest()


def _spills_open() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if "minato-message" in target:
                found.append(target)
    return found


def test_a_dataset_larger_than_a_socket_message_reaches_every_worker_whole() -> None:
    dataset = HoldsItsData()
    expected = [hashlib.sha256(blob).hexdigest() for blob in dataset.blobs]
    for persistent in (False, True):
        loader = minato.DataLoader(
            dataset,
            batch_size=3,
            num_workers=2,
            worker_method="multiprocessing",
            persistent_workers=persistent,
        )
        for _ in range(2):
            assert [digest for batch in loader for digest in batch] == expected
        del loader
    # Its shared copy goes with the loader's engine.
    assert wait_until(lambda: not _spills_open()), _spills_open()
    assert wait_until(lambda: not workers_of_this_process())


def _run_loop(method: WorkerMethod, clock: _Clock, waited: float, batches: int = 40) -> list:
    """A batch every 50 ms after waiting `waited` for it; 16 samples of
    5.6 ms each on a CPU half the time, the GIL free."""
    figures = {"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0}
    method.observe(figures)
    verdicts = []
    for batch in range(1, batches):
        clock.now = batch * 0.05
        verdicts.append(method.batch_received(clock.now, waited))
        busy = 0.09 * batch
        figures = {"samples_loaded": 16 * batch, "busy": busy, "gil_wait": 0.0, "cpu": busy / 2}
        verdicts.append(method.observe(figures))
        if method.decided:
            break
    return verdicts


class _SomeDataset:
    pass


@pytest.mark.parametrize("loop_sets_the_pace", [True, False])
def test_threads_decided_for_an_earlier_loader_are_judged_again_by_this_loop(
    monkeypatch: pytest.MonkeyPatch, loop_sets_the_pace: bool
) -> None:
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    _worker_method._decided_for[_SomeDataset] = (False, "auto: threads, as measured", False)
    method = WorkerMethod("auto", _SomeDataset)
    assert not method.decided and "earlier loader" in method.reason
    # A loop that waits for no batch sets the pace; one that waits half its
    # time does not.
    verdicts = _run_loop(method, clock, waited=0.001 if loop_sets_the_pace else 0.025)
    assert method.decided
    if loop_sets_the_pace:
        assert "move" in verdicts and method.wants_processes
        assert "where an earlier loader of this dataset kept threads" in method.reason
        assert method._gain_wanted  # kept only if the trial shows a gain
        # The loop's steps on threads so far are the trial's threads side:
        # it moves now, not after another second of them.
        assert clock.now <= 0.2 and method.ready_for_processes()
    else:
        assert "move" not in verdicts and not method.wants_processes
        assert method.reason.startswith("auto: threads, as measured; decided for an earlier")


@pytest.mark.parametrize(("processes_rate", "kept"), [(64.0, False), (160.0, True)])
def test_a_loop_that_never_waits_beside_more_threads_than_cores_times_them_from_the_trial_on(
    monkeypatch: pytest.MonkeyPatch, processes_rate: float, kept: bool
) -> None:
    """Threads kept for an earlier loader; this loader's 32 sleeping threads
    are at work at once on 2 cores, and its loop, which never waits for a
    batch, receives one every 27 ms while they start, every 7.5 ms after.
    The trial's threads side is timed from its decision on, past that start:
    processes stay only where they run the loop a clear margin faster than
    threads' 133 batches a second, not than the 37 of their start-up."""
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    monkeypatch.setattr(_worker_method, "_cores", lambda: 2)
    _worker_method._decided_for[_SomeDataset] = (False, "auto: threads, as measured", False)
    method = WorkerMethod("auto", _SomeDataset)
    method.observe({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
    verdicts: list = []
    batch = 0
    while not method.decided:
        batch += 1
        clock.now = 0.027 * batch
        verdicts.append(method.batch_received(clock.now, waited=0.03 if batch == 1 else 0.0))
        busy = 32 * clock.now  # 32 threads at work at once
        figures = {
            "samples_loaded": 64 * batch,
            "busy": busy,
            "gil_wait": 0.0,
            "cpu": 0.05 * busy,
            "queue_asks": batch,
            "queue_occupancy": 1.0,
        }
        verdicts.append(method.observe(figures))
        assert batch < 20
    assert "move" in verdicts and method.wants_processes, method.reason
    assert "where an earlier loader of this dataset kept threads" in method.reason
    # Not on the steps so far: threads are timed first, from here on.
    decided_at = clock.now
    assert not method.ready_for_processes()
    while not method.ready_for_processes():
        clock.now += 0.0075
        method.batch_received(clock.now, waited=0.0)
    assert clock.now - decided_at >= 1.0
    method.activate(batches_in_flight=2)
    while method.on_trial:
        clock.now += 1 / processes_rate
        verdicts.append(method.batch_received(clock.now))
    assert method.processes is kept, method.reason
    if kept:
        assert f"{processes_rate:.1f} batches/s on them against 133.3 on threads" in method.reason
    else:
        assert "133.3 batches/s on them against 64.0 on processes" in method.reason


@pytest.mark.parametrize(("others", "tried"), [(0.4, False), (0.0, True)])
def test_a_later_loaders_gil_delay_beside_threads_kept_earlier_gets_a_loading_trial(
    monkeypatch: pytest.MonkeyPatch, others: float, tried: bool
) -> None:
    """Threads kept for an earlier loader, and this loader's loop, which waits
    for data, waits a little to take the GIL back: whether processes load
    faster decides, as for a loader's own first decision. None where other
    processes leave no cores to gain on; else a loading trial (a second of
    threads, a clear gain wanted)."""
    clock = _Clock(0.0002)  # each probe waits 0.2 ms to take the GIL back
    _use_clock(monkeypatch, clock)
    monkeypatch.setattr(_worker_method, "_cores", lambda: 2)
    _worker_method._decided_for[_SomeDataset] = (False, "auto: threads, as measured", False)
    method = WorkerMethod("auto", _SomeDataset)
    method.observe({"samples_loaded": 0, "busy": 0.0, "gil_wait": 0.0, "cpu": 0.0})
    verdicts = []
    for batch in range(1, 40):
        clock.now = batch * 0.05
        verdicts.append(method.batch_received(clock.now, waited=0.025))
        method.probe()
        clock.cpu = 1.4 * clock.now
        clock.others = others * clock.now
        busy = 0.09 * batch
        figures = {"samples_loaded": 16 * batch, "busy": busy, "gil_wait": 0.0, "cpu": busy / 2}
        verdicts.append(method.observe(figures))
        if method.decided:
            break
    assert method.decided
    assert method.wants_processes is tried, method.reason
    if tried:
        assert "move" in verdicts and method._loading_trial
        assert "where an earlier loader of this dataset kept threads" in method.reason
    else:
        assert "move" not in verdicts
        assert method.reason.startswith("auto: processes could load at most 1.14x as fast")


def test_threads_a_trial_chose_hold_for_a_later_loader_without_another_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loop that sets the pace, and processes clearly slower than threads: the
    # trial goes back to threads. A later loader over the same dataset type
    # (an evaluation loader re-created for each evaluation) keeps them at
    # once, where a choice made without a trial would be tried again.
    first, verdicts = _loop_bound_run(
        monkeypatch, waited=0.001, processes_interval=0.06, kind=_SomeDataset
    )
    assert verdicts[-1] == "revert" and not first.wants_processes
    assert "on them against" in first.reason
    later = WorkerMethod("auto", _SomeDataset)
    assert later.decided and not later.may_use_processes
    assert later.decided_after == (0.0, 0)
    assert "decided for an earlier loader of _SomeDataset" in later.reason
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    assert set(_run_loop(later, clock, waited=0.001)) == {None}
    assert not later.wants_processes


def test_threads_kept_by_a_loading_trial_are_tried_again_for_a_loop_that_sets_the_pace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loop that waits for data (neighbour.py's data alone) tried processes
    # as its workers compute, and they loaded no faster: threads. That says
    # nothing of whether threads slow a later loop that sets the pace (a
    # GPU-like step beside PIL threads): that loader is judged again.
    first, verdicts = _loop_bound_run(
        monkeypatch, waited=0.04, processes_interval=0.06, cpu_share=0.9, kind=_SomeDataset
    )
    assert verdicts[-1] == "revert" and "the workers compute" in first.reason
    later = WorkerMethod("auto", _SomeDataset)
    assert not later.decided and later.may_use_processes
    assert "decided for an earlier loader of _SomeDataset" in later.reason
    clock = _Clock(0.0)
    _use_clock(monkeypatch, clock)
    assert "move" in _run_loop(later, clock, waited=0.001)
    assert later.wants_processes and "sets the pace" in later.reason


def test_memory_freed_by_worker_threads_can_be_given_back() -> None:
    """After a move to processes the threads' freed heaps are returned
    (glibc's malloc_trim); elsewhere nothing happens, and nothing fails."""
    from minato._util.memory import give_back_freed_memory

    blocks = [bytearray(1 << 20) for _ in range(64)]
    del blocks
    give_back_freed_memory()
    give_back_freed_memory()


def test_the_training_thread_leaves_giving_memory_back_to_a_thread_that_ends() -> None:
    """A hand-over to whole batches, or a move to processes, gives the old
    threads' freed memory back on a thread of its own (trimming every arena
    can take long), which ends once done."""
    from minato._util.memory import give_back_freed_memory_soon

    before = os_thread_count()
    blocks = [bytearray(1 << 20) for _ in range(64)]
    del blocks
    give_back_freed_memory_soon()
    assert wait_for_thread_count(before) <= before
    assert not any(thread.name == "minato-trim" for thread in threading.enumerate())
