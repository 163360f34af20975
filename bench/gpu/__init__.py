"""The GPU check (check.sh): the agent's and the checkpoint's CUDA paths on a machine with a GPU."""
