"""The three rooms of the package import one way: tools -> runtime -> spec language, and the vLLM contract
modules stand alone.

- ``vitcg.lang`` (the spec language) never imports torch, transformers' models, the runtime or the tools;
- ``vitcg.runtime`` (what an engine imports) never imports the tools;
- the manager knows the protocol (and vitcg's declared extension), nothing more;
- ``vitcg.cli`` only wires: importing it loads no room at all (commands import what they run);
- vitcg's custom ops (``vitcg.runtime.ops``) load without Triton, and the kernel's configuration choice is pure;
- ``vitcg.vllm_plugin`` (vLLM's plugin) sits on the runtime, never the tools, and its entry point module, which
  vLLM imports in every process, loads neither torch nor vLLM.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "vitcg"
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
    return sorted(f"vitcg.{room}.{p.stem}" for p in (PACKAGE / room).glob("*.py") if p.stem != "__init__")


def test_ls_shows_the_rooms_and_the_packaged_data():
    top = sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith(("_", ".")))
    assert top == ["cli.py", "errors.py", "lang", "runtime", "specs", "templates", "tools", "vllm_plugin"]


def static_imports(path: pathlib.Path) -> set[str]:
    """Every vitcg module a file names in an import statement, function-local imports included."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
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
    loaded = imported_by("vitcg.tools.plan")
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


@pytest.mark.parametrize("module", ["vitcg.tools.guesses", "vitcg.tools.failures"])
def test_what_the_check_stages_and_the_scaffold_share_loads_without_torch(module):
    """The draft's guesses (scaffold and report) and the failure wording (both stages of check) are plain text
    work: no torch, no runtime."""
    loaded = imported_by(module)
    assert not {m for m in loaded if m.split(".")[0] == "torch" or m.startswith("vitcg.runtime")}, sorted(loaded)
