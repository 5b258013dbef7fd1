"""The layout holds by test, not by discipline: code shipped to nodes (dsv41/node/ and the shared
modules) imports only the standard library and itself; client tools never import the head; no module
anywhere is part of an import cycle. Every import counts, including those inside functions."""
import ast
import importlib.util
import shutil
import sys
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "lib"
SHARED = {"dsv41", "dsv41.errors", "dsv41.files", "dsv41.names"}   # shipped with node/, stdlib only


def modules(lib):
    """{module name: path} of every module under lib/dsv41."""
    out = {}
    for path in sorted((lib / "dsv41").rglob("*.py")):
        parts = list(path.relative_to(lib).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name, path, known):
    """(top-level names of outside imports, dsv41 modules imported) by one module, anywhere in it."""
    outside, inside = set(), set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            if t == "dsv41" or t.startswith("dsv41."):
                while t not in known:
                    t = t.rsplit(".", 1)[0]
                inside.add(t)
            else:
                outside.add(t.split(".")[0])
    return outside, inside


def violations(lib):
    known = modules(lib)
    graph, problems = {}, []
    for name, path in known.items():
        outside, inside = imports(name, path, known)
        graph[name] = inside - {name}
        shipped = name in SHARED or name.startswith("dsv41.node")
        if shipped:
            bad = sorted(m for m in outside if m not in sys.stdlib_module_names)
            bad += sorted(m for m in inside if m not in SHARED and not m.startswith("dsv41.node"))
            problems += [f"{name} is shipped to nodes but imports {m}" for m in bad]
        if name.startswith("dsv41.client"):
            problems += [f"{name} is a client tool but imports {m}" for m in sorted(inside)
                         if m.startswith(("dsv41.head", "dsv41.node"))]
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def cycles(graph):
    """Each strongly connected group of more than one module (Tarjan), as a path."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group) + [sorted(group)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_tree_shows_where_code_runs():
    names = modules(LIB)
    for room in ("dsv41.node", "dsv41.head", "dsv41.client"):
        assert any(n.startswith(room + ".") for n in names), room
    assert {n.split(".")[1] for n in names if n.count(".") == 1} <= {"node", "head", "client", "errors",
                                                                     "files", "names"}


def test_node_code_is_stdlib_only_client_never_imports_head_no_cycles():
    assert violations(LIB) == []


def test_the_check_catches_a_breach(tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(LIB / "dsv41", lib / "dsv41", ignore=shutil.ignore_patterns("__pycache__"))
    probe = lib / "dsv41/node/probe.py"
    probe.write_text("import requests\n" + probe.read_text())
    facts = lib / "dsv41/node/facts.py"
    facts.write_text(facts.read_text() + "\n\ndef late():\n    from dsv41.head.core import nodes\n")
    smoke = lib / "dsv41/client/smoke.py"
    smoke.write_text(smoke.read_text() + "\nfrom dsv41.head.config import load_config\n")
    cluster = lib / "dsv41/head/core/cluster.py"
    cluster.write_text(cluster.read_text() + "\n\ndef late():\n    from dsv41.head import launch\n")
    found = violations(lib)
    assert "dsv41.node.probe is shipped to nodes but imports requests" in found
    assert "dsv41.node.facts is shipped to nodes but imports dsv41.head.core.nodes" in found
    assert "dsv41.client.smoke is a client tool but imports dsv41.head.config" in found
    assert any(p.startswith("import cycle:") and "dsv41.head.core.cluster" in p and "dsv41.head.launch" in p
               for p in found), found
