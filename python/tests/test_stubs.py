"""The hand-written type stubs declare exactly what the extension module defines."""

import ast
import inspect
import pathlib

import phasekv as pk

PACKAGE = pathlib.Path(pk.__file__).parent


def declared(stub):
    """Top-level names of a .pyi and, per class, the names of its members."""
    tree = ast.parse((PACKAGE / stub).read_text())
    names, members = set(), {}

    def name_of(node):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return node.name
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return node.target.id
        if isinstance(node, ast.Assign):
            return node.targets[0].id
        return None

    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module is None:  # from . import stats as stats
            names.update(alias.asname or alias.name for alias in node.names)
        name = name_of(node)
        if name:
            names.add(name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {name_of(n) for n in node.body} - {None}
    return names, members


def defined(module):
    names, members = set(), {}
    for name, value in vars(module).items():
        if name.startswith("_") and name not in ("__version__",):
            continue
        names.add(name)
        if isinstance(value, type) and not issubclass(value, BaseException):
            own = {k for k in vars(value) if not k.startswith("_") or k in ("__len__", "__contains__", "__iter__", "__enter__", "__exit__")}
            members[name] = own
    return names, members


def check(module, stub, helpers=()):
    stub_names, stub_members = declared(stub)
    names, members = defined(module)
    assert names - stub_names == set(), f"defined but not in {stub}"
    assert stub_names - names - set(helpers) == set(), f"in {stub} but not defined"
    for cls, own in members.items():
        if issubclass(getattr(module, cls), int) or "__members__" in stub_members[cls]:
            own = own - {"name", "value"}  # pybind11 enum machinery
        assert own - stub_members[cls] == set(), f"{cls}: members missing from {stub}"
        declared_only = {"__init__", "__members__", "__int__", "__hash__", "name", "value"}
        assert stub_members[cls] - own - declared_only == set(), cls


def test_stubs_cover_the_module():
    check(pk._phasekv, "_phasekv.pyi", helpers=("FloatArray", "FloatInput", "Chunk", "version"))
    check(pk.stats, "stats.pyi")
    check(pk.plot, "plot.pyi")
    check(pk.presets, "presets.pyi")
    check(pk.probe, "probe.pyi", helpers=("Positions", "SweepConfig", "SweepResult"))
    check(pk.testing, "testing.pyi", helpers=("Params",))


def test_the_package_reexports_the_module():
    for name in declared("_phasekv.pyi")[0] - {"FloatArray", "FloatInput", "Chunk", "version"}:
        assert getattr(pk, name) is getattr(pk._phasekv, name), name
    import phasekv.stats
    from phasekv.presets import deepseek_kv_stream

    assert phasekv.stats is pk._phasekv.stats and inspect.isroutine(deepseek_kv_stream)


# ---- signatures ---------------------------------------------------------------------------------

def split_top_level(params):
    """Splits a pybind11 parameter list at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(params):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(params[start:i].strip())
            start = i + 1
    tail = params[start:].strip()
    return parts + [tail] if tail else parts


def module_signatures(routine, name):
    """Each overload's parameter names as pybind11 states them in the docstring ('*' for keyword-only,
    None for an unnamed argN)."""
    out = []
    for line in (routine.__doc__ or "").splitlines():
        line = line.strip()
        if line[:1].isdigit() and ". " in line:  # "2. name(...) -> ..." of an overloaded function
            line = line.split(". ", 1)[1]
        if not line.startswith(name + "(") or line.startswith(name + "(*args, **kwargs)"):
            continue
        depth, end = 0, None
        for i, ch in enumerate(line[len(name):], len(name)):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        names = []
        for p in split_top_level(line[len(name) + 1:end]):
            n = p.split(":")[0].split("=")[0].strip()
            names.append(None if n.startswith("arg") and n[3:].isdigit() else n)
        out.append(names)
    return out


def stub_signatures(stub):
    """Per (class or None, function name): each declared signature's parameter names, '*' marking
    keyword-only ones."""
    tree = ast.parse((PACKAGE / stub).read_text())
    sigs = {}

    def names_of(f):
        a = f.args
        names = [x.arg for x in a.posonlyargs + a.args]
        if a.vararg:
            names.append("*" + a.vararg.arg)
        elif a.kwonlyargs:
            names.append("*")
        return names + [x.arg for x in a.kwonlyargs]

    def visit(body, owner):
        for node in body:
            if isinstance(node, ast.FunctionDef):
                if any(isinstance(d, ast.Name) and d.id == "property" or isinstance(d, ast.Attribute) for d in node.decorator_list):
                    continue
                sigs.setdefault((owner, node.name), []).append(names_of(node))
            elif isinstance(node, ast.ClassDef):
                visit(node.body, node.name)

    visit(tree.body, None)
    return sigs


def same_names(stub, real):
    return len(stub) == len(real) and all(r is None or s == r for s, r in zip(stub, real))


def check_signatures(module, stub):
    mismatches = []
    for (owner, name), declared_sigs in stub_signatures(stub).items():
        holder = getattr(module, owner, None) if owner else module
        routine = getattr(holder, name, None) if holder is not None else None
        if routine is None or not callable(routine):
            continue
        real = module_signatures(routine, name)
        if not real:  # not a pybind11 routine (a Python function, a slot wrapper): nothing stated
            continue
        for sig in declared_sigs:
            if not any(same_names(sig, r) for r in real):
                mismatches.append(f"{owner + '.' if owner else ''}{name}: stub {sig}, module {real}")
    assert mismatches == [], "\n".join(mismatches)


def test_stub_signatures_name_the_module_parameters():
    """Every function and method a stub declares takes the parameters, in order and keyword-only
    where the module says so, that the extension's own signatures name."""
    check_signatures(pk._phasekv, "_phasekv.pyi")
    check_signatures(pk.stats, "stats.pyi")
    check_signatures(pk.presets, "presets.pyi")
