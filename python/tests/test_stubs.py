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
    from phasekv.presets import deepseek_v4_csa_kv

    assert phasekv.stats is pk._phasekv.stats and inspect.isroutine(deepseek_v4_csa_kv)
