"""The docs stay true: what ``README.md`` and ``docs/*.md`` point at exists.

- every relative link (and image) resolves to a file, and its ``#anchor`` to a heading as GitHub slugs it;
- every ``python -m video_grpo.…`` module they name exists and answers ``--help`` (each run once, in a subprocess);
- every dotted ``video_grpo.…`` name is a module, or a name defined at the top of one;
- every ``configs/``, ``scripts/``, ``tests/``, ``src/`` or ``docs/`` path they name exists;
- docs/internals.md's package layout lists every module of the package.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SRC = REPO / "src"
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
MODULE_COMMAND = re.compile(r"-m (video_grpo[\w.]*\w)")
DOTTED_NAME = re.compile(r"(?<![\w./-])video_grpo(?:\.\w+)+")
# a path from the repository root; one that goes on with a pattern ({3b,7b}, …, <id>, *) is a family of files
REPO_PATH = re.compile(r"(?<![\w./-])((?:configs|scripts|tests|src|docs)/[\w./-]*[\w/])([{…<*]?)")


def page_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(text: str) -> str:
    """The page without its fenced code blocks, where a ``[x](y)`` is not a link and ``#`` not a heading."""
    return FENCE.sub("", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation but ``-`` and ``_`` removed,
    spaces turned into hyphens (not collapsed)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a page; a repeated heading gets ``-1``, ``-2``, … as on GitHub."""
    seen: dict[str, int] = {}
    for match in re.finditer(r"^#{1,6} +(.+?) *#*$", prose(path.read_text()), re.M):
        slug = github_slug(match.group(1))
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def module_path(name: str) -> Path | None:
    """The source file of a dotted module name (a package's ``__init__``), if it is one."""
    base = SRC.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def named(pattern: re.Pattern, group: int = 0) -> dict[str, list[str]]:
    """Each match of ``pattern`` in the pages, with the pages that name it."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for match in pattern.finditer(page.read_text()):
            found.setdefault(match.group(group), []).append(page_id(page))
    return found


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            if not resolved.exists():
                broken.append(f"{page_id(page)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page_id(page)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_slugs_follow_github():
    assert github_slug("Training Qwen2.5-VL on a GPU cluster") == "training-qwen25-vl-on-a-gpu-cluster"
    assert github_slug("Sharing the prompt across a group (`shared_prefix`)") == (
        "sharing-the-prompt-across-a-group-shared_prefix"
    )
    assert github_slug("`make demo`") == "make-demo"
    assert github_slug("How `VideoGRPOTrainer` extends TRL") == "how-videogrpotrainer-extends-trl"


def test_every_named_path_exists():
    missing = []
    for page in PAGES:
        for match in REPO_PATH.finditer(page.read_text()):
            path, pattern_follows = match.groups()
            if not pattern_follows and not (REPO / path).exists():
                missing.append(f"{page_id(page)}: {path}")
    assert not missing, "\n".join(missing)


def test_every_dotted_name_is_a_module_or_defined_in_one():
    unknown = []
    for name, pages in named(DOTTED_NAME).items():
        parts = name.split(".")
        # the longest prefix that is a module; the next part, if any, must be defined at its top level
        for cut in range(len(parts), 0, -1):
            path = module_path(".".join(parts[:cut]))
            if path is not None:
                break
        if path is None or (cut < len(parts) and parts[cut] not in top_level_names(path)):
            unknown.append(f"{name} ({', '.join(sorted(set(pages)))})")
    assert not unknown, "\n".join(unknown)


COMMANDS = named(MODULE_COMMAND, group=1)


def test_the_commands_are_found():
    assert {"video_grpo.grpo", "video_grpo.bench", "video_grpo.toys.tiny", "video_grpo.data"} <= set(COMMANDS)


def test_every_python_m_module_answers_help():
    """Each ``python -m`` module the pages name, run with ``--help``: all in one fresh interpreter, one after another
    as ``-m`` runs them (tests/answer_help.py), so torch is imported once, not once per module."""
    missing = {}
    modules = []
    for module in sorted(COMMANDS):
        path = module_path(module)
        if path is None or (path.name == "__init__.py" and not (path.parent / "__main__.py").is_file()):
            missing[module] = "no such module (or a package without __main__.py)"
        else:
            modules.append(module)
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "answer_help.py"), *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(results) == modules
    failed = {
        **missing,
        **{
            module: f"exit {result['code']}: {result['stderr']}"
            for module, result in results.items()
            if result["code"] != 0 or not result["stdout"].strip()
        },
    }
    assert not failed, "\n".join(
        f"{m} (named in {', '.join(sorted(set(COMMANDS[m])))}): {why}" for m, why in failed.items()
    )


def layout_tree_paths(tree: str) -> set[str]:
    """The paths the layout's tree names under ``src/video_grpo/``, from its indentation (two spaces a level):
    ``data/`` then ``  video.py`` is ``data/video.py``."""
    paths, stack = set(), []
    for line in tree.splitlines():
        match = re.match(r"^( +)(\w+\.py|\w+/)(?: |$)", line)
        if not match:
            continue
        depth = len(match.group(1)) // 2 - 1
        stack[depth:] = [match.group(2)]
        paths.add("".join(stack))
    return paths


def test_the_layout_lists_every_module_where_it_is():
    internals = (REPO / "docs" / "internals.md").read_text()
    start = internals.index("## Package layout")
    tree = internals[
        internals.index("```", start) : internals.index("```\n\n", internals.index("```", start) + 3)
    ]
    listed = {path for path in layout_tree_paths(tree) if not path.startswith("..")}
    root = SRC / "video_grpo"
    expected = {str(p.relative_to(root)) for p in root.rglob("*.py") if p.name != "__init__.py"}
    expected |= {f"{p.relative_to(root)}/" for p in root.rglob("*") if (p / "__init__.py").is_file()}
    assert not expected - listed, f"not in docs/internals.md's layout: {sorted(expected - listed)}"
    assert not {name for name in listed - expected if name.endswith(".py")}, (
        f"listed, but no such module: {sorted(n for n in listed - expected if n.endswith('.py'))}"
    )


def test_the_layout_reader_follows_the_indentation():
    tree = "src/video_grpo/   x\n  grpo.py   a\n  data/   b\n    video.py   c\n  trainer.py  d\n"
    assert layout_tree_paths(tree) == {"grpo.py", "data/", "data/video.py", "trainer.py"}


# A number the README states: a decimal (0.213, 46.0, 2.27) or a count with thousands separators (14,336), not part
# of a version (2.14.1), a date or an identifier.
README_NUMBER = re.compile(r"(?<![\w.,/@-])(\d+\.\d+|\d{1,3}(?:,\d{3})+)(?![\w.]*\d)(?![\w/-])")
# a library's version ("TRL 1.16", "transformers 5.24's") is not a measurement
VERSION = re.compile(r"\b(?:TRL|trl|torch|transformers|DeepSpeed|deepspeed|Python) (\d+\.\d+(?:\.\d+)?)")
DOC_LINK = re.compile(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)")
# stated on the front page from elsewhere than the docs: the pinned versions and the paper's arXiv id
README_NUMBERS_FROM_ELSEWHERE = {"2512.14698"}


def readme_claims() -> list[tuple[str, list[str], set[str]]]:
    """(paragraph, its numbers, the docs pages it cites) for each README paragraph, list item or table that states
    numbers. A paragraph or list item cites its own evidence; a table cites none, and takes the pages of the next
    paragraph that does, as a table's numbers are explained and sourced right below it."""
    blocks = []
    for block in re.split(r"\n\s*\n", prose((REPO / "README.md").read_text())):
        if block.strip():
            # each item of a list is a claim of its own, with its own link
            blocks += [item for item in re.split(r"\n(?=- )", block) if item.strip()]
    claims = []
    for index, block in enumerate(blocks):
        numbers = [
            n for n in README_NUMBER.findall(VERSION.sub("", block)) if n not in README_NUMBERS_FROM_ELSEWHERE
        ]
        if not numbers:
            continue
        following = blocks[index:] if block.lstrip().startswith("|") else [block]
        cited = next((set(DOC_LINK.findall(b)) for b in following if DOC_LINK.search(b)), set())
        claims.append((block, numbers, cited))
    return claims


def test_the_readme_numbers_appear_in_the_docs_they_cite():
    """Every number on the front page is one its cited docs page gives (a range's ends included), so the README
    cannot drift from the measured tables: the performance paragraph once kept the 1 + 1-layer ratios after the
    full-depth ones were measured. The demo's paragraph, the fit table and two of the differences state numbers."""
    claims = readme_claims()
    uncited = [claim[:80] for claim, _, cited in claims if not cited]
    assert len(claims) >= 4 and not uncited, uncited
    missing = {}
    for block, numbers, cited in claims:
        text = "\n".join((REPO / page).read_text() for page in cited)
        found = set(README_NUMBER.findall(text))
        absent = [n for n in numbers if n not in found]
        if absent:
            missing[block[:70]] = (sorted(cited), absent)
    assert not missing, missing


def readme_section(heading: str) -> str:
    """The text of the README's ``## heading`` section, to the next ``## ``."""
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_readme_is_a_front_page():
    """The README is read in two minutes (issue 45): at most 8 KB, and exactly its six parts; numbers and evidence
    live in docs/."""
    size = len((REPO / "README.md").read_bytes())
    assert size <= 8192, (
        f"README.md is {size:,} bytes, over 8,192: move the detail to the docs page it belongs to"
    )
    headings = re.findall(r"^#{1,2} (.+)$", prose((REPO / "README.md").read_text()), re.M)
    assert headings == [
        "video_grpo",
        "Quickstart",
        "Training Qwen2.5-VL on a GPU cluster",
        "Will it fit?",
        "What is different from the peers",
        "The docs",
    ], headings


def test_each_difference_links_its_evidence():
    """At most five differences from the peers, one line each, each with a link to its evidence (that the link
    resolves is ``test_every_relative_link_and_anchor_resolves``'s check)."""
    lines = [
        line for line in readme_section("What is different from the peers").splitlines()[2:] if line.strip()
    ]
    items = [line for line in lines if line.startswith("- ")]
    assert 1 <= len(items) <= 5 and items == lines, f"one line per difference, at most five: {lines}"
    unlinked = [item[:60] for item in items if not LINK.search(item)]
    assert not unlinked, f"differences without a link to their evidence: {unlinked}"


def test_the_docs_map_names_every_page():
    """The README's map of the docs links every page of docs/, so a new page is found from the front page."""
    linked = {target.partition("#")[0] for target in LINK.findall(readme_section("The docs"))}
    pages = {f"docs/{page.name}" for page in (REPO / "docs").glob("*.md")}
    assert not pages - linked, f"not in the README's map of the docs: {sorted(pages - linked)}"


def test_the_readme_number_reader():
    assert README_NUMBER.findall("0.213 of 2,048 tokens, 22.7–32.0 / 24.4, 46.0% (2.27×), 30.50 s") == [
        "0.213",
        "2,048",
        "22.7",
        "32.0",
        "24.4",
        "46.0",
        "2.27",
        "30.50",
    ]
    assert (
        README_NUMBER.findall("torch 2.14.1, trl==1.16.0, arXiv 2512.14698v2, Qwen2.5-VL-3B, R1@0.5, 1 + 1")
        == []
    )
