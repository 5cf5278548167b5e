"""
The instructions one tracing hook costs with tracing off, on the broker's interpreter, for
bench/tracing_cost.sh: ``if self.spans is not None:`` on an object whose ``spans`` is None, as
producing and consuming hold it. Run under callgrind twice per variant (COUNT calls, and none);
the difference per call between the hooked and the bare method is the hook's cost, free of the
machine's noise and of the broker's batching (the end-to-end A/B carries both).

usage: python bench/hook_cost.py hooked|bare COUNT
"""

import sys


class Producing:
    def __init__(self) -> None:
        self.spans: object | None = None
        self.count = 0

    def hooked(self) -> None:
        self.count += 1
        if self.spans is not None:
            self.count -= 1

    def bare(self) -> None:
        self.count += 1


def main() -> None:
    variant, count = sys.argv[1], int(sys.argv[2])
    producing = Producing()
    call = producing.hooked if variant == 'hooked' else producing.bare
    for _ in range(count):
        call()
    assert producing.count == count


if __name__ == '__main__':
    main()
