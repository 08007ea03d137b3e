"""Worker processes: the fork server, the worker process's loop, the wire
between them and the training process, and the choice between threads and
processes. Imports ``minato._task`` and below."""
