"""
The shape of the source, checked mechanically: no class over 30 methods and no module over 500
lines in the three source roots, no import circle inside any package, and no work diary (dates
of work, "session N") or path of a build machine in the code and docs.

Each failure names every offender, so one run says what is left to split.
"""

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = ('broker', 'operator', 'analytics')
PACKAGES = ('shoal_broker', 'shoal_operator', 'shoal_analytics')
MAX_METHODS = 30
MAX_LINES = 500

DIARY = re.compile(r'session [0-9]+|sitting|review mend', re.IGNORECASE)
"""The issue's rule: ``grep -rniE "session [0-9]+|sitting|review mend"`` finds nothing."""
MACHINE_PATH = re.compile(r'(?<![\w.~-])/(?:(?:work|home|Users|root)/|tmp/pytest-of-)')
"""An absolute path on a build machine (a checkout, a home directory, a test run's files)."""
PROSE_ROOTS = (*SOURCE_ROOTS, 'docs', 'bench', 'README.md')
TEXT_SUFFIXES = {'.py', '.pyi', '.lua', '.c', '.h', '.md', '.txt', '.sh', '.yaml', '.yml',
                 '.json', '.toml', '.cfg', '.ini', '.sql', ''}  # fmt: skip


def _files(roots: Iterable[str], suffixes: set[str]) -> list[Path]:
    found = []
    for root in roots:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(path.rglob('*'))
        for file in candidates:
            ignored = {'__pycache__', 'node_modules', '.venv'} & set(file.parts)
            if file.is_file() and file.suffix in suffixes and not ignored:
                found.append(file)
    return found


def _modules() -> list[Path]:
    return _files(SOURCE_ROOTS, {'.py'})


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_no_module_is_over_500_lines() -> None:
    modules = _modules()
    assert len(modules) > 50  # the roots were found
    long = {_name(m): n for m in modules if (n := len(m.read_text().splitlines())) > MAX_LINES}
    assert not long, f'modules over {MAX_LINES} lines: ' + ', '.join(
        f'{name} ({n})' for name, n in sorted(long.items())
    )


def methods_per_class(source: str) -> dict[str, int]:
    """Qualified class name -> functions defined directly in its body (properties included)."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f'{prefix}{child.name}'
                counts[name] = sum(
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in child.body
                )
                visit(child, f'{name}.')
            else:
                visit(child, prefix)

    visit(ast.parse(source), '')
    return counts


def test_methods_are_counted_per_class_nested_ones_apart() -> None:
    source = (
        'class A:\n    def a(self): ...\n    async def b(self): ...\n'
        '    @property\n    def c(self): ...\n'
        '    class B:\n        def d(self): ...\n'
    )
    assert methods_per_class(source) == {'A': 3, 'A.B': 1}


def test_no_class_has_over_30_methods() -> None:
    big = {
        f'{_name(m)}::{cls}': n
        for m in _modules()
        for cls, n in methods_per_class(m.read_text()).items()
        if n > MAX_METHODS
    }
    assert not big, f'classes over {MAX_METHODS} methods: ' + ', '.join(
        f'{name} ({n})' for name, n in sorted(big.items())
    )


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one node (Tarjan's
    algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_the_circle_finder_finds_circles_and_nothing_else() -> None:
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a', 'd'}, 'd': {'e'}, 'e': set(), 'f': {'f', 'e'}}
    assert strongly_connected(graph) == [['a', 'b', 'c']]
    assert strongly_connected({'x': {'y'}, 'y': {'x'}, 'z': {'x'}}) == [['x', 'y']]


def circles_inside_packages(graph: grimp.ImportGraph) -> dict[str, list[list[str]]]:
    """Package -> circles among its direct children, each child standing for itself and
    everything below it (so ``amqp.a`` -> ``amqp.b`` -> ``amqp.a`` is a circle inside ``amqp``,
    and ``store.x`` -> ``metrics.y`` -> ``store.z`` one inside their parent). Imports made only
    for type checking count: a back-reference is a circle even when it costs nothing at run
    time."""
    circles: dict[str, list[list[str]]] = {}
    for package in sorted(graph.modules):
        children = graph.find_children(package)
        if len(children) < 2:
            continue
        owner = {}
        for child in children:
            for module in {child, *graph.find_descendants(child)}:
                owner[module] = child
        edges: dict[str, set[str]] = {child: set() for child in children}
        for module, child in owner.items():
            for imported in graph.find_modules_directly_imported_by(module):
                target = owner.get(imported)
                if target is not None and target != child:
                    edges[child].add(target)
        prefix = f'{package}.'
        found = [
            [member.removeprefix(prefix) for member in component]
            for component in strongly_connected(edges)
        ]
        if found:
            circles[package] = found
    return circles


def test_no_import_circle_inside_any_package() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    assert 'shoal_broker.amqp.broker' in graph.modules
    circles = circles_inside_packages(graph)
    assert not circles, 'import circles: ' + '; '.join(
        f'inside {package}, among {", ".join(circle)}'
        for package, found in circles.items()
        for circle in found
    )


def test_no_work_diary_or_build_machine_path_in_code_and_docs() -> None:
    offenders = []
    for file in _files(PROSE_ROOTS, TEXT_SUFFIXES):
        try:
            text = file.read_text()
        except UnicodeDecodeError:  # a compiled extension or an image
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for pattern in (DIARY, MACHINE_PATH):
                if match := pattern.search(line):
                    offenders.append(f'{_name(file)}:{number}: {match.group(0)!r}')
    assert not offenders, 'work diary or machine paths:\n' + '\n'.join(offenders)
