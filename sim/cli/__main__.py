"""`python -m sim.cli ...` runs the `kvsim` command."""

from sim.cli.app import main

main()
