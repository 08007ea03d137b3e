"""Worker processes take a dataset's large arrays from the memory their fork
server inherited, where the training process has not changed them since
(minato._process.inherit, issue 31): no second copy in shared memory, and
never a stale array. Each case runs in a fresh interpreter, whose first
loader forks the fork server."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

PRELUDE = """
import os
import numpy as np, torch, torch.utils.data as tud
import minato
from minato._process import inherit, ipc

class Rows(tud.Dataset):
    def __init__(self):
        self.data = np.arange(1 << 20, dtype=np.int64).reshape(-1, 512)  # 8 MiB
        self.labels = torch.arange(len(self.data)).repeat_interleave(256)  # 8 MiB
    def __len__(self):
        return len(self.data)
    def __getitem__(self, index):
        return int(self.data[index, 0]), int(self.labels[index * 256])

def firsts(loader):
    return [value for rows, _ in loader for value in rows.tolist()]

dataset = Rows()
loader = shared_server_loader(dataset, batch_size=64, num_workers=2)
"""


# Auto, started on processes by an earlier loader's decision and kept off
# the forks at each engine's start: its workers come from the shared fork
# server, forked as the loader is built, which holds the arrays registered
# then, as when auto moves within an epoch. (Workers forked with their
# dataset as each epoch starts have nothing to take or copy.)
SHARED_SERVER = """
import minato as _minato
from minato._process import method as _method

def shared_server_loader(dataset, **options):
    _method.DECIDED_PROCESSES_FORKED_AT_START = False
    _method._decided_for[type(dataset)] = (True, "auto: decided for the test", True)
    return _minato.DataLoader(dataset, **options)
"""


def run(body: str, prelude: str = PRELUDE) -> str:
    result = subprocess.run(
        [sys.executable, "-c", SHARED_SERVER + prelude + body],
        capture_output=True,
        text=True,
        timeout=100,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_unchanged_arrays_are_taken_from_the_fork_servers_memory() -> None:
    out = run("""
assert inherit.key_of(dataset.data) is not None
assert inherit.key_of(dataset.labels) is not None
payload = ipc.dumps(dataset, inherit=True)
assert not payload.fds and len(payload.data) < 10_000, (len(payload.fds), len(payload.data))
assert firsts(loader) == [int(row[0]) for row in dataset.data]
print("ok")
""")
    assert out.strip() == "ok"


def test_an_array_changed_in_place_since_goes_with_its_changed_pages() -> None:
    out = run("""
dataset.data[100, 0] = -7  # after the fork server was forked: one page of 2,048
dataset.labels[5 * 256] = -5  # and one of the tensor's
assert inherit.key_of(dataset.data) is None and inherit.key_of(dataset.labels) is None
payload = ipc.dumps(dataset, inherit=True)
# Neither copied: each goes as its key and its changed page's bytes.
assert not payload.fds and len(payload.data) < 20_000, (len(payload.fds), len(payload.data))
got = firsts(loader)
assert got[100] == -7 and got[101] == 100 * 512 + 512  # what the workers see is what the loop has
assert [int(labels) for _, batch in loader for labels in batch][5] == -5
assert dataset.data[100, 0] == -7  # the loop's own array untouched by the workers' patch
print("ok")
""")
    assert out.strip() == "ok"


def test_an_array_mostly_changed_since_is_copied() -> None:
    out = run("""
dataset.data += 1  # in place, every page
payload = ipc.dumps(dataset, inherit=True)
assert len(payload.fds) == 1  # the array, in shared memory; the tensor inherited
assert firsts(loader) == [int(row[0]) for row in dataset.data]
print("ok")
""")
    assert out.strip() == "ok"


def test_a_read_only_array_with_a_changed_page_is_copied() -> None:
    frozen = """
import numpy as np, torch.utils.data as tud
import minato
from minato._process import inherit, ipc

class Frozen(tud.Dataset):
    def __init__(self, base):
        self.frozen = base[:]  # a read-only view of a writable array
        self.frozen.flags.writeable = False
    def __len__(self):
        return 4
    def __getitem__(self, index):
        return int(self.frozen[index * 1000])

base = np.arange(1 << 18, dtype=np.int64)  # 2 MiB
dataset = Frozen(base)
loader = shared_server_loader(dataset, batch_size=4, num_workers=2)
"""
    out = run(
        """
base[1000] = -1  # one page, under the read-only view: the worker could not patch it
assert inherit.reduction_of(dataset.frozen) is None
assert [int(x) for batch in loader for x in batch] == [0, -1, 2000, 3000]
print("ok")
""",
        frozen,
    )
    assert out.strip() == "ok"


def test_an_array_in_shared_memory_with_a_changed_page_is_never_patched() -> None:
    out = run("""
buffer = ipc.SharedBuffer(1 << 21)  # 2 MiB of shared memory, no page touched yet
shared = buffer.tensor.view(torch.int64)
import mmap
anonymous = mmap.mmap(-1, 1 << 21, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
private = np.frombuffer(anonymous, dtype=np.int64)  # private, no page touched yet

class Both(tud.Dataset):
    def __init__(self):
        self.shared, self.private = shared, private
    def __len__(self):
        return 4
    def __getitem__(self, index):
        return int(self.shared[index * 1000]) + int(self.private[index * 1000])

inherit.register(Both())
inherit._count_fork()  # as if the fork server were forked now, after registering
inherit.server_forked()
shared[1000] = 7  # one page each, this process's alone
private[1000] = 7
assert len(inherit._changed_pages(*inherit._memory_of(shared))) == 1
assert inherit.reduction_of(private)[0] is inherit.inherited_patched
# A patch would be written into memory every process mapping it shares.
assert inherit.reduction_of(shared) is None
print("ok")
""")
    assert out.strip() == "ok"


def test_after_another_fork_nothing_is_taken_from_inherited_memory() -> None:
    out = run("""
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
assert inherit.key_of(dataset.data) is None and inherit.key_of(dataset.labels) is None
assert firsts(loader) == [int(row[0]) for row in dataset.data]
print("ok")
""")
    assert out.strip() == "ok"


def test_arrays_made_after_the_fork_server_are_copied() -> None:
    out = run("""
dataset.data = dataset.data + 1  # a new array, which the fork server never had
later = shared_server_loader(dataset, batch_size=64, num_workers=2)
assert inherit.key_of(dataset.data) is None
assert firsts(later) == [int(row[0]) + 0 for row in dataset.data]
print("ok")
""")
    assert out.strip() == "ok"


def test_an_array_of_objects_is_never_taken_from_inherited_memory() -> None:
    boxes = """
import numpy as np, torch.utils.data as tud
import minato
from minato._process import inherit

class Boxes(tud.Dataset):
    def __init__(self):
        self.boxes = np.empty(200_000, dtype=object)  # 1.6 MB of references to lists
        self.boxes[:] = [[i] for i in range(len(self.boxes))]
    def __len__(self):
        return 8
    def __getitem__(self, index):
        return self.boxes[index][0]

dataset = Boxes()
loader = shared_server_loader(dataset, batch_size=4, num_workers=2)
"""
    out = run(
        """
dataset.boxes[3][0] = -3  # an item changed in place, the array's own memory untouched
assert inherit.key_of(dataset.boxes) is None
assert [int(x) for batch in loader for x in batch] == [0, 1, 2, -3, 4, 5, 6, 7]
print("ok")
""",
        boxes,
    )
    assert out.strip() == "ok"


NAMES = """
import numpy as np, torch.utils.data as tud
import minato
from minato._process import inherit, ipc

# A column of strings as pandas 2 holds it: 1.6 MB of references.
base = np.array([f"image{i}.jpg" for i in range(200_100)], dtype=object)

class Names(tud.Dataset):
    def __init__(self, names):
        self.names = names
    def __len__(self):
        return 8
    def __getitem__(self, index):
        return self.names[index * 1000]

dataset = Names(NAMES)
loader = shared_server_loader(dataset, batch_size=4, num_workers=2)
"""


def test_an_array_of_strings_is_taken_from_inherited_memory_unless_changed() -> None:
    out = run(
        """
payload = ipc.dumps(dataset, inherit=True)
assert inherit.reduction_of(dataset.names)[0] is inherit.inherited and len(payload.data) < 10_000
assert [name for batch in loader for name in batch] == [f"image{i * 1000}.jpg" for i in range(8)]
dataset.names[1000] = "changed.jpg"  # a new object, which the fork server never had
assert inherit.key_of(dataset.names) is None and inherit.reduction_of(dataset.names) is None
assert [name for batch in loader for name in batch][1] == "changed.jpg"
print("ok")
""",
        NAMES.replace("NAMES", "base.copy()"),
    )
    assert out.strip() == "ok"


def test_an_array_of_strings_whose_edge_page_changed_beside_it_is_still_inherited() -> None:
    out = run(
        """
base[0] = base[-1] = "beside.jpg"  # written on its edge pages, not in it
assert inherit.key_of(dataset.names) is None  # pages changed...
assert inherit.reduction_of(dataset.names)[0] is inherit.inherited  # ...but not its references
assert [name for batch in loader for name in batch][1] == "image1050.jpg"
base[50] = "first.jpg"  # now in it
assert inherit.reduction_of(dataset.names) is None
assert [name for batch in loader for name in batch][0] == "first.jpg"
print("ok")
""",
        # Its first and last pages shared with the rest of base.
        NAMES.replace("NAMES", "base[50:-50]"),
    )
    assert out.strip() == "ok"


def test_the_registry_does_not_keep_arrays_alive() -> None:
    out = run("""
import gc, weakref
assert inherit.key_of(dataset.data) is not None
gone = weakref.ref(dataset.data)
del loader
dataset.data = None
gc.collect()
assert gone() is None and not any(ref() is None for ref, _ in inherit._registry.values())
print("ok")
""")
    assert out.strip() == "ok"


def test_a_list_of_bytes_is_inherited_unless_its_items_changed() -> None:
    imports = "import torch.utils.data as tud\nimport minato\nfrom minato._process import ipc\n"
    out = run(
        """
class Blobs(tud.Dataset):
    def __init__(self):
        self.images = [bytes([i]) * 100_000 for i in range(40)]  # 4 MB in all
        self.names = tuple(f"image{i}.jpg" for i in range(40))
    def __len__(self):
        return len(self.images)
    def __getitem__(self, index):
        return self.images[index][0], len(self.images[index])

blobs = Blobs()
blob_loader = shared_server_loader(blobs, batch_size=4, num_workers=2)
assert len(ipc.dumps(blobs, inherit=True).data) < 10_000  # the list went by reference
# What the loader sends: each worker's copy of the dataset, holding the same lists.
from minato._thread.dataset import worker_dataset
assert len(ipc.dumps(worker_dataset(blobs), inherit=True).data) < 10_000
payload = iter(blob_loader)._processes.spec_payload()
assert not payload.fds and len(payload.data) < 10_000, (len(payload.fds), len(payload.data))
blobs.images[3] = b"changed"  # after the fork server was forked
assert len(ipc.dumps(blobs, inherit=True).data) > 3_000_000  # pickled, as before
firsts, lengths = zip(*[(f, n) for a, b in blob_loader for f, n in zip(a.tolist(), b.tolist())])
assert firsts[3] == ord("c") and lengths[3] == 7 and lengths[4] == 100_000
print("ok")
""",
        prelude=imports,
    )
    assert out.strip() == "ok"


def test_sending_a_list_leaves_its_items_shared_with_the_fork_server() -> None:
    # Walking the list in Python (to check its items are the ones the fork
    # server has) would write each item's reference count: the kernel would
    # copy every page holding an item into the training process, and the
    # list would be held twice (benchmarks/file_names.py).
    imports = "import struct\nimport torch.utils.data as tud\nimport minato\n"
    out = run(
        """
class Blobs(tud.Dataset):
    def __init__(self):
        self.images = [bytes([i % 251]) * 12_000 for i in range(2000)]  # 24 MB, 3 pages each
        self.names = tuple(f"image{i}.jpg" for i in range(2000))
    def __len__(self):
        return len(self.images)
    def __getitem__(self, index):
        return self.images[index][0], len(self.names[index])

blobs = Blobs()
headers = [id(image) for image in blobs.images]  # read before the fork server is forked
loader = shared_server_loader(blobs, batch_size=50, num_workers=2)
firsts = [first for batch, _ in loader for first in batch.tolist()]
assert firsts == [i % 251 for i in range(2000)]

def exclusive(address):
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(address // 4096 * 8)
        (entry,) = struct.unpack("<Q", pagemap.read(8))
    return bool(entry >> 63) and bool(entry >> 56 & 1)  # present, mapped here alone

# Only the first few, which the workers' copy of the dataset looks at for
# datasets it wraps (minato._thread.dataset.SCAN_LIMIT).
copied = sum(map(exclusive, headers))
assert copied <= len(headers) // 10, f"{copied} of {len(headers)} items' pages copied"
print("ok")
""",
        prelude=imports,
    )
    assert out.strip() == "ok"


def test_auto_forks_the_server_as_it_moves_and_its_workers_inherit_the_list() -> None:
    # Auto forks the fork server only once its measurements point to
    # processes, while its threads load: the dataset's list must be
    # registered before that fork, and the workers' spec pickled after it.
    imports = "import torch.utils.data as tud\nimport minato\nfrom minato._process import workers\n"
    out = run(
        """
from minato._process.method import WorkerMethod

def point_to_processes(self, figures, can_trial=True):
    return self._decide(True, "auto: told to, by the test")

WorkerMethod.observe = point_to_processes

class Blobs(tud.Dataset):
    def __init__(self):
        self.images = [bytes([i % 251]) * 50_000 for i in range(400)]  # 20 MB in all
    def __len__(self):
        return len(self.images)
    def __getitem__(self, index):
        return self.images[index][0], len(self.images[index])

blobs = Blobs()
loader = minato.DataLoader(blobs, batch_size=4, num_workers=2)
assert not workers._zygote_running()  # not at construction: auto is still measuring
iterator = iter(loader)
seen, payload = [], None
for first, length in iterator:
    seen += first.tolist()
    assert length.tolist() == [50_000] * len(length)
    if payload is None and loader.stats().worker_method == "multiprocessing":
        payload = iterator._processes.spec_payload()  # what its workers were sent
assert sorted(seen) == sorted(i % 251 for i in range(400))
assert payload is not None, loader.stats().worker_method_reason
assert not payload.fds and len(payload.data) < 10_000, (len(payload.fds), len(payload.data))
print("ok")
""",
        prelude=imports,
    )
    assert out.strip() == "ok"


@pytest.mark.parametrize(
    "items",
    [
        [],
        [b"ab", "h\u00e9llo"],
        (b"abc", "d"),
        [1, 2.0, True, None],
        [b"a", 1],
        [("a", 1), ("b", 2)],
        [()],
        [("a", [1])],
        [("a", 1), "b"],
        [(1, (2,))],
        [object()],
        [bytearray(b"x")],
    ],
)
def test_scalar_lists_are_sized_as_pythons_loops_would(items: object) -> None:
    import itertools

    from minato._process.inherit import _list_bytes

    scalars = {bytes, str, int, float, bool, type(None)}
    kinds = set(map(type, items))  # type: ignore[call-overload]
    if not kinds <= scalars | {tuple}:
        expected = -1
    elif tuple in kinds:
        inner = set(map(type, itertools.chain.from_iterable(items)))  # type: ignore[call-overload]
        expected = 8 * len(items) if kinds == {tuple} and inner <= scalars else -1  # type: ignore[arg-type]
    elif kinds <= {bytes, str}:
        expected = sum(map(len, items))  # type: ignore[call-overload]
    else:
        expected = 8 * len(items)  # type: ignore[arg-type]
    assert _list_bytes(items) == expected


FRAME = """
import os
import pandas, pyarrow, torch, torch.utils.data as tud
import minato
from minato._process import inherit, ipc

class Table(tud.Dataset):
    # A frame as pandas 3 holds one read from a CSV: its strings in pyarrow's
    # buffers (here in two chunks), its numbers in a numpy block.
    def __init__(self):
        names = [f"/data/train/class{i % 100}/image{i}.jpg" for i in range(200_000)]
        column = pyarrow.chunked_array([names[:120_000], names[120_000:]])
        self.frame = pandas.DataFrame({
            "path": pandas.arrays.ArrowStringArray(column),
            "label": [i % 100 for i in range(200_000)],
        })
    def __len__(self):
        return 256
    def __getitem__(self, index):
        row = self.frame.iloc[index * 700]
        return row["path"], int(row["label"])

def rows(loader):
    return [(path, int(label)) for paths, labels in loader for path, label in zip(paths, labels)]

dataset = Table()
loader = shared_server_loader(dataset, batch_size=32, num_workers=2)
expected = rows(tud.DataLoader(dataset, batch_size=32))
"""


def test_a_frames_pyarrow_column_is_read_in_place_from_the_fork_servers_memory() -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out = run(
        """
payload = ipc.dumps(dataset, inherit=True)
# The column's 8.5 MB went neither into the pickle nor into shared memory
# (the labels' 1.6 MB may have: their heap pages may have changed since).
shared = sum(os.fstat(fd).st_size for fd in payload.fds)
assert shared < 2_000_000 and len(payload.data) < 20_000, (shared, len(payload.data))
assert rows(loader) == expected
# Pickled uncombined: the workers' column has the loop's two chunks.
received = ipc.loads(payload.data, [os.dup(fd) for fd in payload.fds])
assert received.frame["path"].array._pa_array.num_chunks == 2
print("ok")
""",
        FRAME,
    )
    assert out.strip() == "ok"


def test_a_column_replaced_after_the_fork_server_is_copied() -> None:
    pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out = run(
        """
dataset.frame["path"] = dataset.frame["path"].str.upper()  # pyarrow memory of its own
expected = rows(tud.DataLoader(dataset, batch_size=32))
assert expected[1][0].startswith("/DATA/")
assert ipc.dumps(dataset, inherit=True).fds  # the new column, in shared memory
assert rows(loader) == expected
print("ok")
""",
        FRAME,
    )
    assert out.strip() == "ok"
