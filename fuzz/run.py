"""
Run one fuzz target under atheris (libFuzzer): ``python fuzz/run.py TARGET [libFuzzer flags]``.

The broker's modules are instrumented for coverage; the corpus directory (first non-flag
argument, else ``.fuzz/corpus/TARGET``) is seeded with well-formed inputs first. ``make fuzz``
runs every target for 100 000 inputs; the test suite runs a short bounded pass.
"""

import sys
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / 'tests' / 'support')]  # framesample, saslwire

with atheris.instrument_imports(include=['shoal_broker']):
    import harnesses
    import seeds


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in harnesses.HARNESSES:
        sys.stderr.write(f'usage: run.py {{{",".join(harnesses.HARNESSES)}}} [libFuzzer flags]\n')
        raise SystemExit(2)
    name, flags = sys.argv[1], sys.argv[2:]
    corpus = [f for f in flags if not f.startswith('-')]
    if not corpus:
        corpus = [str(Path('.fuzz/corpus') / name)]
        flags.append(corpus[0])
    seeds.write(name, Path(corpus[0]))
    target = harnesses.HARNESSES[name]
    atheris.Setup([sys.argv[0], *flags], target)
    atheris.Fuzz()


if __name__ == '__main__':
    main()
