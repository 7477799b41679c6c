"""Capacity planning (max rate under an SLO, concurrency, GPUs needed) and static waste estimates."""
