"""The package's structure: no import cycle between modules (the layers themselves are checked by
lint-imports, from pyproject.toml, which make test runs)."""

from __future__ import annotations

import ast

import grimp


def cycles(graph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), or a module importing itself."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(module: str) -> None:
        index[module] = low[module] = counter[0]
        counter[0] += 1
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph.find_modules_directly_imported_by(module):
                found.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_between_modules():
    graph = grimp.build_graph("flowstat", exclude_type_checking_imports=True)
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]


# -- the tests' own hallway -------------------------------------------------------------------------
def imported_modules(path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_no_test_module_imports_another_or_conftest_and_benchmarks_do_not_reach_into_tests():
    """What tests share lives in tests/support/; a test module imported by another runs its module
    state twice and ties two files' fixtures together. Benchmarks import the package, not tests/."""
    from support.common import ROOT

    tests = sorted((ROOT / "tests").glob("*.py"))
    assert len(tests) > 40
    leaning = {
        f"{p.name} imports {m}" for p in tests for m in imported_modules(p) if m == "conftest" or m.startswith("test_")
    }
    assert not leaning, sorted(leaning)
    for p in sorted((ROOT / "benchmarks").glob("*.py")):
        text = p.read_text()
        assert not {"support", "conftest"} & imported_modules(p), p.name
        assert '"tests"' not in text and "'tests'" not in text, f"{p.name} puts tests/ on its path"


def constants_set_twice(text: str) -> list[str]:
    """Module-level UPPER_CASE names assigned more than once: the last value wins everywhere, also in
    the functions above it that meant the first."""
    seen: set[str] = set()
    twice = []
    for node in ast.parse(text).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for name in (t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()):
            if name in seen:
                twice.append(name)
            seen.add(name)
    return twice


def test_no_module_sets_a_constant_twice():
    """(bench_soak.py set RSS_EVERY_S to 10 s for its sampler, and 500 lines down to 60 s for its
    summary: the soak's sampler then read VmRSS once a minute.)"""
    from support.common import ROOT

    assert constants_set_twice("A = 1\ndef f():\n    return A\nB: int = 2\nB += 1\nA = 3\n") == ["A"]
    files = [p for d in ("src", "lab/src", "benchmarks", "tests") for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 200
    twice = {f"{p.relative_to(ROOT)}: {name}" for p in files for name in constants_set_twice(p.read_text())}
    assert not twice, sorted(twice)
