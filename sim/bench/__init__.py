"""Whole-server fidelity: replay measured `vllm bench serve` runs and fit the server-level terms.

`results_file` reads a `vllm bench serve --save-result` JSON, `replay` pushes exactly its requests
through the simulator with the same arrival process and compares, `fit` fits the server-level
coefficients of `sim.cost.server` with leave-one-file-out error. See docs/cost_model.md "Whole server".
"""
