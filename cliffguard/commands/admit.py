"""``cliffguard admit``: the launcher's admission check for a launcher that is not ``cliffguard train``
(an own ``torchrun`` line, an sbatch script): read the controller's suspect-node list and say
whether this node may join, and on which of its device slots.

    eval "$(cliffguard admit --nproc 8 --shell)" || exit $?    # before torchrun, in the job script
    torchrun --nproc_per_node "$CLIFFGUARD_NPROC" ... train.py

- Refused (the node is suspect, or every slot is): the line ``cliffguard train`` prints, exit 77.
- Admitted: exit 0; ``--shell`` prints ``export`` lines: ``CLIFFGUARD_NPROC`` (the slots kept),
  ``CLIFFGUARD_DEVICE_SLOTS`` and ``CUDA_VISIBLE_DEVICES`` narrowed to them, for ``eval``.
- Unchecked (no broker, a read past ``--timeout-s``, no key to verify the list): exit 0 on every
  slot, said loudly on stderr (fail-open, as ``cliffguard train``: monitoring must not stop training).

The node is ``--node-id``, else ``CLIFFGUARD_NODE_ID``, else the host name; the list is verified with
the deployment's command key (``CLIFFGUARD_COMMAND_PUBLIC_KEY_FILE``, or the HMAC secret).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from cliffguard.commands.controller import add_common, resolve_common

SHELL_NPROC = "CLIFFGUARD_NPROC"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("admit", help="may this node join a run, and on which device slots? (for an own launcher)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=1, help="processes (device slots) this node would start (default 1)")
    p.add_argument("--node-id", help="this node's id (default CLIFFGUARD_NODE_ID, else the host name)")
    p.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT[,...] (default [kafka] bootstrap)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="the list's read may take this long (default 5)")
    p.add_argument("--shell", action="store_true", help="print export lines for eval (the slots kept)")
    add_common(p)
    return p


def run(args: argparse.Namespace) -> int:
    from cliffguard import admission
    from cliffguard.commands.train import slot_env
    from cliffguard.config import ConfigError
    from cliffguard.core.admission import REFUSED_EXIT, devices_line
    from cliffguard.core.restart_plan import node_id

    if args.nproc < 1 or args.timeout_s <= 0:
        print("cliffguard admit: --nproc must be >= 1 and --timeout-s > 0", file=sys.stderr)
        return 2
    try:
        resolved = resolve_common(args, ["kafka"])
    except ConfigError as exc:
        print(f"cliffguard admit: {exc}", file=sys.stderr)
        return 2
    node = args.node_id or node_id(os.environ)
    found = admission.check(resolved["kafka"], node, resolved.deployment.verifying_key(), args.timeout_s)
    for line in found.lines:
        print(line.replace("cliffguard train:", "cliffguard admit:", 1), file=sys.stderr, flush=True)
    if found.refused:
        return REFUSED_EXIT
    slots = tuple(range(args.nproc))
    slots = found.kept_slots(slots)
    if found.verdict is not None and found.verdict.devices_out:
        print(devices_line(found.verdict, slots).replace("cliffguard train:", "cliffguard admit:", 1),
              file=sys.stderr, flush=True)
        if not slots:
            return REFUSED_EXIT
    env = {SHELL_NPROC: str(len(slots)), **slot_env(slots, os.environ)}
    if args.shell:
        for name, value in env.items():
            print(f"export {name}={shlex.quote(value)}")
    else:
        state = "UNCHECKED (fail-open)" if found.verdict is None else "admitted"
        print(f"node {node} {state}: {len(slots)} process(es) on device slot(s) {', '.join(map(str, slots))}")
    return 0
