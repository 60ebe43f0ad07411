"""`python -m bench.crash novel|sidecar|regression [options]`: one part of the crash harness.

Each part runs a real job uninterrupted, then again killed (its whole process group, SIGKILL)
at seeded random moments and resumed, and compares the results byte for byte; it prints the
LLM calls the crashes cost beyond the uninterrupted run's and exits non-zero on any difference.
`python -m bench.crash PART --help` lists a part's options.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

PARTS = ("novel", "sidecar", "regression")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in PARTS:
        print(
            __doc__.strip(),
            file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout,
        )
        if args and args[0] not in ("-h", "--help"):
            print(
                f"bench.crash: unknown part {args[0]!r}; choose one of {', '.join(PARTS)}",
                file=sys.stderr,
            )
            return 2
        return 0 if args else 2
    part = importlib.import_module(f"bench.crash.{args[0]}")
    return int(part.main(args[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
