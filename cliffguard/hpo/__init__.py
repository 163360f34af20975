"""``cliffguard hpo``: Bayesian search (Optuna TPE + median pruning) over validation-loss windows."""
