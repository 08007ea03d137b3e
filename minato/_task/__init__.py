"""What runs a task (a sample, a run of samples, or a whole batch), the same
on a worker thread and in a worker process: the fetchers, failures and
their records, each sample's seed. Imports ``minato._thread`` and below."""
