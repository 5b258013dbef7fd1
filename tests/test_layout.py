"""The layout holds by test, not by discipline (docs/layout.md states the same rules): code shipped
to nodes (what core.cluster ships: dsv41/node/ and the shared modules) imports only the standard
library and itself; client tools import only themselves and the shared modules; the settings
(dsv41/settings/) import no head, client or engine code but the engine's own settings module; an
engine's package (dsv41/vllm/) is chosen in one place (head/core/engine.py) and imports no verb;
no module anywhere is part of an import cycle; head/ has two levels, the doit verbs on top (none
imports another) and the machinery in head/core/ (which imports no verb); the decision and the
watchdog's judgement import nothing that does I/O; and the import graph stays small (its arrows and
its longest chain are counted). Every import counts, including those inside functions. No module and no
function grows past the length one reads whole (MAX_MODULE_LINES, MAX_FUNCTION_LINES)."""
import ast
import functools
import importlib.util
import shutil
import sys
from pathlib import Path

from dsv41.head.core.cluster import SHIPPED

LIB = Path(__file__).resolve().parents[1] / "lib"
# the modules shipped with node/ (SHIPPED: "dsv41/x.py" files and "dsv41/node/" packages)
SHARED = {p[:-3].replace("/", ".").removesuffix(".__init__") for p in SHIPPED if p.endswith(".py")}
SHIPPED_PACKAGES = tuple(p.rstrip("/").replace("/", ".") for p in SHIPPED if p.endswith("/"))
ENGINES = ("dsv41.vllm",)                 # the engines' packages
ENGINE_CHOOSER = "dsv41.head.core.engine"    # the one module that imports an engine's recipe
ENGINE_SETTINGS = "settings"                 # an engine's settings module: the settings package reads it
PURE = ("dsv41.head.core.decide", "dsv41.head.core.health")
PURE_MAY_USE = {"dsv41.head.core.recipe", "dsv41.head.core.hang"}           # besides each other and the vocabulary below
VOCABULARY = {"dsv41.names", "dsv41.errors"}         # shared names and the error type: no I/O done
PURE_STDLIB = {"collections", "dataclasses", "enum", "functools", "hashlib", "itertools", "json", "math", "re",
               "typing"}
# Before head/ had two levels: 142 arrows among 39 modules (3.64 a module) and a chain of 9. The split
# itself held 141 arrows; the settings schema, monitoring and the incident evidence came as modules of
# their own since, so the bound is on the arrows a module (each new module must keep its imports few)
# and on the chain, never on the module count (merging modules to cut arrows is not the aim). The checked
# rollout (core/rollout.py: applying launch's steps, the hold and the way back) and the release line in
# status and top brought it to 3.34; the settings and the engine in packages of their own and modules
# of one job each brought it back under 3.2.
MAX_ARROWS_PER_MODULE = 3.2
MAX_CHAIN = 8
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 480, 60     # a module's lines; a function's, def to last line


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


def shipped(name):
    return name in SHARED or name.startswith(SHIPPED_PACKAGES)


def is_verb(name):
    """A doit verb's module: directly in dsv41.head (the settings module aside)."""
    return name.startswith("dsv41.head.") and name.count(".") == 2 and name != "dsv41.head.core"


def engine_of(name):
    """The engine package a module belongs to, or None."""
    return next((e for e in ENGINES if name == e or name.startswith(e + ".")), None)


def is_engine_settings(name):
    return engine_of(name) is not None and name == f"{engine_of(name)}.{ENGINE_SETTINGS}"


def graph_of(lib):
    """({module: dsv41 modules it imports}, {module: outside top-level modules it imports})."""
    known = modules(lib)
    graph, outer = {}, {}
    for name, path in known.items():
        outer[name], inside = imports(name, path, known)
        graph[name] = inside - {name}
    return graph, outer


def size(graph):
    """(arrows, longest import chain as a list of modules) of an acyclic graph."""
    @functools.cache
    def longest(n):
        return max(([n] + longest(m) for m in graph[n]), key=len, default=[n])
    return sum(map(len, graph.values())), max((longest(n) for n in sorted(graph)), key=len)


def violations(lib):
    graph, outer = graph_of(lib)
    problems = []
    for name in graph:
        outside, inside = outer[name], graph[name]
        if shipped(name):
            bad = sorted(m for m in outside if m not in sys.stdlib_module_names)
            bad += sorted(m for m in inside if not shipped(m))
            problems += [f"{name} is shipped to nodes but imports {m}" for m in bad]
        if name.startswith("dsv41.client"):
            problems += [f"{name} is a client tool but imports {m}" for m in sorted(inside)
                         if not m.startswith("dsv41.client") and m not in SHARED]
        if name.startswith("dsv41.settings"):
            problems += [f"settings module {name} imports {m}" for m in sorted(inside)
                         if m.startswith(("dsv41.head", "dsv41.client")) or engine_of(m) and not is_engine_settings(m)]
        for m in sorted(inside):
            if engine_of(m) and engine_of(m) != engine_of(name) and name != ENGINE_CHOOSER and not (
                    name.startswith("dsv41.settings") and is_engine_settings(m)):
                problems.append(f"{name} imports {m}: the engine is chosen in {ENGINE_CHOOSER} alone")
        if engine_of(name):
            problems += [f"engine module {name} imports verb {m}" for m in sorted(inside) if is_verb(m)]
            if is_engine_settings(name):
                problems += [f"engine settings {name} imports {m}: only dsv41.settings.setting" for m in sorted(inside)
                             if m != "dsv41.settings.setting"]
        if is_verb(name):
            problems += [f"verb {name} imports verb {m}: move what they share into dsv41.head.core"
                         for m in sorted(inside) if is_verb(m)]
        if name.startswith("dsv41.head.core."):
            problems += [f"machinery {name} imports verb {m}" for m in sorted(inside) if is_verb(m)]
    problems += pure_problems(graph, outer)
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return problems


def pure_problems(graph, outer):
    """decide and judge, and every dsv41 module they reach, import nothing that does I/O."""
    out, seen, todo = [], set(), list(PURE)
    while todo:
        name = todo.pop()
        if name in seen or name in VOCABULARY:
            continue
        seen.add(name)
        if name not in PURE and name not in PURE_MAY_USE:
            out.append(f"{name} does I/O but {' or '.join(PURE)} reaches it")
            continue
        out += [f"{name} must stay pure but imports {m}" for m in sorted(outer[name] - PURE_STDLIB)]
        todo += sorted(graph[name])
    return out


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
    assert {n.split(".")[1] for n in names if n.count(".") == 1} <= {"node", "head", "client", "settings", "vllm",
                                                                     "errors", "files", "names"}


def test_node_code_is_stdlib_only_client_never_imports_head_no_cycles():
    assert violations(LIB) == []


def test_the_import_graph_stays_small():
    graph, _ = graph_of(LIB)
    arrows, chain = size(graph)
    count = sum(1 for name, path in modules(LIB).items() if path.name != "__init__.py")
    assert len(chain) <= MAX_CHAIN, "longest import chain: " + " -> ".join(chain)
    assert arrows / count <= MAX_ARROWS_PER_MODULE, (
        f"{arrows} import arrows among {count} modules ({arrows / count:.2f} a module); keep dependencies few "
        "(see docs/layout.md)")


def too_long(lib):
    """'path:line name: N lines' for each module under lib/dsv41 over MAX_MODULE_LINES and each function or
    method over MAX_FUNCTION_LINES (its def line to its last, decorators aside), in file and line order."""
    out = []
    for name, path in modules(lib).items():
        text = path.read_text()
        where = path.relative_to(lib.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            out.append(f"{where}:1 {name}: {len(text.splitlines())} lines")
        defs = sorted((node.lineno, node.end_lineno - node.lineno + 1, node.name)
                      for node in ast.walk(ast.parse(text, str(path)))
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
        out += [f"{where}:{line} {fn}: {n} lines" for line, n, fn in defs if n > MAX_FUNCTION_LINES]
    return out


def test_no_module_or_function_grows_past_what_is_read_whole():
    found = too_long(LIB)
    assert found == [], (f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function: split it "
                         "into parts of one job each (see docs/layout.md):\n" + "\n".join(found))


def test_the_length_check_names_a_long_module_and_a_long_function(tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(LIB / "dsv41", lib / "dsv41", ignore=shutil.ignore_patterns("__pycache__"))
    errors = lib / "dsv41/errors.py"
    errors.write_text(errors.read_text() + "#\n" * MAX_MODULE_LINES)
    names = lib / "dsv41/names.py"
    body = "".join(f"    x = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    line = len(names.read_text().splitlines()) + 4                # two blank lines and the decorator above
    names.write_text(names.read_text() + f"\n\n@staticmethod\ndef long():\n{body}    return x\n"     # one over
                     f"\n\ndef short():\n{body}")                                            # at the bound
    lines = len(errors.read_text().splitlines())
    assert too_long(lib) == [f"lib/dsv41/errors.py:1 dsv41.errors: {lines} lines",
                             f"lib/dsv41/names.py:{line} long: {MAX_FUNCTION_LINES + 1} lines"]


def test_the_verbs_stand_on_the_machinery():
    names = modules(LIB)
    verbs = {n for n in names if is_verb(n)}
    assert {"dsv41.head.launch", "dsv41.head.stop", "dsv41.head.status", "dsv41.head.watchdog",
            "dsv41.head.top"} <= verbs
    assert {"dsv41.head.core.recipe", "dsv41.head.core.decide", "dsv41.head.core.health"} <= set(names)
    assert SHARED == {"dsv41", "dsv41.errors", "dsv41.files", "dsv41.names"} and SHIPPED_PACKAGES == ("dsv41.node",)


def test_the_check_catches_a_breach(tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(LIB / "dsv41", lib / "dsv41", ignore=shutil.ignore_patterns("__pycache__"))
    probe = lib / "dsv41/node/probe.py"
    probe.write_text("import requests\n" + probe.read_text())
    facts = lib / "dsv41/node/facts.py"
    facts.write_text(facts.read_text() + "\n\ndef late():\n    from dsv41.head.core import nodes\n")
    smoke = lib / "dsv41/client/smoke.py"
    smoke.write_text(smoke.read_text() + "\nfrom dsv41.settings.layers import load_config\n")
    schema = lib / "dsv41/settings/schema.py"
    schema.write_text(schema.read_text() + "\n\ndef late():\n    from dsv41.vllm import recipe\n")
    status = lib / "dsv41/head/status.py"
    status.write_text(status.read_text() + "\n\ndef late():\n    from dsv41.vllm import argv\n")
    cluster = lib / "dsv41/head/core/cluster.py"
    cluster.write_text(cluster.read_text() + "\n\ndef late():\n    from dsv41.head import launch\n")
    plan = lib / "dsv41/head/plan.py"
    plan.write_text(plan.read_text() + "\n\ndef late():\n    from dsv41.head.launch import launch\n")
    decide = lib / "dsv41/head/core/decide.py"
    decide.write_text("import subprocess\n" + decide.read_text())
    health = lib / "dsv41/head/core/health.py"
    health.write_text(health.read_text() + "\n\ndef late():\n    from dsv41.head.core import nodes\n")
    found = violations(lib)
    assert "dsv41.node.probe is shipped to nodes but imports requests" in found
    assert "dsv41.node.facts is shipped to nodes but imports dsv41.head.core.nodes" in found
    assert "dsv41.client.smoke is a client tool but imports dsv41.settings.layers" in found
    assert "settings module dsv41.settings.schema imports dsv41.vllm.recipe" in found
    assert "dsv41.head.status imports dsv41.vllm.argv: the engine is chosen in dsv41.head.core.engine alone" in found
    assert any(p.startswith("import cycle:") and "dsv41.head.core.cluster" in p and "dsv41.head.launch" in p
               for p in found), found
    assert "verb dsv41.head.plan imports verb dsv41.head.launch: move what they share into dsv41.head.core" in found
    assert "machinery dsv41.head.core.cluster imports verb dsv41.head.launch" in found
    assert "dsv41.head.core.decide must stay pure but imports subprocess" in found
    assert "dsv41.head.core.nodes does I/O but dsv41.head.core.decide or dsv41.head.core.health reaches it" in found


def test_the_count_sees_a_longer_chain_and_more_arrows(tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(LIB / "dsv41", lib / "dsv41", ignore=shutil.ignore_patterns("__pycache__"))
    arrows, chain = size(graph_of(lib)[0])
    names = lib / "dsv41/names.py"          # at the bottom of the longest chain: one more module below it
    names.write_text("from dsv41.node import fabric\n" + names.read_text())
    fabric = lib / "dsv41/node/fabric.py"
    fabric.write_text(fabric.read_text().replace("from dsv41.errors import", "import dsv41.files\nfrom dsv41.errors import"))
    more, longer = size(graph_of(lib)[0])
    assert more == arrows + 2 and len(longer) > len(chain)


def test_no_two_test_modules_share_a_name():
    """pytest imports test modules by their file name: two test_x.py in different folders break the
    collection of the whole suite (it has happened twice)."""
    seen = {}
    for path in sorted((LIB.parent / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(LIB.parent)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def layout_tree(text):
    """{path under lib/dsv41: times named} from docs/layout.md's tree: a name's indent (two spaces a
    level below `lib/dsv41/`) places it in the folder above it; a line indented past column 12 goes on
    describing the one before."""
    block = text.split("```\n", 2)[1]
    named, folders, inside = {}, [], False
    for line in block.splitlines():
        if line.startswith("lib/dsv41/"):
            inside = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        if not inside or indent == 0:
            inside = False
            continue
        if indent > 12:
            continue
        depth = indent // 2
        names = line.strip().split("  ")[0].split(", ")
        del folders[depth - 1:]
        for name in names:
            if name.endswith("/"):
                folders.append(name.rstrip("/"))
            else:
                path = "/".join([*folders, name])
                named[path] = named.get(path, 0) + 1
    return named


def test_docs_layout_names_every_module_once():
    named = layout_tree((LIB.parent / "docs" / "layout.md").read_text())
    have = {str(p.relative_to(LIB / "dsv41")) for p in (LIB / "dsv41").rglob("*.py") if "__pycache__" not in p.parts}
    assert {p for p in have if named.get(p) != 1} == set(), "named not once in docs/layout.md"
    assert {p for p in named if p.endswith(".py")} - have == set(), "named in docs/layout.md but not a module"


def test_the_tree_reader_sees_a_missing_and_a_twice_named_module():
    text = "```\nlib/dsv41/\n  a.py  x\n  node/  y\n    b.py, a.py  z\n    c.py\n                 more on c\ndone\n```\n"
    assert layout_tree(text) == {"a.py": 1, "node/b.py": 1, "node/a.py": 1, "node/c.py": 1}


def config_reads(lib, attr):
    """["path:line"] where a module outside settings/ reads `attr` off a Config (cfg.X, self.cfg.X, cl.cfg.X)."""
    out = []
    for name, path in modules(lib).items():
        if name.startswith("dsv41.settings"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == attr and (
                    isinstance(node.value, ast.Name) and node.value.id == "cfg"
                    or isinstance(node.value, ast.Attribute) and node.value.attr == "cfg"):
                out.append(f"{path.relative_to(lib)}:{node.lineno}")
    return out


def door_writers(lib):
    """{module} that call the gateway's close, open or drain (`<x>.gateway.close(...)`)."""
    out = set()
    for name, path in modules(lib).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            f = isinstance(node, ast.Call) and node.func
            if isinstance(f, ast.Attribute) and f.attr in ("close", "open", "drain") and \
                    isinstance(f.value, ast.Attribute) and f.value.attr == "gateway":
                out.add(name)
    return out


def test_the_serving_layout_is_read_in_one_place_and_the_door_opened_in_one():
    """Only the settings (settings/layout.py among them) read the raw GATEWAY switch: every other module
    asks the Layout (cfg.layout, or the release in service's); only core/recovery.py opens, closes and
    drains the door."""
    assert config_reads(LIB, "gateway") == []
    assert door_writers(LIB) == {"dsv41.head.core.recovery"}


def test_the_layout_checks_find_a_raw_read_and_another_door_writer(tmp_path):
    lib = tmp_path / "lib"
    shutil.copytree(LIB / "dsv41", lib / "dsv41", ignore=shutil.ignore_patterns("__pycache__"))
    stop = lib / "dsv41" / "head" / "stop.py"
    stop.write_text(stop.read_text() + "\n\ndef odd(cl):\n    return cl.cfg.gateway and cl.gateway.open()\n")
    assert config_reads(lib, "gateway") == [f"dsv41/head/stop.py:{len(stop.read_text().splitlines())}"]
    assert door_writers(lib) == {"dsv41.head.core.recovery", "dsv41.head.stop"}
