"""``python -m bench``: the list of benchmarks, one line each; ``python -m bench NAME [options]``: one of them,
after the machine header (:mod:`bench.suite`).
"""

from __future__ import annotations

import sys

from bench.suite import listing, run


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
