"""Small utilities every other part of minato may use: fork-safe locks,
warn-once, the logger, worker priority. Imports nothing else of minato."""
