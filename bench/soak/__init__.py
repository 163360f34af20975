"""The randomised combined-fault soak (``python -m bench.soak``): schedule, faults, witness, invariants."""
