"""The training loop's torch.compile'd code draws random numbers as it does
without minato: minato's per-worker-thread generators (minato/_thread/
generators.py) replace the ``random`` and ``numpy.random`` module functions,
and torch.compile must still trace them as torch's own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

PROGRAM = textwrap.dedent(
    """
    import json, random, sys, warnings
    import numpy as np
    import torch
    if sys.argv[1] == "minato":
        import minato
    import torch._dynamo

    warnings.simplefilter("ignore")
    cases = {
        "random.random": lambda x: x * random.random(),
        "random.randint": lambda x: x * random.randint(1, 9),
        "random.uniform": lambda x: x * random.uniform(1, 2),
        "random.randrange": lambda x: x * random.randrange(1, 9),
        "random.shuffle": lambda x: (lambda l: (random.shuffle(l), x * l[0])[1])([1, 2, 3, 4]),
        "np.random.rand": lambda x: x * torch.from_numpy(np.random.rand(3)),
        "np.random.normal": lambda x: x + torch.as_tensor(np.random.normal(size=3)),
    }
    results = {}
    for name, function in cases.items():
        torch._dynamo.reset()
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        compiled = torch.compile(function, backend="eager", fullgraph=True)
        try:
            drawn = [compiled(torch.ones(3)).tolist() for _ in range(3)]
            after = [random.random(), float(np.random.rand()), torch.rand(1).item()]
            results[name] = [drawn, after]
        except Exception as error:
            results[name] = type(error).__name__
    print(json.dumps(results))
    """
)


def _run(which: str, where: Path) -> dict[str, object]:
    # Run elsewhere than the checkout: the installed minato, not its source.
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, which],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=200,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_compiled_code_draws_as_it_does_without_minato(tmp_path: Path) -> None:
    """fullgraph=True compiles the same functions, which draw the same numbers
    and leave the generators where torch's leave them."""
    without, with_minato = _run("torch", tmp_path), _run("minato", tmp_path)
    assert with_minato == without
    assert not any(isinstance(result, str) for result in without.values())
