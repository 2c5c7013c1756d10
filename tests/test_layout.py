"""The package's import graph, read with ``ast`` from the source (imports inside functions included).

Rules (docs/internals.md, "Package layout"):

- no import cycle among ``video_grpo`` modules;
- a *product* module is any ``video_grpo`` module outside ``video_grpo.bench`` and ``video_grpo.toys``; it imports
  neither (a training run needs no benchmark, tiny model or generated video);
- ``video_grpo.toys`` imports product modules only, never ``video_grpo.bench``;
- ``video_grpo.bench.emit`` imports no ``video_grpo`` module: it is the bottom every benchmark writes through;
- a product module outside ``video_grpo.plan`` imports from the planner only :data:`PLAN_ENTRY_POINTS`
  (``video_grpo.plan.startup``, the start-up summary and auto-fit; ``video_grpo.runtime.live_memory``, the CPU plan
  check's counter);
- inside ``video_grpo.plan`` each module imports only the modules before it in :data:`PLAN_LAYERS`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from .conftest import REPO

SRC = REPO / "src"
NON_PRODUCT = ("video_grpo.bench", "video_grpo.toys")
PLAN = "video_grpo.plan"
PLAN_ENTRY_POINTS = {  # what the trainer needs of the planner
    "video_grpo.plan.startup",  # the start-up summary, auto_fit and the plan a run checks itself against
}
MAX_TOP_MODULES = 20
# the stages of a training step, bottom first: each may import only those before it
STAGES = ("runtime", "data", "inputs", "rollout", "rewards", "loss")
TOOLS = ("plan", "bench", "toys")
# commands that live in a stage package: they may read the recipe (video_grpo.configs) and any stage
STAGE_COMMANDS = {"video_grpo.data.check", "video_grpo.data.__main__"}
PLAN_LAYERS = (  # the order a plan is made in (docs/internals.md lists them so)
    "cache",  # what depends only on the model and widths, kept (imports no planner module)
    "prompt_text",
    "workload",
    "model",
    "sizes",
    "fake_trace",
    "layers",
    "deepspeed_buffers",  # DeepSpeed's own buffers (reduce bucket, the step's float32 gradients)
    "memory",
    "compute",
    "recipe",
    "fitting",
    "loss_split",  # whether TRL's step depends on the micro-batch split (imports no planner module)
    "ranks",  # the one device every rank fits for (auto-fit reads its result)
    "autofit",  # the changes that keep the mathematics, chosen from fitting's ranking
    "report",
    "doc_blocks",  # the docs' generated blocks: markers, rewrite, diff
    "doc_tables",  # the shipped recipes' tables
    "doc_example",  # auto-fit's worked example
    "docs",  # python -m video_grpo.plan --markdown
    "shipped",  # python -m video_grpo.plan --shipped_cache: the cache shipped in the package
    "cli",
    "startup",
    "__main__",
)


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    modules = {}
    for path in sorted((SRC / "video_grpo").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``video_grpo`` modules that ``name`` imports anywhere in its file. ``from P import x`` counts as
    ``P.x`` when that is a module, else as ``P``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules and module != name}


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_product(module: str) -> bool:
    return module.startswith("video_grpo") and not any(in_package(module, p) for p in NON_PRODUCT)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_reader_sees_imports_inside_functions_and_from_package_imports():
    """The graph is only as good as the reader: the lazy imports inside functions and ``from P import module``
    must both be edges."""
    graph = import_graph()
    assert "video_grpo.bench.shared_prefix" in graph["video_grpo.bench.perf"]  # inside perf()
    assert (
        "video_grpo.bench.learning_runs" in graph["video_grpo.bench.learning"]
    )  # from video_grpo.bench import
    assert "video_grpo.evaluate" in graph["video_grpo.trainer"]  # inside a method
    assert len(graph) > 40


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_a_cycle_is_found():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_product_imports_neither_bench_nor_toys():
    wrong = {
        module: sorted(t for t in targets if not is_product(t))
        for module, targets in import_graph().items()
        if is_product(module)
    }
    assert not {module: targets for module, targets in wrong.items() if targets}


def test_toys_import_no_benchmark():
    graph = import_graph()
    toys = {m: graph[m] for m in graph if in_package(m, "video_grpo.toys")}
    assert toys and not {m: t for m, t in toys.items() if any(in_package(x, "video_grpo.bench") for x in t)}


def test_emit_is_at_the_bottom():
    assert import_graph()["video_grpo.bench.emit"] == set()


def test_the_product_reaches_the_planner_only_through_its_startup_summary():
    graph = import_graph()
    wrong = {
        module: sorted(t for t in targets if in_package(t, PLAN) and t not in PLAN_ENTRY_POINTS)
        for module, targets in graph.items()
        if is_product(module) and not in_package(module, PLAN)
    }
    assert not {module: targets for module, targets in wrong.items() if targets}
    assert (
        "video_grpo.plan.startup" in graph["video_grpo.grpo"]
    )  # the rule's reader sees the one edge there is


def test_the_planner_modules_import_only_earlier_stages():
    graph = import_graph()
    planner = {m for m in graph if in_package(m, PLAN) and m != PLAN}
    assert planner == {f"{PLAN}.{name}" for name in PLAN_LAYERS}, "PLAN_LAYERS must list every planner module"
    order = {f"{PLAN}.{name}": index for index, name in enumerate(PLAN_LAYERS)}
    upward = {
        module: sorted(t for t in graph[module] if in_package(t, PLAN) and order.get(t, -1) >= order[module])
        for module in planner
    }
    assert not {module: targets for module, targets in upward.items() if targets}
    assert not any(module.startswith("video_grpo.plan_") for module in graph)  # no flat planner modules left


def top_modules() -> list[str]:
    return sorted(p.stem for p in (SRC / "video_grpo").glob("*.py") if p.stem != "__init__")


def test_the_top_holds_at_most_twenty_modules():
    top = top_modules()
    assert "grpo" in top and "trainer" in top  # the reader sees the top
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of src/video_grpo/: {top}"


def stage_of(module: str) -> str | None:
    """The stage package a module is in, ``"top"`` for a top-level module, or the tool package's name."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[1] in STAGES or parts[1] in TOOLS:
        return parts[1]
    return "top"


def upward_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per stage module, the imports that go up: to the top, to a tool, or to a stage at or above its own."""
    order = {stage: index for index, stage in enumerate(STAGES)}
    found = {}
    for module, targets in graph.items():
        own = stage_of(module)
        if own not in order or module in STAGE_COMMANDS:
            continue
        wrong = sorted(
            t
            for t in targets
            if stage_of(t) != own and (stage_of(t) not in order or order[stage_of(t)] > order[own])
        )
        if wrong:
            found[module] = wrong
    return found


def test_stage_packages_import_only_the_stages_below():
    graph = import_graph()
    assert {stage_of(m) for m in graph} >= set(STAGES)  # every stage is a package of the tree
    assert not upward_imports(graph)


def test_an_upward_import_is_found():
    graph = {
        "video_grpo.data.video": {"video_grpo.configs"},  # up to the top
        "video_grpo.inputs.prefix": {
            "video_grpo.rollout.decode",
            "video_grpo.data.video",
        },  # up a stage; down
        "video_grpo.runtime.memory_meters": {"video_grpo.plan.layers"},  # to a tool
        "video_grpo.data.check": {"video_grpo.configs"},  # the data check's command may
    }
    assert upward_imports(graph) == {
        "video_grpo.data.video": ["video_grpo.configs"],
        "video_grpo.inputs.prefix": ["video_grpo.rollout.decode"],
        "video_grpo.runtime.memory_meters": ["video_grpo.plan.layers"],
    }


def test_a_plugin_named_by_its_flat_path_still_loads():
    """Recipes written before the move name plug-ins by the flat 0.1 paths."""
    from video_grpo.rewards import resolve_reward_funcs, tiou_reward
    from video_grpo.rewards.span_sets import twass_score

    old = resolve_reward_funcs(["video_grpo.span_sets:twass_score", "video_grpo.rewards:tiou_reward"])
    assert [f.__wrapped__ if hasattr(f, "__wrapped__") else f for f in old] == [twass_score, tiou_reward]
