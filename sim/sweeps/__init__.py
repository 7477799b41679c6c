"""Batch work: sweep specs (grids of scenarios), the resumable runner and the local / Dask executors."""
