"""Small training scripts for ``cliffguard demo --trainer hf|lightning``: the demo's scenario (the
bundled trainer's corpus, schedule and faults) run by another library's trainer, through cliffguard's
integration for it. One process each; Kafka and the command secret come from the environment the
demo sets (``CLIFFGUARD_KAFKA__*``, ``CLIFFGUARD_COMMAND_SECRET``)."""
