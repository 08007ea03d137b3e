"""Process-wide random generators, made per worker thread.

A torch worker *process* has its own ``random``, numpy and torch global
generators: torch seeds them with the worker's seed, and whatever the dataset
or ``worker_init_fn`` does with them (torch's ``seed_worker`` recipe, a
``torch.manual_seed`` call, ``random.random()`` in an augmentation) stays in
that worker. Threads share one set with each other and with the training loop.
This module gives each minato worker thread its own, seeded as torch seeds a
worker process's, so the same program computes the same kind of data:

- ``random``: the module's functions (``random.random``, ``random.seed``, ...)
  are bound methods of one hidden ``random.Random``; they are replaced by
  functions that use the calling worker thread's ``random.Random`` and the
  hidden one everywhere else.
- numpy's legacy ``numpy.random.*`` functions, likewise, with a per-thread
  ``RandomState``.
- torch: ``torch.initial_seed``, ``manual_seed``, ``seed``, ``get_rng_state``
  and ``set_rng_state`` use the thread's ``torch.Generator`` (the one
  ``torch.thread_safe_generator()`` returns) in a worker thread; their code is
  swapped in place, so every alias of them changes too. torch's default CPU
  generator itself is one C++ object: a worker thread's random functions
  (``torch.rand``, ``Tensor.uniform_``, ...) get the thread's generator
  through a thread-local ``TorchFunctionMode`` (:class:`ThreadGenerator`),
  active only while a worker runs the dataset's code. The few random
  functions that take no generator (dropout and rrelu) cannot be redirected:
  the first use in a worker warns once.

Outside worker threads every function behaves exactly as before. Names bound
before minato was imported (``from random import shuffle``) keep the shared
generator.
"""

from __future__ import annotations

import contextlib
import random
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.random
from torch.overrides import TorchFunctionMode
from torch.utils.data._utils import worker as _torch_worker

from minato._util.fork import ForkSafeLock
from minato._util.warn_once import warn_once


class ThreadGenerators:
    """One worker thread's stand-ins for the process-wide generators.

    Where each sample gets draws of its own (minato._task.seed), the
    worker hands over each task's `SampleRun` with :meth:`begin_run`, and a
    generator is seeded for the sample being loaded the first time it is
    reached for in it (through the module functions, torch's random
    functions, ``WorkerInfo.rng`` or ``torch.thread_safe_generator()``): a
    sample that draws nothing costs nothing."""

    def __init__(
        self,
        random_generator: random.Random,
        numpy_state: Any,
        torch_generator: Any,
        initial_seed: int | None = None,
    ):
        self._random = random_generator
        self._numpy = numpy_state  # a numpy.random.RandomState, or None without numpy
        self._torch = torch_generator
        # What torch.initial_seed() answers: the worker's seed, or the last
        # one the worker's own code set (per-sample seeding leaves it).
        self.initial_seed = initial_seed
        # WorkerInfo.rng, where the thread is a worker (a SampleRNG).
        self.worker_rng: Any = None
        self._run: Any = None  # a minato._task.seed.SampleRun, or None
        # The sample of the run each generator was last seeded for.
        self._random_at = self._numpy_at = self._torch_at = -1

    def begin_run(self, run: Any) -> None:
        """The task's `SampleRun` (None: the worker keeps its own streams)."""
        self._run = run
        self._random_at = self._numpy_at = self._torch_at = -1

    @property
    def random(self) -> random.Random:
        run = self._run
        if run is not None and run.at != self._random_at:
            self._random_at = run.at
            self._random.seed(run.seed())
        return self._random

    @property
    def numpy(self) -> Any:
        run = self._run
        if run is not None and run.at != self._numpy_at and self._numpy is not None:
            self._numpy_at = run.at
            self._numpy.seed(run.seed() & 0xFFFF_FFFF)
        return self._numpy

    @property
    def torch(self) -> Any:
        run = self._run
        if run is not None and run.at != self._torch_at:
            self._torch_at = run.at
            self._torch.manual_seed(run.seed())
        return self._torch


class SampleRNG:
    """``WorkerInfo.rng`` in a worker thread: torch's ``_RNG`` fields, the
    random and torch generators seeded for the sample first (see
    :class:`ThreadGenerators`); numpy's ``Generator`` keeps the worker's
    stream."""

    __slots__ = ("_generators", "numpy_generator")

    def __init__(self, generators: ThreadGenerators, numpy_generator: Any) -> None:
        self._generators = generators
        self.numpy_generator = numpy_generator

    @property
    def random_generator(self) -> random.Random:
        return self._generators.random

    @property
    def torch_generator(self) -> Any:
        return self._generators.torch


# In a worker process: what torch.initial_seed() answers there (as in a
# worker thread above); None in any other process.
_process_initial_seed: list[int | None] = [None]


def set_process_initial_seed(seed: int) -> None:
    """In a worker process: torch.initial_seed() answers `seed` until the
    worker's own code seeds torch (minato._process.child)."""
    _process_initial_seed[0] = seed


def _recorded_initial_seed() -> int | None:
    generators = _thread.generators
    if generators is not None:
        return generators.initial_seed
    return _process_initial_seed[0]


def _record_seed(seed: int) -> None:
    """The worker's own code seeded torch: torch.initial_seed() says so."""
    generators = _thread.generators
    if generators is not None:
        generators.initial_seed = seed
    elif _process_initial_seed[0] is not None:
        _process_initial_seed[0] = seed


class _ThreadState(threading.local):
    # A class default: a thread without generators finds None without the
    # AttributeError a missing attribute costs on every call.
    generators: ThreadGenerators | None = None


_thread = _ThreadState()


def bind_thread(generators: ThreadGenerators | None) -> None:
    """Make the calling thread's process-wide generators `generators` (None: the shared ones)."""
    _thread.generators = generators


@contextlib.contextmanager
def bound_to(generators: ThreadGenerators) -> Iterator[None]:
    """The calling thread's process-wide generators are `generators` within,
    and whatever they were before after."""
    before = _thread.generators
    bind_thread(generators)
    try:
        yield
    finally:
        bind_thread(before)


def _thread_torch_generator() -> Any:
    generators = _thread.generators
    return None if generators is None else generators.torch


# ---------------------------------------------------------------- random and numpy


def _dispatching(
    shared_method: Callable[..., Any],
    name: str,
    pick: Callable[[ThreadGenerators], Any],
    shared: Any,
) -> Any:
    """`shared_method`, or in a worker thread the method `name` of the thread's own generator."""
    compiling = torch.compiler.is_compiling

    def method(*args: Any, **kwargs: Any) -> Any:
        generators = _thread.generators
        if generators is not None:
            return getattr(pick(generators), name)(*args, **kwargs)
        if compiling():
            # torch.compile tracing the training loop's code: the shared
            # generator, reached as a method of its object, which dynamo
            # models as it models torch's own random.random; the pre-bound
            # builtin it refuses (fullgraph=True would fail).
            return getattr(shared, name)(*args, **kwargs)
        return shared_method(*args, **kwargs)

    method.__name__ = name
    method.__qualname__ = name
    method.__doc__ = shared_method.__doc__
    module = getattr(shared_method, "__module__", None)
    if isinstance(module, str):
        # As functools.wraps does. torch.compile finds numpy's functions by
        # their module, and traces them as torch ops: ours too, then.
        method.__module__ = module
    method.__wrapped__ = shared_method  # type: ignore[attr-defined]
    method._minato_dispatching = True  # type: ignore[attr-defined]
    return method


def _patch_module_functions(
    modules: list[types.ModuleType],
    shared: Any,
    pick: Callable[[ThreadGenerators], Any],
    aliases: dict[str, str] | None = None,
) -> None:
    """Replace each module attribute that is a bound method of `shared`, and
    each function named in `aliases` (module function -> the method it calls)."""
    aliases = aliases or {}
    for module in modules:
        for name, value in list(vars(module).items()):
            if getattr(value, "_minato_dispatching", False):
                continue
            if getattr(value, "__self__", None) is shared and callable(value):
                setattr(module, name, _dispatching(value, name, pick, shared))
            elif name in aliases and callable(value):
                setattr(module, name, _dispatching(value, aliases[name], pick, shared))


def _install_random() -> None:
    shared = getattr(random, "_inst", None)
    if not isinstance(shared, random.Random):
        _cannot_isolate("the random module (random._inst is gone)")
        return
    _patch_module_functions([random], shared, lambda generators: generators.random)


def _install_numpy() -> None:
    try:
        import numpy.random
        import numpy.random.mtrand
    except ImportError:  # pragma: no cover - numpy is a dependency
        return
    shared = getattr(numpy.random.mtrand, "_rand", None)
    if not isinstance(shared, numpy.random.RandomState):
        _cannot_isolate("numpy.random's legacy functions (numpy.random.mtrand._rand is gone)")
        return

    def pick(generators: ThreadGenerators) -> Any:
        return shared if generators.numpy is None else generators.numpy

    # Module functions of numpy's, not bound methods, that act on the shared state.
    aliases = {"seed": "seed", "sample": "random_sample", "ranf": "random_sample"}
    _patch_module_functions([numpy.random, numpy.random.mtrand], shared, pick, aliases)


# ---------------------------------------------------------------- torch's seeding functions
#
# Compiled here, run with torch.random's globals: the hook installed there
# as `_minato_thread_generator`, and torch's own function, kept as
# `_minato_torch_<name>`, for every other thread.
# ruff: noqa: F821


def _per_thread_initial_seed() -> int:  # pragma: no cover - runs as torch's code
    recorded = _minato_initial_seed()
    if recorded is not None:
        return recorded
    generator = _minato_thread_generator()
    if generator is not None:
        return generator.initial_seed()
    return _minato_torch_initial_seed()


def _per_thread_manual_seed(seed):  # pragma: no cover - runs as torch's code
    generator = _minato_thread_generator()
    if generator is not None:
        # The worker's own generator only: the training loop's CUDA
        # generators are not the worker's to reseed.
        seeded = generator.manual_seed(int(seed))
        _minato_record_seed(int(seed))
        return seeded
    seeded = _minato_torch_manual_seed(seed)
    _minato_record_seed(int(seed))
    return seeded


def _per_thread_seed() -> int:  # pragma: no cover - runs as torch's code
    generator = _minato_thread_generator()
    if generator is not None:
        seed = generator.seed()
    else:
        seed = _minato_torch_seed()
    _minato_record_seed(seed)
    return seed


def _per_thread_get_rng_state():  # pragma: no cover - runs as torch's code
    generator = _minato_thread_generator()
    if generator is not None:
        return generator.get_state()
    return _minato_torch_get_rng_state()


def _per_thread_set_rng_state(new_state):  # pragma: no cover - runs as torch's code
    generator = _minato_thread_generator()
    if generator is not None:
        return generator.set_state(new_state)
    return _minato_torch_set_rng_state(new_state)


_TORCH_SEEDING = {
    "initial_seed": _per_thread_initial_seed,
    "manual_seed": _per_thread_manual_seed,
    "seed": _per_thread_seed,
    "get_rng_state": _per_thread_get_rng_state,
    "set_rng_state": _per_thread_set_rng_state,
}
# What torch's versions act on: a torch whose function no longer uses the
# default generator this way has changed it, and it is left alone, said so.
_TORCH_DEFAULT_GENERATOR_NAMES = {"default_generator", "_manual_seed_impl"}


def _install_torch_seeding() -> None:
    module_globals = vars(torch.random)
    module_globals["_minato_thread_generator"] = _thread_torch_generator
    module_globals["_minato_initial_seed"] = _recorded_initial_seed
    module_globals["_minato_record_seed"] = _record_seed
    for name, replacement in _TORCH_SEEDING.items():
        function = module_globals.get(name)
        code = getattr(function, "__code__", None)
        if not isinstance(function, types.FunctionType) or code is None:
            _cannot_isolate(f"torch.{name} (not found in torch.random)")
            continue
        if code is replacement.__code__:
            continue  # installed already
        if not _TORCH_DEFAULT_GENERATOR_NAMES & set(code.co_names) or code.co_freevars:
            _cannot_isolate(f"torch.{name} (this torch's version is not the one minato knows)")
            continue
        # torch's own code, as a function of its own, for the other threads.
        module_globals[f"_minato_torch_{name}"] = types.FunctionType(
            code, module_globals, name, function.__defaults__
        )
        # Swapping the code keeps the function object: torch.manual_seed,
        # torch.random.manual_seed and names users imported all change.
        function.__code__ = replacement.__code__


# ---------------------------------------------------------------- torch's random functions


def _random_functions() -> frozenset[Any]:
    """torch's functions and Tensor methods that draw from a generator they accept."""
    torch_names = [
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "normal",
        "bernoulli",
        "multinomial",
        "poisson",
        "binomial",
        "_standard_gamma",
        "_sample_dirichlet",
    ]
    tensor_names = [
        "uniform_",
        "normal_",
        "random_",
        "exponential_",
        "cauchy_",
        "log_normal_",
        "geometric_",
        "bernoulli_",
        "bernoulli",
        "multinomial",
    ]
    found = [getattr(torch, name, None) for name in torch_names]
    found += [getattr(torch.Tensor, name, None) for name in tensor_names]
    return frozenset(f for f in found if f is not None and "generator" in (f.__doc__ or ""))


def _unredirectable_functions() -> dict[Any, str]:
    """Random functions that take no generator: they draw from the shared one."""
    import torch.nn.functional as F

    names = {
        F.dropout: "torch.nn.functional.dropout",
        F.dropout1d: "torch.nn.functional.dropout1d",
        F.dropout2d: "torch.nn.functional.dropout2d",
        F.dropout3d: "torch.nn.functional.dropout3d",
        F.alpha_dropout: "torch.nn.functional.alpha_dropout",
        F.feature_alpha_dropout: "torch.nn.functional.feature_alpha_dropout",
        F.rrelu: "torch.nn.functional.rrelu",
        torch.dropout: "torch.dropout",
        torch.rrelu: "torch.rrelu",
    }
    return {function: name for function, name in names.items() if function is not None}


_RANDOM_FUNCTIONS: frozenset[Any] = frozenset()
_UNREDIRECTABLE: dict[Any, str] = {}


def _cannot_isolate(what: str) -> None:
    warn_once(
        what,
        f"minato: {what}: worker threads share it with each other and with the "
        "training loop, where torch's worker processes each have their own.",
        stacklevel=2,
    )


def _on_cpu(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call makes or fills CPU tensors only (the thread's generator is a CPU one)."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device).type == "cpu"
    for value in args:
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return False
    return torch.get_default_device().type == "cpu"


class ThreadGenerator(TorchFunctionMode):
    """While active on a worker thread: torch's random functions called
    without a generator use the thread's own, as torch's default generator
    would be that worker process's own."""

    def __init__(self, generators: ThreadGenerators) -> None:
        super().__init__()
        self.generators = generators

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        # Every torch call of the worker's comes through here: keep the
        # common path (not a random function) short.
        if func in _RANDOM_FUNCTIONS:
            kwargs = dict(kwargs) if kwargs else {}
            if kwargs.get("generator") is None and _on_cpu(args, kwargs):
                kwargs["generator"] = self.generators.torch
            return func(*args, **kwargs)
        if func in _UNREDIRECTABLE:
            name = _UNREDIRECTABLE[func]
            warn_once(
                name,
                f"minato: {name} in a worker thread draws from torch's global "
                "generator, which worker threads share with the training loop "
                "(a worker process would have its own). Pass "
                "generator=torch.thread_safe_generator() (torch >= 2.15; before, "
                "torch.utils.data.get_worker_info().rng.torch_generator) to a function "
                "that takes one (e.g. torch.rand(...) < p instead of dropout), or draw "
                "in the training loop.",
                stacklevel=2,
            )
        return func(*args, **kwargs) if kwargs else func(*args)


def thread_generators(base_seed: int, worker_id: int, torch_generator: Any, random_generator: Any):
    """The generators a worker process would have, for worker `worker_id`: torch's
    ``random.seed(seed)``, ``torch.manual_seed(seed)`` and numpy's legacy seed."""
    numpy_state = None
    try:
        import numpy as np
        from torch.utils.data._utils.worker import _generate_state

        numpy_state = np.random.RandomState(_generate_state(base_seed, worker_id))
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return ThreadGenerators(random_generator, numpy_state, torch_generator, base_seed + worker_id)


_installed = False
_install_lock = ForkSafeLock()


def install() -> None:
    """Make the process-wide generators per worker thread. Idempotent."""
    global _installed, _RANDOM_FUNCTIONS, _UNREDIRECTABLE
    with _install_lock:
        if _installed:
            return
        _installed = True
        _RANDOM_FUNCTIONS = _random_functions()
        _UNREDIRECTABLE = _unredirectable_functions()
        _install_random()
        _install_numpy()
        _install_torch_seeding()


def _thread_rng(base_seed: int, worker_id: int) -> Any:
    """Per-thread generators, seeded as torch seeds a worker process's globals."""
    seed = base_seed + worker_id
    generator = torch.Generator()
    generator.manual_seed(seed)
    numpy_generator = None
    try:
        import numpy as np

        numpy_generator = np.random.default_rng(_torch_worker._generate_state(base_seed, worker_id))
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    rng_type = getattr(_torch_worker, "_RNG", None)
    fields = dict(
        random_generator=random.Random(seed),
        torch_generator=generator,
        numpy_generator=numpy_generator,
    )
    return rng_type(**fields) if rng_type is not None else types.SimpleNamespace(**fields)


def worker_rng_generators(base_seed: int, worker_id: int) -> ThreadGenerators:
    """The process-wide generators worker `worker_id`'s process would have
    (see this module), bound to no thread yet."""
    rng = _thread_rng(base_seed, worker_id)
    generators = thread_generators(base_seed, worker_id, rng.torch_generator, rng.random_generator)
    generators.worker_rng = SampleRNG(generators, rng.numpy_generator)
    return generators


def bind_thread_rng(base_seed: int, worker_id: int) -> ThreadGenerators:
    """Makes the calling thread's process-wide generators those worker
    `worker_id`'s process would have (see this module); returns
    them."""
    generators = worker_rng_generators(base_seed, worker_id)
    bind_thread(generators)
    return generators
