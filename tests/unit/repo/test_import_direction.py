"""The three rooms of the package import one way: tools -> runtime -> spec language, and the vLLM contract
modules stand alone.

- ``vitcg.lang`` (the spec language) never imports torch, transformers' models, the runtime or the tools;
- ``vitcg.runtime`` (what an engine imports) never imports the tools;
- the manager knows the protocol (and vitcg's declared extension), nothing more;
- ``vitcg.cli`` only wires: importing it loads no room at all (commands import what they run);
- vitcg's custom ops (``vitcg.runtime.ops``) load without Triton, and the kernel's configuration choice is pure;
- ``vitcg.vllm_plugin`` (vLLM's plugin) sits on the runtime, never the tools, and its entry point module, which
  vLLM imports in every process, loads neither torch nor vLLM;
- the glue to Hugging Face models (``vitcg.runtime.hf``) is what ``accelerate``, the plugin and the tools share: it
  stands below all three;
- no module uses another module's private (``_name``) names: what two modules share has a public name.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from support import REPO

PACKAGE = REPO / "vitcg"
ROOMS = ("lang", "runtime", "tools")
SHARED = {"vitcg", "vitcg.errors"}
PROTOCOL_SIDE = SHARED | {"vitcg.runtime", "vitcg.runtime.budgets", "vitcg.runtime.costs", "vitcg.runtime.engine",
                          "vitcg.runtime.extension", "vitcg.runtime.graphs", "vitcg.runtime.manager",
                          "vitcg.runtime.nonfinite", "vitcg.runtime.options", "vitcg.runtime.packing", "vitcg.runtime.padding",
                          "vitcg.runtime.protocol", "vitcg.runtime.stats", "vitcg.runtime.syncs", "vitcg.runtime.timing"}
POLICY = {"vitcg.runtime.packing": {"vitcg.runtime.budgets"},
          "vitcg.runtime.costs": {"vitcg.runtime.budgets", "vitcg.runtime.packing"},
          "vitcg.runtime.options": {"vitcg.runtime.budgets", "vitcg.runtime.packing"}}
"""The manager's policies: torch-free, each importing only these vitcg modules (besides the shared ones)."""


def imported_by(module: str) -> set[str]:
    code = (f"import sys, {module}; "
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('vitcg', 'transformers', 'torch'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def modules_of(room: str) -> list[str]:
    """The modules of a room, those of its subpackages included (``vitcg.tools.check.vlm``)."""
    return sorted(module_name(p).removesuffix(".__init__") for p in (PACKAGE / room).rglob("*.py")
                  if p.parent != PACKAGE / room or p.stem != "__init__")


COMMAND_ROOMS = ("check", "bench", "plan", "new")
"""The subpackages of ``vitcg.tools``, one per command that needs more than a module."""


@pytest.mark.parametrize("room", COMMAND_ROOMS)
def test_a_commands_room_uses_no_other_commands_room(room):
    """``vitcg check`` goes down from its room to the shared tools, the runtime and the language, never sideways
    into another command's room (nor back up to the CLI)."""
    others = tuple(f"vitcg.tools.{r}" for r in COMMAND_ROOMS if r != room) + ("vitcg.cli",)
    for path in (PACKAGE / "tools" / room).glob("*.py"):
        wrong = sorted(n for n in static_imports(path) if n == "vitcg.cli" or n.startswith(others))
        assert not wrong, f"{module_name(path)} imports {wrong}"


def test_the_shared_tools_use_no_commands_room():
    rooms = tuple(f"vitcg.tools.{r}" for r in COMMAND_ROOMS)
    for path in (PACKAGE / "tools").glob("*.py"):
        wrong = sorted(n for n in static_imports(path) if n.startswith(rooms))
        assert not wrong, f"{module_name(path)} imports {wrong}"


def test_ls_shows_the_rooms_and_the_packaged_data():
    top = sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", ".")))
    assert top == ["cli.py", "errors.py", "lang", "runtime", "specs", "templates", "tools", "vllm_plugin"]


def module_name(path: pathlib.Path) -> str:
    """The dotted name a file of the package is imported by (``vitcg/lang/__init__.py``: ``vitcg.lang.__init__``)."""
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def imported_from(node: ast.ImportFrom, module: str) -> str:
    """The absolute module an ``import from`` statement of ``module`` reads (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = module.rsplit(".", 1)[0].split(".")
    return ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))


def static_imports(path: pathlib.Path) -> set[str]:
    """Every vitcg module a file names in an import statement, function-local imports included."""
    module = module_name(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            name = imported_from(node, module)
            found.add(name)
            found.update(f"{name}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {n for n in found if n.split(".")[0] in ("vitcg", "torch", "transformers")}


@pytest.mark.parametrize("room, forbidden", [
    ("lang", ("vitcg.runtime", "vitcg.tools", "vitcg.cli", "torch")),
    ("runtime", ("vitcg.tools", "vitcg.cli", "vitcg.lang.harness")),  # the harness is the test rig
    ("tools", ("vitcg.cli",)),
    ("vllm_plugin", ("vitcg.tools", "vitcg.cli", "vitcg.lang.harness")),
])
def test_rooms_import_one_way(room, forbidden):
    for path in sorted((PACKAGE / room).glob("*.py")):
        bad = sorted(n for n in static_imports(path) if n.startswith(forbidden))
        assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {bad}"


def is_module(name: str) -> bool:
    """Whether a dotted vitcg name is a module or package of the checkout."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def private_uses(source: str, module: str) -> list[str]:
    """Where the code of ``module`` reaches a private name of another vitcg module, as ``line: what``: ``from M
    import _x``, a private module on an import's path, or ``m._x`` / ``vitcg.m._x`` on a vitcg module it imported
    (``from . import m`` style imports of public names are the allowed way to share)."""
    tree = ast.parse(source)
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and imported_from(node, module).split(".")[0] == "vitcg":
            base = imported_from(node, module)
            for alias in node.names:
                name = f"{base}.{alias.name}"
                if any(private(part) for part in name.split(".")):
                    found.append((node.lineno, f"from {base} import {alias.name}"))
                elif is_module(name):
                    modules[alias.asname or alias.name] = name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "vitcg":
                    continue
                if any(private(part) for part in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
                else:
                    modules[alias.asname or "vitcg"] = alias.name if alias.asname else "vitcg"
    for node in ast.walk(tree):
        parts = dotted(node) if isinstance(node, ast.Attribute) else None
        if not parts or parts[0] not in modules or not private(parts[-1]):
            continue
        owner = ".".join([modules[parts[0]], *parts[1:-1]])
        if is_module(owner):
            found.append((node.lineno, ".".join(parts)))
    return [f"{line}: {what}" for line, what in sorted(set(found))]


@pytest.mark.parametrize("source, module, expected", [
    ("from .adapter import _Adapter", "vitcg.runtime.hf", ["1: from vitcg.runtime.adapter import _Adapter"]),
    ("from vitcg.lang import _bindings", "vitcg.lang.source", ["1: from vitcg.lang import _bindings"]),
    ("def f():\n    from . import _bindings, load_layer", "vitcg.lang.source",
     ["2: from vitcg.lang import _bindings"]),
    ("from ..runtime.accelerate import Layout, _Layout", "vitcg.vllm_plugin.bridge",
     ["1: from vitcg.runtime.accelerate import _Layout"]),
    ("from .lang import _private_module", "vitcg.cli", ["1: from vitcg.lang import _private_module"]),
    ("from . import providers\nproviders._cache.clear()", "vitcg.runtime.adapter", ["2: providers._cache"]),
    ("import vitcg.runtime.adapter as a\na._check_path('')", "vitcg.tools.check.vlm", ["2: a._check_path"]),
    ("import vitcg.runtime.adapter\nvitcg.runtime.adapter._check_path('')", "vitcg.tools.check.vlm",
     ["2: vitcg.runtime.adapter._check_path"]),
    ("from . import providers\nproviders.compute(self._cache, x._y)", "vitcg.runtime.adapter", []),
    ("from .hf import Layout, combine_output\nfrom .. import __version__", "vitcg.runtime.accelerate", []),
    ("from __future__ import annotations\nfrom torch import _C", "vitcg.runtime.ops", []),
    ("from .rules import buffers as buf\nbuf.PUBLIC", "vitcg.lang.checks", []),
])
def test_the_private_name_rule_sees_each_form(source, module, expected):
    assert private_uses(source, module) == expected


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_uses_another_modules_private_names(path):
    """What two modules share has a public name (``bridge.py`` once imported ``accelerate._Layout``)."""
    found = private_uses(path.read_text(), module_name(path))
    assert not found, f"{path.relative_to(PACKAGE.parent)} uses private names of other modules: {found}"


def test_the_hugging_face_glue_stands_below_its_users():
    """``accelerate``, the plugin and the tools share :mod:`vitcg.runtime.hf`; it needs none of them (nor the
    adapter, which reads outputs and pixels through it)."""
    users = ("vitcg.runtime.accelerate", "vitcg.runtime.adapter", "vitcg.runtime.manager", "vitcg.vllm_plugin",
             "vitcg.tools", "vitcg.cli")
    bad = sorted(n for n in static_imports(PACKAGE / "runtime" / "hf.py") if n.startswith(users))
    assert not bad, f"vitcg/runtime/hf.py imports {bad}"


def test_the_spec_language_loads_without_torch():
    loaded = imported_by("vitcg.lang")
    assert not {m for m in loaded if m.split(".")[0] == "torch" or m.startswith(("vitcg.runtime", "vitcg.tools"))}


def test_the_cli_only_wires():
    loaded = imported_by("vitcg.cli")
    assert loaded & {"torch", "vitcg.runtime", "vitcg.tools", "vitcg.lang"} == set(), sorted(loaded)


def test_manager_imports_only_the_protocol_side():
    loaded = {m for m in imported_by("vitcg.runtime.manager") if m.startswith("vitcg")}
    assert loaded <= PROTOCOL_SIDE, f"the manager pulls in {sorted(loaded - PROTOCOL_SIDE)}"
    assert not any(m.startswith("transformers") for m in imported_by("vitcg.runtime.manager"))


@pytest.mark.parametrize("module", sorted(POLICY))
def test_packing_and_costs_are_pure(module):
    """``vitcg plan`` and the manager share them; neither torch nor the mechanism may creep in."""
    loaded = imported_by(module)
    assert {m for m in loaded if m.startswith("vitcg")} <= SHARED | {"vitcg.runtime", module} | POLICY[module]
    assert not {m for m in loaded if m.split(".")[0] in ("torch", "transformers")}


def test_plan_packs_and_prices_without_the_manager():
    loaded = imported_by("vitcg.tools.plan.planner")
    assert not {"vitcg.runtime.manager", "vitcg.runtime.graphs", "torch"} & loaded, sorted(loaded)


@pytest.mark.parametrize("module", ["vitcg.runtime.protocol", "vitcg.runtime.extension", "vitcg.runtime.engine"])
def test_contract_modules_stand_alone(module):
    loaded = {m for m in imported_by(module) if m.startswith("vitcg")}
    assert loaded <= SHARED | {"vitcg.runtime", "vitcg.runtime.protocol", module}, sorted(loaded)


def test_the_plugins_entry_point_loads_neither_torch_nor_vllm():
    code = "import sys, vitcg.vllm_plugin; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'vllm')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_custom_ops_load_without_triton_and_the_kernel_choice_is_pure():
    """Stored compiled code calls the ops in any process (issue 36): defining them must not need Triton."""
    code = ("import sys, torch\n"  # whatever torch itself loads is torch's business
            "before = set(sys.modules)\n"
            "import vitcg.runtime.ops\n"
            "print(sorted(m for m in set(sys.modules) - before\n"
            "             if m.split('.')[0] == 'triton' or m == 'vitcg.runtime.varlen_triton'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    loaded = imported_by("vitcg.runtime.packed_configs")
    assert loaded <= SHARED | {"vitcg.runtime", "vitcg.runtime.packed_configs"}, sorted(loaded)


@pytest.mark.parametrize("module", ["vitcg.tools.guesses", "vitcg.tools.check.failures"])
def test_what_the_check_stages_and_the_scaffold_share_loads_without_torch(module):
    """The draft's guesses (scaffold and report) and the failure wording (both stages of check) are plain text
    work: no torch, no runtime."""
    loaded = imported_by(module)
    assert not {m for m in loaded if m.split(".")[0] == "torch" or m.startswith("vitcg.runtime")}, sorted(loaded)
