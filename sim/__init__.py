"""kvsim's simulator package: engine, scheduler, cost model, metrics, results, sweeps, reports, CLI."""
