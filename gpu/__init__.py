"""kvsim's GPU side: CuPy microkernels, their float64 NumPy reference, timing, fitting, profiles, replay.

Importing `gpu` needs only NumPy; CuPy is imported lazily by the parts that launch kernels
(see gpu/backend.py). See docs/calibration.md.
"""
