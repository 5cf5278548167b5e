"""
Remove the broker's tracing hooks from a copy of its source tree, for bench/tracing_cost.sh: the
tree it leaves is the same code with the tracing code absent, so that an A/B of it against the
tree as it is (tracing off) measures what the hooks cost a message and nothing else. A build of
an older commit differs by every change made since, not only by tracing.

A hook is an ``if self.spans is not None:`` statement (producing, consuming, the broker's stop);
each is cut out by its line range, with ``pass`` left where it was a block's only statement.
Every other line stays as it is. Prints how many hooks it removed per file, and fails when it
finds none (the hooks have moved, and the A/B would compare a tree with itself).

usage: python bench/strip_tracing.py BROKER_SOURCE_ROOT     (a copy: its files are rewritten)
"""

import ast
import sys
from pathlib import Path


def is_hook(node: ast.AST) -> bool:
    """``if self.spans is not None:`` with no ``else``."""
    if not isinstance(node, ast.If) or node.orelse:
        return False
    test = node.test
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Attribute)
        and test.left.attr == 'spans'
        and isinstance(test.left.value, ast.Name)
        and test.left.value.id == 'self'
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.IsNot)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


def strip(source: str) -> tuple[str, int]:
    """The source without its hooks, and how many there were."""
    tree = ast.parse(source)
    cuts: list[tuple[int, int, str | None]] = []  # first line, last line (1-based), replacement
    for parent in ast.walk(tree):
        for field in ('body', 'orelse', 'finalbody'):
            block = getattr(parent, field, None)
            if not isinstance(block, list):
                continue
            hooks = [n for n in block if is_hook(n)]
            for node in hooks:
                alone = len(hooks) == len(block) and node is block[0]
                pad = ' ' * node.col_offset
                cuts.append(
                    (node.lineno, node.end_lineno or node.lineno, pad + 'pass\n' if alone else None)
                )
    lines = source.splitlines(keepends=True)
    for first, last, replacement in sorted(cuts, reverse=True):
        lines[first - 1 : last] = [replacement] if replacement else []
    return ''.join(lines), len(cuts)


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1] if __doc__ else 'usage: strip_tracing.py ROOT')
    root = Path(sys.argv[1]) / 'shoal_broker'
    if not root.is_dir():
        sys.exit(f'{root} is not a broker source tree')
    total = 0
    for path in sorted(root.rglob('*.py')):
        text = path.read_text()
        if 'self.spans is not None' not in text:
            continue
        stripped, count = strip(text)
        compile(stripped, str(path), 'exec')  # the tree still imports
        path.write_text(stripped)
        total += count
        print(f'{path.relative_to(root.parent)}: {count} tracing hooks removed')
    if total == 0:
        sys.exit('no tracing hooks found: nothing to compare')


if __name__ == '__main__':
    main()
