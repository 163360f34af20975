"""``cliffguard keys generate --out DIR``: a fresh command key pair and agent secret.

Writes ``command_ed25519.key`` (the controller's private key, PEM, 0600),
``command_ed25519.pub`` (the public key trainers verify with) and ``agent.secret`` (0600, what
every run's event key derives from; the controller, the ``cliffguard train`` launcher and a
trainer that is its own launcher hold it). Nothing is overwritten and no key is printed: only
the public key's fingerprint and, per role, the settings to use with absolute paths.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("keys", help="generate the Ed25519 command key pair and the agent secret")
    p.add_argument("action", choices=["generate"], help="generate: write a new key pair and agent secret")
    p.add_argument("--out", required=True, help="directory to write the keys into (created 0700)")
    return p


def roles(paths: dict[str, Path]) -> list[tuple[str, str]]:
    """(role, what it sets) for every process of a deployment, the key files by absolute path."""
    from cliffguard.core.deployment import AGENT_SECRET_ENV, EVENT_KEY_ENV, PRIVATE_KEY_ENV, PUBLIC_KEY_ENV

    private, public, secret = (f"{k}={paths[p].resolve()}" for k, p in (
        (f"{PRIVATE_KEY_ENV}_FILE", "private"), (f"{PUBLIC_KEY_ENV}_FILE", "public"),
        (f"{AGENT_SECRET_ENV}_FILE", "agent_secret")))
    return [
        ("controller", f"{private} {secret}"),
        ("launcher (cliffguard train)", f"{public} {secret}"),
        ("a trainer that is its own launcher (plain loop, Accelerate, Hugging Face, Lightning; every rank)",
         f"{public} {secret}"),
        ("workers of cliffguard train", f"nothing: the launcher hands each the public key and its run's {EVENT_KEY_ENV}"),
        ("dashboard, broker, cliffguard command", "no key (operator requests go unsigned to the controller)"),
    ]


def run(args: argparse.Namespace) -> int:
    from cliffguard.core.keys import fingerprint, generate_keys, read_public_file

    try:
        paths = generate_keys(args.out)
    except (FileExistsError, OSError) as exc:
        print(f"cliffguard keys: {exc}", file=sys.stderr)
        return 2
    print(f"public key {fingerprint(read_public_file(paths['public']))}")
    print("what each process sets (a trainer without the agent secret or its run's key sends events the "
          "controller refuses):")
    for role, settings in roles(paths):
        print(f"  {role}:\n    {settings}")
    return 0
