"""How many session copies move when a member joins: rendezvous placement measured.

    python3 scripts/repl/placement_moves.py [--ids 100000] [--members 3] [--copies 2]

Ranks every client id over N members and over N+1, and prints the fraction of copies
(top `copies` places) that the change moved (ideal: 1 / (N+1), all of them to the
newcomer, none between old members).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from replication.placement import ranked  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=100_000)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--copies", type=int, default=2)
    args = parser.parse_args()
    old = [f"node-{i}" for i in range(1, args.members + 1)]
    new = old + [f"node-{args.members + 1}"]
    moved = between_old = 0
    for i in range(args.ids):
        cid = f"client-{i}"
        before = set(ranked(cid, old)[:args.copies])
        after = set(ranked(cid, new)[:args.copies])
        gained = after - before
        moved += len(gained)
        between_old += len(gained - {new[-1]})
    total = args.ids * args.copies
    print(f"{args.ids} ids, {args.copies} copies, {args.members} -> {args.members + 1} members: "
          f"{moved} of {total} copies moved ({moved / total:.4f}; ideal {1 / (args.members + 1):.4f}), "
          f"{between_old} between old members")


if __name__ == "__main__":
    main()
