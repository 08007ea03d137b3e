"""minato.DataLoader under torchrun (issue 7): 2 CPU processes (gloo), each with
a DistributedSampler, minato worker threads and a DDP model; and the torchrun
example. The ranks run as a real torchrun job (a subprocess), each writing
what it saw to JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.utils.data as tud
from ddp.launch import ROOT, run_with_port, torchrun

SCRIPT = Path(__file__).resolve().parent / "ddp" / "torchrun_script.py"
EXAMPLE = ROOT / "examples" / "torchrun_ddp.py"

# As in tests/ddp/torchrun_script.py.
N = 40
BATCH = 4


def expected_shard(rank: int, epoch: int) -> list[int]:
    sampler = tud.DistributedSampler(range(N), num_replicas=2, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_torchrun_two_ranks_shard_the_dataset(tmp_path: Path) -> None:
    # run_with_port fails the test on a timeout or a rank left running.
    result = run_with_port(lambda port: torchrun(port, SCRIPT, str(tmp_path)))
    assert result.returncode == 0, result.stdout
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    for rank, record in enumerate(ranks):
        assert (record["rank"], record["world_size"]) == (rank, 2)
        # Loaded by worker threads of the rank's own process, never its main thread.
        assert record["batch_pids"] == [record["pid"]]
        assert record["loaded_on_main_thread"] is False
        assert record["workers"] and min(record["workers"]) >= 0
        # DistributedSampler shuffles: minato may reorder within the shard.
        assert record["reorders"] is True
        assert record["len_loader"] == N // 2 // BATCH
        assert record["models_in_sync"] is True
    assert ranks[0]["pid"] != ranks[1]["pid"]

    for epoch in map(str, range(2)):
        # As many steps on each rank (DDP's all-reduce needs it), all of the shard's.
        assert ranks[0]["batches"][epoch] == ranks[1]["batches"][epoch] == N // 2 // BATCH
        shards = [record["seen"][epoch] for record in ranks]
        for rank, shard in enumerate(shards):
            # Exactly DistributedSampler's shard after set_epoch, each index once.
            assert sorted(shard) == sorted(expected_shard(rank, int(epoch))), (rank, epoch)
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(N))
    # set_epoch took effect: a new shard each epoch.
    for record in ranks:
        assert set(record["seen"]["0"]) != set(record["seen"]["1"])


def test_torchrun_example(tmp_path: Path) -> None:
    result = run_with_port(lambda port: torchrun(port, EXAMPLE, "--epochs", "2"))
    assert result.returncode == 0, result.stdout
    assert "each sample once per epoch across 2 ranks" in result.stdout, result.stdout


def test_torchrun_example_without_torchrun() -> None:
    # Run as a plain script it trains as a one-process group.
    result = run_with_port(lambda _port: [sys.executable, str(EXAMPLE), "--epochs", "1"])
    assert result.returncode == 0, result.stdout
    assert "each sample once per epoch across 1 rank" in result.stdout, result.stdout
