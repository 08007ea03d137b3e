"""The training process's side: the iterator torch's DataLoader hands out,
the engine's start, the collate stage, delivery to the device, resume state
and stats. Imports everything below it; ``minato.dataloader`` imports it."""
