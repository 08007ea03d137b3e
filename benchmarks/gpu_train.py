"""ResNet-50 training steps fed six ways, side by side in one run (needs a GPU).

(a) headspace: one fixed synthetic batch already on the GPU — the most the
    model can consume (SPDL's headspace analysis);
(b) torch's DataLoader: PIL decode + torchvision Resize, num_workers = CPU
    cores, pin_memory=True, batches moved with .to(device, non_blocking=True);
(c) minato: minato.io decode + resize, device="cuda" (pinned collate, copies
    on a side stream);
(d) minato with (b)'s program unchanged but for the import: the PIL pipeline,
    the same arguments, minato's defaults for everything else (the common
    case, where Python workers may share the GIL with the training loop);
(d+) (d) with worker_method="multiprocessing" (minato's worker processes,
    not its automatic choice);
(d=) (d) on a fixed pool of num_workers threads (adaptive=False,
    worker_method="thread"): what the adaptive pool's growth costs;
(e), (f) torch's DataLoader (pin_memory) and minato (device="cuda") on images
    decoded ahead: the loader's own work alone, the GPU the bottleneck.

Each loader is also read alone (no model: batches moved to the GPU and
dropped) to tell whether its CPU side could feed (a)'s rate at all.
``--trace PATH`` profiles (c)'s and (f)'s steady state with torch.profiler,
writes the Chrome traces (gzipped) and prints what they show of the copies'
streams. ``--ab-thread-limit`` adds (c) and (d) with worker threads left on
the process's intra-op thread count (minato before it gave each one thread).

All on generated JPEGs (300-900 px, resized to 224x224), bf16 autocast,
channels_last, SGD. Prints images/s and mean GPU utilisation (NVML through
torch.cuda.utilization, else nvidia-smi) for each.

    python benchmarks/gpu_train.py [--images 2048] [--steps 100] [--batch 128] [--trace t.json.gz]
    python benchmarks/gpu_train.py --only b d d+     # (a) always runs
    python benchmarks/gpu_train.py --device cpu --model resnet18 --images 64 --steps 3 --batch 8
        (a smoke run of the script itself on a machine without a GPU)
"""

from __future__ import annotations

import argparse
import functools
import gzip
import io
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.utils.data as tud
import torchvision
from jpegs import generate_jpegs
from PIL import Image
from torchvision import transforms

import minato
import minato.io

SIZE = (224, 224)


class PilImages(tud.Dataset):
    def __init__(self, images: list[bytes]) -> None:
        self.images = images
        self.resize = transforms.Resize(SIZE, antialias=True)
        self.to_tensor = transforms.PILToTensor()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = Image.open(io.BytesIO(self.images[i])).convert("RGB")
        return self.to_tensor(self.resize(image)), i % 1000


class MinatoImages(tud.Dataset):
    def __init__(self, images: list[bytes]) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        pixels = minato.io.decode_image(self.images[i], size=SIZE)  # HWC uint8
        return torch.from_numpy(pixels).permute(2, 0, 1), i % 1000


class DecodedImages(tud.Dataset):
    """Images decoded ahead (uint8 CHW), so that the CPU side is the loader's
    own work alone: the GPU can be the bottleneck."""

    def __init__(self, images: list[bytes], distinct: int = 256) -> None:
        self.count = len(images)
        self.pixels = [
            torch.from_numpy(minato.io.decode_image(data, size=SIZE)).permute(2, 0, 1).contiguous()
            for data in images[:distinct]
        ]

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.pixels[i % len(self.pixels)], i % 1000


def without_thread_limit() -> None:
    """minato as it was before worker threads got one intra-op thread each."""
    import minato._loader.collate_stage
    import minato._task.runner

    minato._task.runner.limit_thread_intra_op = lambda nthreads=1: False
    minato._loader.collate_stage.limit_thread_intra_op = lambda nthreads=1: False


class Utilisation:
    """Samples GPU utilisation (%) every 100 ms while running."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self.device))
        except Exception:
            pass
        try:
            index = self.device.index or 0
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.split()
            return float(out[index])
        except Exception:
            return None

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            value = self._read()
            if value is not None:
                self.samples.append(value)

    def __enter__(self) -> Utilisation:
        if self.device.type == "cuda":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


def batches_forever(loader: Iterable) -> Iterator:
    while True:
        yield from loader


def generate_in_parallel(count: int, jobs: int) -> list[bytes]:
    """generate_jpegs' images, made by ``jobs`` processes (chunk k seeded k)."""
    jobs = max(1, min(jobs, count // 64 or 1))
    chunks = [count // jobs + (k < count % jobs) for k in range(jobs)]
    if jobs == 1:
        return generate_jpegs(count)
    with ProcessPoolExecutor(jobs) as pool:
        parts = pool.map(generate_jpegs, chunks, range(jobs))
        return [image for part in parts for image in part]


def data_alone(loader: Iterable, batches: int, batch: int, device: torch.device) -> float:
    """images/s of the loader read with no model: each batch moved and dropped."""
    source = batches_forever(loader)
    for _ in range(3):  # workers started, first batches out of the way
        next(source)
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(source)
        images.to(device, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return batches * batch / (time.perf_counter() - start)


def make_step(
    model: torch.nn.Module, batches: Iterator, device: torch.device
) -> Callable[[], None]:
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step() -> None:
        images, labels = next(batches)
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        images = ((images.float() - mean) / std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    return step


def train(
    model: torch.nn.Module,
    batches: Iterator,
    steps: int,
    warmup: int,
    batch: int,
    device: torch.device,
) -> tuple[float, float | None]:
    step = make_step(model, batches, device)
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with Utilisation(device) as utilisation:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    return steps * batch / elapsed, utilisation.mean()


def overlap(span: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    """How much of ``span`` the (sorted, possibly overlapping) ``spans`` cover."""
    covered, cursor = 0.0, span[0]
    for begin, end in spans:
        if end <= cursor:
            continue
        if begin >= span[1]:
            break
        begin = max(begin, cursor)
        end = min(end, span[1])
        if end > begin:
            covered += end - begin
            cursor = end
    return covered


def describe_trace(events: list[dict]) -> None:
    """What the profile shows of the host-to-device copies and the streams."""
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    if not kernels or not copies:
        print(f"  trace: {len(kernels)} kernels, {len(copies)} HtoD copies: nothing to compare")
        return
    by_stream: dict[int, list[dict]] = {}
    for kernel in kernels:
        by_stream.setdefault(kernel["args"]["stream"], []).append(kernel)
    compute_stream = max(by_stream, key=lambda stream: len(by_stream[stream]))
    copy_streams = sorted({copy["args"]["stream"] for copy in copies})
    compute = sorted((e["ts"], e["ts"] + e["dur"]) for e in by_stream[compute_stream])
    big = [c for c in copies if c["args"].get("bytes", 0) >= 1 << 20]
    copy_time = sum(c["dur"] for c in big)
    overlapped = sum(overlap((c["ts"], c["ts"] + c["dur"]), compute) for c in big)
    print(
        f"  trace: {len(kernels)} kernels on streams {sorted(by_stream)} "
        f"(training stream {compute_stream}: {len(compute)}); "
        f"{len(copies)} HtoD copies on streams {copy_streams}"
    )
    print(
        f"  batch-sized HtoD copies (>= 1 MiB): {len(big)}, {copy_time / 1e3:.2f} ms in all, "
        f"{overlapped / max(copy_time, 1e-9):.1%} of it while the training stream ran a kernel; "
        f"on the training stream: {sum(c['args']['stream'] == compute_stream for c in big)}"
    )
    # Idle gaps of the training stream, and whether each ends as a copy ends
    # (the stream waiting for a batch) or not (waiting for the CPU to launch).
    window = (compute[0][0], compute[-1][1])
    gaps = []
    for (_, end), (begin, _) in zip(compute, compute[1:], strict=False):
        if begin - end > 50:
            gaps.append((end, begin))
    idle = sum(end - begin for begin, end in gaps)
    copy_ends = sorted(c["ts"] + c["dur"] for c in big)
    waits = [gap for gap in gaps if any(abs(gap[1] - end) < 30 for end in copy_ends)]
    print(
        f"  training stream: busy {1 - idle / (window[1] - window[0]):.1%} of "
        f"{(window[1] - window[0]) / 1e3:.1f} ms; {len(gaps)} gaps > 50 us "
        f"({idle / 1e3:.2f} ms), of which {len(waits)} end within 30 us of a copy's end "
        f"({sum(e - b for b, e in waits) / 1e3:.2f} ms)"
    )
    waits_for_events = [
        e for e in events if e.get("cat") == "cuda_runtime" and "StreamWaitEvent" in e["name"]
    ]
    print(f"  cudaStreamWaitEvent calls in the window: {len(waits_for_events)}")


def profile(step: Callable[[], None], steps: int, path: str) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=2, warmup=2, active=steps),
    ) as profiler:
        for _ in range(steps + 4):
            step()
            profiler.step()
    torch.cuda.synchronize()
    plain = path[:-3] if path.endswith(".gz") else path
    profiler.export_chrome_trace(plain)
    with open(plain, "rb") as trace:
        events = json.load(trace)["traceEvents"]
    if plain != path:
        with open(plain, "rb") as source, gzip.open(path, "wb") as target:
            target.write(source.read())
        os.remove(plain)
    try:
        describe_trace(events)
    except (KeyError, TypeError, ValueError) as error:  # the trace's format changed
        print(f"  trace: could not be read ({error!r}); see the file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--alone-batches", type=int, default=30)
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="ROW",
        help="run only these rows (letters: a b c d d+ d= e f); (a) always runs",
    )
    parser.add_argument("--trace", help="profile (c) and (f) and write their Chrome traces here")
    parser.add_argument(
        "--ab-thread-limit",
        action="store_true",
        help="also run (c) and (d) with worker threads on the process's intra-op threads",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    images = generate_in_parallel(args.images, os.cpu_count() or 1)
    print(
        f"# gpu_train: {args.model}, bf16, channels_last, batch {args.batch}, "
        f"{args.steps} steps after {args.warmup}; {len(images)} JPEGs -> {SIZE}; "
        f"{args.workers} CPU workers; torch {torch.__version__}, torchvision "
        f"{torchvision.__version__}, minato {minato.__version__}; "
        + (torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"),
        flush=True,
    )

    def fresh_model() -> torch.nn.Module:
        torch.manual_seed(0)
        model = getattr(torchvision.models, args.model)(num_classes=1000)
        return model.to(device, memory_format=torch.channels_last).train()

    fixed = (
        torch.randint(0, 256, (args.batch, 3, *SIZE), dtype=torch.uint8, device=device),
        torch.randint(0, 1000, (args.batch,), device=device),
    )

    def repeat_fixed() -> Iterator:
        while True:
            yield fixed

    # (b) and (d) are one program; only the DataLoader class differs.
    def pil_loader(loader_class: type) -> tud.DataLoader:
        return loader_class(
            PilImages(images),
            batch_size=args.batch,
            shuffle=True,
            num_workers=args.workers,
            pin_memory=device.type == "cuda",
            persistent_workers=True,
            drop_last=True,
        )

    def minato_io_loader() -> minato.DataLoader:
        return minato.DataLoader(
            MinatoImages(images),
            batch_size=args.batch,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=True,
            drop_last=True,
            device=device if device.type == "cuda" else None,
        )

    decoded = DecodedImages(images)

    def decoded_loader(loader_class: type, **options: object) -> tud.DataLoader:
        return loader_class(
            decoded,
            batch_size=args.batch,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=True,
            drop_last=True,
            **options,
        )

    cuda = device.type == "cuda"
    loaders: dict[str, Callable[[], tud.DataLoader]] = {
        "(b) torch DataLoader + PIL": lambda: pil_loader(tud.DataLoader),
        "(c) minato + minato.io, device=cuda": minato_io_loader,
        "(d) minato + PIL, torch's arguments": lambda: pil_loader(minato.DataLoader),
        "(d+) (d), worker_method='multiprocessing'": lambda: pil_loader(
            functools.partial(minato.DataLoader, worker_method="multiprocessing")
        ),
        # (d) on a fixed pool of num_workers threads: what the adaptive
        # pool's growth past the cores costs (issue 33).
        "(d=) (d), adaptive=False, worker_method='thread'": lambda: pil_loader(
            functools.partial(minato.DataLoader, adaptive=False, worker_method="thread")
        ),
        "(e) torch, decoded ahead, pin_memory": lambda: decoded_loader(
            tud.DataLoader, pin_memory=cuda
        ),
        "(f) minato, decoded ahead, device=cuda": lambda: decoded_loader(
            minato.DataLoader, device=device if cuda else None
        ),
    }
    common = dict(batch=args.batch, device=device, steps=args.steps, warmup=args.warmup)
    results: dict[str, tuple[float, float | None, float | None]] = {}
    rate, utilisation = train(fresh_model(), repeat_fixed(), **common)
    results["(a) fixed batch on the GPU"] = (rate, utilisation, None)
    print(f"  (a) {rate:.1f} images/s", flush=True)
    stats = {}

    def run(name: str, build: Callable[[], tud.DataLoader]) -> None:
        loader = build()
        alone = data_alone(loader, args.alone_batches, args.batch, device)
        rate, utilisation = train(fresh_model(), batches_forever(loader), **common)
        results[name] = (rate, utilisation, alone)
        print(f"  {name.split()[0]} {rate:.1f} images/s (alone {alone:.1f})", flush=True)
        if isinstance(loader, minato.DataLoader):
            stats[name.split()[0]] = loader.stats()

    for name, build in loaders.items():
        if args.only is None or name[1 : name.index(")")] in args.only:
            run(name, build)
    if args.ab_thread_limit:
        without_thread_limit()
        run(
            "(c-) (c), threads on the process's intra-op",
            loaders["(c) minato + minato.io, device=cuda"],
        )
        run(
            "(d-) (d), threads on the process's intra-op",
            loaders["(d) minato + PIL, torch's arguments"],
        )
    best = results["(a) fixed batch on the GPU"][0]
    print()
    for name, (rate, utilisation, alone) in results.items():
        gpu = "n/a" if utilisation is None else f"{utilisation:5.1f}%"
        data = "" if alone is None else f"  data alone {alone:8.1f} images/s"
        print(f"  {name:<40} {rate:8.1f} images/s  {rate / best:6.1%} of (a)  GPU util {gpu}{data}")
    for label, loader_stats in stats.items():
        print(f"\n{label} stats:\n{loader_stats}")
        # The adaptive controller's changes, each with why and its window:
        # the pool's path to where it ended.
        for resize in loader_stats.resizes[:24]:
            print(f"    {resize}")
    if args.trace and cuda and args.only is None:
        for name in (
            "(c) minato + minato.io, device=cuda",
            "(f) minato, decoded ahead, device=cuda",
        ):
            path = args.trace.replace(".json", f"_{name[1]}.json")
            print(f"\n# torch.profiler trace of {name}, 8 steady steps -> {path}")
            step = make_step(fresh_model(), batches_forever(loaders[name]()), device)
            for _ in range(args.warmup):
                step()
            profile(step, 8, path)


if __name__ == "__main__":
    main()
