"""The step-time model, in parts that can each be checked against measurements.

`model.CostModel` prices a step as engine overhead + linear layers + TP all-reduce + attention / KV
reads; `linear`, `network`, `overhead` and `parts` hold those parts and where their coefficients
come from; `fit`, `profiles` and `validate` fit them to measured operator times and report the error
(`kvsim cost validate`). `server` holds the server-level terms around the steps (front end, achieved
FLOP rate, exposed overhead, serving stack) that `kvsim bench fit` fits to whole measured runs. See
docs/cost_model.md.
"""
