"""One rank of a torchrun job (CPU, gloo) that prepares a minato loader and
torch's with Hugging Face Accelerate; writes the batches each gave this rank
to ``<outdir>/rank<r>.json`` for tests/test_accelerate.py.

    python -m torch.distributed.run --nproc_per_node 2 --master_port <port> \\
        tests/ddp/accelerate_script.py <outdir>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.utils.data as tud
from accelerate import Accelerator

import minato

N = 40


def batches(cls: type, **options: object) -> tuple[object, list[list[int]]]:
    accelerator = Accelerator(cpu=True)
    loader = cls(
        list(range(N)),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(3),
        **options,
    )
    prepared = accelerator.prepare(loader)
    return prepared, [batch.tolist() for batch in prepared]


def main() -> None:
    out = Path(sys.argv[1])
    prepared, minato_batches = batches(minato.DataLoader, on_error="skip")
    _, torch_batches = batches(tud.DataLoader)
    accelerator = Accelerator(cpu=True)
    record = {
        "rank": accelerator.process_index,
        "minato": isinstance(prepared, minato.DataLoader),
        "on_error": prepared.on_error,
        "minato_batches": minato_batches,
        "torch_batches": torch_batches,
    }
    (out / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
