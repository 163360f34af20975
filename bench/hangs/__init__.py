"""``python -m bench.hangs``: each hang kind on a multi-process CPU run, detected, named and restarted
by cliffguard, against torchrun's restart-everything behaviour (bench/hangs/__main__.py)."""
