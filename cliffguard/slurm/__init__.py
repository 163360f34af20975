"""A one-machine Slurm cluster (cluster.py), the priority classes (classes.py) and the sbatch
wrapper with its queue view (jobs.py): ``cliffguard slurm``, ``cliffguard submit``, ``cliffguard queue``."""
