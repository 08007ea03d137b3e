"""The process exits as torch's does while workers are still inside the dataset's code.

Each scenario runs as its own script, once with torch's DataLoader and once
with minato's: same exit code, every atexit handler run, buffered output
flushed, no abort, and soon after the script ends (a worker stuck in a
sample is not waited for)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# A generous bound: torch takes about a second here, and a run that waits
# for the stuck samples takes a minute.
PROMPT_EXIT_S = 8.0

SCRIPT = textwrap.dedent("""
    import atexit, json, os, signal, sys, threading, time

    LOADER, WORK, ENDING, MARKERS = sys.argv[1:5]
    OPTIONS = json.loads(sys.argv[5])
    LOADERS = OPTIONS.pop("loaders", 1)

    # Registered before minato's own exit hook, so it runs after it.
    atexit.register(lambda: print("atexit registered first"))

    import numpy as np
    import torch
    import torch.utils.data as tud

    if LOADER == "minato":
        from minato import DataLoader
    else:
        from torch.utils.data import DataLoader

    atexit.register(lambda: print("atexit registered last"))


    class Stuck(tud.Dataset):
        # Every sample is stuck for a minute, in the kind of work WORK names.
        def __init__(self, loader):
            # Two loaders' worker threads share a process id and may draw the
            # same index: the marker names the loader too.
            self.loader = loader

        def __len__(self):
            return 64

        def __getitem__(self, index):
            open(os.path.join(MARKERS, f"{os.getpid()}-{self.loader}-{index}"), "w").close()
            end = time.monotonic() + 60
            if WORK == "sleep":
                time.sleep(60)
            elif WORK == "torch":  # ops that release the GIL, in C++
                a = torch.rand(200, 200)
                while time.monotonic() < end:
                    a = (a @ a).tanh()
            elif WORK == "numpy":
                a = np.random.rand(200, 200)
                while time.monotonic() < end:
                    a = np.tanh(a @ a)
            else:  # Python code holding the GIL
                while time.monotonic() < end:
                    sum(range(1000))
            return index


    its = [iter(DataLoader(Stuck(n), num_workers=2, **OPTIONS)) for n in range(LOADERS)]
    deadline = time.monotonic() + 60
    while len(os.listdir(MARKERS)) < 2 * LOADERS:
        if time.monotonic() > deadline:
            print("the workers never started their samples", flush=True)
            os._exit(99)
        time.sleep(0.02)
    print("ending at", time.monotonic(), flush=True)
    # Not flushed: the exit must flush it.
    print("script output")

    if ENDING == "exit3":
        sys.exit(3)
    elif ENDING == "raise":
        raise RuntimeError("unhandled")
    elif ENDING == "keyboard_interrupt":
        raise KeyboardInterrupt
    elif ENDING == "ctrl_c_handled":
        main = threading.main_thread().ident
        threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT)).start()
        try:
            next(its[0])  # every sample is stuck: waits until Ctrl-C
        except KeyboardInterrupt:
            print("Ctrl-C handled")
""")


@dataclass
class Exit:
    returncode: int
    stdout: str
    stderr: str
    # From the script's last statement to the end of the process.
    exit_s: float


def run_script(tmp_path: Path, loader: str, work: str, ending: str, options: str) -> Exit:
    markers = tmp_path / f"{loader}-markers"
    markers.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    # From elsewhere, so that the installed package is imported, not the source folder.
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, loader, work, ending, str(markers), options],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
        env=env,
    )
    ended = time.monotonic()
    started = [line for line in done.stdout.splitlines() if line.startswith("ending at ")]
    exit_s = ended - float(started[0].split()[-1]) if started else float("inf")
    return Exit(done.returncode, done.stdout, done.stderr, exit_s)


ENDINGS = ["end", "exit3", "raise", "keyboard_interrupt", "ctrl_c_handled"]
# An unhandled KeyboardInterrupt ends the process with SIGINT: as torch's, whatever it is.
EXPECTED_CODE = {"end": 0, "exit3": 3, "raise": 1, "ctrl_c_handled": 0}


def check_exit(tmp_path: Path, work: str, ending: str, options: str = "{}") -> None:
    """Runs the scenario with torch, then minato; `options` (JSON) go to both loaders."""
    torch_exit = run_script(tmp_path, "torch", work, ending, options)
    minato_exit = run_script(tmp_path, "minato", work, ending, options)
    report = f"stdout:\n{minato_exit.stdout}\nstderr:\n{minato_exit.stderr}"
    assert "the workers never started" not in torch_exit.stdout + minato_exit.stdout
    assert minato_exit.returncode == torch_exit.returncode, report
    if ending in EXPECTED_CODE:
        assert minato_exit.returncode == EXPECTED_CODE[ending], report
    for text in ("FATAL", "Abort", "terminate called", "Fatal Python error"):
        assert text not in minato_exit.stderr, report
    lines = minato_exit.stdout.splitlines()
    for line in ("script output", "atexit registered last", "atexit registered first"):
        assert line in lines, report
    if ending == "ctrl_c_handled":
        assert "Ctrl-C handled" in lines, report
    assert minato_exit.exit_s < PROMPT_EXIT_S, report


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ending", ENDINGS)
def test_exit_while_workers_run_torch_ops(tmp_path: Path, ending: str) -> None:
    # torch re-takes the GIL in C++ that must not be unwound.
    check_exit(tmp_path, "torch", ending)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("work", ["sleep", "numpy", "python"])
def test_exit_while_workers_are_stuck(tmp_path: Path, work: str) -> None:
    check_exit(tmp_path, work, "end")


@pytest.mark.timeout(240)
def test_exit_with_sample_level_and_persistent_loaders_stuck(tmp_path: Path) -> None:
    # shuffle=True builds batches from single samples (minato's sample engine).
    options = '{"shuffle": true, "persistent_workers": true, "loaders": 2}'
    check_exit(tmp_path, "numpy", "exit3", options)


DECODING_SCRIPT = textwrap.dedent("""
    import atexit, io, threading
    import numpy as np
    from PIL import Image
    import minato.io

    atexit.register(lambda: print("atexit ran"))
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (1000, 1000, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")
    png = buffer.getvalue()
    decoded = threading.Event()

    def decode_forever():
        while True:
            minato.io.decode_image(png)  # in Rust, without the GIL, most of the time
            decoded.set()

    threading.Thread(target=decode_forever, daemon=True).start()
    decoded.wait(60)
    print("script output")
""")


@pytest.mark.timeout(120)
def test_exit_while_a_daemon_thread_runs_minato_code(tmp_path: Path) -> None:
    # Not a worker: a thread of the user's that needs the GIL back in
    # minato's Rust frames once the interpreter finalizes.
    done = subprocess.run(
        [sys.executable, "-c", DECODING_SCRIPT],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    assert done.stdout.splitlines() == ["script output", "atexit ran"], report
    assert done.stderr == "", report
