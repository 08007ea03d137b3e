"""minato: a thread-based, drop-in replacement for ``torch.utils.data.DataLoader``.

Swap one import::

    from minato import DataLoader

and the loader's workers become threads run by a Rust engine instead of
processes: no start-up cost, no copied memory, no inter-process transfer.
"""

from minato._loader.stats import LoaderStats, PoolResize
from minato._task.failures import SampleFailure, TooManyFailures
from minato._thread.torch_threads import install as _install_thread_support
from minato.dataloader import DataLoader
from minato.installer import install, uninstall

_install_thread_support()

__all__ = [
    "DataLoader",
    "LoaderStats",
    "PoolResize",
    "SampleFailure",
    "TooManyFailures",
    "install",
    "uninstall",
]
__version__ = "0.1.0"
