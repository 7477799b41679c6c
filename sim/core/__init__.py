"""The serving core: the SimPy engine, its arrivals, the scheduler, metrics, and the Protocols it asks of
allocators and cost models. It knows nothing of scenarios, sweeps, reports or the CLI."""
