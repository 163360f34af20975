"""``cliffguard keys generate --out DIR``: a fresh command key pair and agent secret.

Writes ``command_ed25519.key`` (the controller's private key, PEM, 0600),
``command_ed25519.pub`` (the public key trainers verify with) and ``agent.secret`` (0600, what
every run's event key derives from; the controller and the ``cliffguard train`` launcher hold it).
Nothing is overwritten and no key is printed: only paths, the settings to use and the public
key's fingerprint.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("keys", help="generate the Ed25519 command key pair and the agent secret")
    p.add_argument("action", choices=["generate"], help="generate: write a new key pair and agent secret")
    p.add_argument("--out", required=True, help="directory to write the keys into (created 0700)")
    return p


def run(args: argparse.Namespace) -> int:
    from cliffguard.core.deployment import AGENT_SECRET_ENV, PRIVATE_KEY_ENV, PUBLIC_KEY_ENV
    from cliffguard.core.keys import fingerprint, generate_keys, read_public_file

    try:
        paths = generate_keys(args.out)
    except (FileExistsError, OSError) as exc:
        print(f"cliffguard keys: {exc}", file=sys.stderr)
        return 2
    print(f"public key {fingerprint(read_public_file(paths['public']))}")
    print(f"controller: {PRIVATE_KEY_ENV}_FILE={paths['private']} {AGENT_SECRET_ENV}_FILE={paths['agent_secret']}")
    print(f"trainers:   {PUBLIC_KEY_ENV}_FILE={paths['public']} (launcher: also {AGENT_SECRET_ENV}_FILE)")
    return 0
