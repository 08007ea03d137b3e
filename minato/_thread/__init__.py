"""What makes a worker thread act like one of torch's worker processes:
its own generators, intra-op thread count, signal dispositions,
``get_worker_info()`` and copy of the dataset, and the training process's
output kept its own. Imports only ``minato._util``."""
