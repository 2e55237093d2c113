"""Limits learned from Discord's headers against retry-on-429, and which
Ed25519 library verifies interactions.  Measured, not guessed.

    python bench/discord_learned.py [--verify-only]

1. The ``discord`` bench section (``fastdispatch.bench.discord``): the same
   2,000 messages over 100 channels to a FakeDiscordServer with Discord's
   limits scaled down, through fastdispatch with learned limits and through
   a thread pool that only retries on 429; prints 429s met, invalid
   requests spent, channels out of order and wall time over the minimum the
   limits allow.  The table in docs/discord.md comes from this script.
2. The cost of one Ed25519 verify (an interaction's signature, 1 KiB body)
   with ``cryptography`` and with PyNaCl, whichever are installed: the
   measurement behind interactions_app's choice of ``cryptography``.
"""

import argparse
import os
import sys
import timeit


def verify_costs(body_size=1024, number=2000, rounds=7):
    """{library: microseconds per verify} for the installed libraries; the
    libraries take turns, round after round (a busy machine slows both), and
    each keeps its best round."""
    message = b"1700000000" + os.urandom(body_size)
    calls = {}
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        key = Ed25519PrivateKey.generate()
        public, signature = key.public_key(), key.sign(message)
        calls["cryptography"] = lambda: public.verify(signature, message)
    except ImportError:
        pass
    try:
        from nacl.signing import SigningKey
        nkey = SigningKey.generate()
        verify_key, nsignature = nkey.verify_key, nkey.sign(message).signature
        calls["pynacl"] = lambda: verify_key.verify(message, nsignature)
    except ImportError:
        pass
    best = {}
    for _ in range(rounds):
        for name, call in calls.items():
            us = timeit.timeit(call, number=number) / number * 1e6
            best[name] = min(best.get(name, us), us)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verify-only", action="store_true",
                        help="only the Ed25519 verify costs")
    args = parser.parse_args(argv)
    for library, us in sorted(verify_costs().items()):
        print("Ed25519 verify, 1 KiB body, %-12s %6.1f us" % (library + ":", us))
    if args.verify_only:
        return 0
    from fastdispatch.bench import discord
    from fastdispatch.bench.report import format_table
    figures = discord.measure(progress=lambda m: sys.stderr.write(m + "\n"))
    print(format_table(discord.HEADER, discord.rows(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
