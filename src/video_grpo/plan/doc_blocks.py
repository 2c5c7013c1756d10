"""The planner's numbers in the Markdown docs, kept between markers so a command can rewrite or check them.

A block is the text between ``<!-- plan:NAME begin -->`` and ``<!-- plan:NAME end -->`` (each on its own line) in
a page. :func:`replace_blocks` puts new text there and leaves the rest of the page as it was; :func:`block_diffs`
says, as unified diffs, where a page's blocks differ from what was generated. Hand-written numbers drift (the
settings table did once); numbers between markers are rewritten by ``python -m video_grpo.plan --markdown
--write`` and checked by ``--check`` and ``tests/test_plan.py``.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path


def begin_marker(name: str) -> str:
    return f"<!-- plan:{name} begin -->"


def end_marker(name: str) -> str:
    return f"<!-- plan:{name} end -->"


def _block_span(text: str, name: str, page: str) -> tuple[int, int]:
    """Where block ``name``'s content starts and ends in ``text`` (after the begin line, before the end line)."""
    begin = re.compile(rf"^{re.escape(begin_marker(name))}\n", re.M)
    end = re.compile(rf"^{re.escape(end_marker(name))}$", re.M)
    starts = list(begin.finditer(text))
    if len(starts) != 1:
        raise ValueError(
            f"{page}: {len(starts)} lines '{begin_marker(name)}', expected one; put the block back between "
            f"'{begin_marker(name)}' and '{end_marker(name)}' lines"
        )
    stop = end.search(text, starts[0].end())
    if stop is None:
        raise ValueError(f"{page}: '{begin_marker(name)}' has no '{end_marker(name)}' line after it")
    return starts[0].end(), stop.start()


def stored(content: str) -> str:
    """How a block's content sits between its marker lines: a blank line on each side, so that Markdown ends a
    table or a paragraph before the end marker (GitHub would otherwise read a line after a table as a row)."""
    return "\n" + content.strip("\n") + "\n\n"


def read_block(text: str, name: str, page: str = "the page") -> str:
    """The content of block ``name`` as stored (between its marker lines)."""
    start, stop = _block_span(text, name, page)
    return text[start:stop]


def replace_blocks(text: str, blocks: dict[str, str], page: str = "the page") -> str:
    """``text`` with each named block's content replaced by ``blocks[name]``."""
    for name, content in blocks.items():
        start, stop = _block_span(text, name, page)
        text = text[:start] + stored(content) + text[stop:]
    return text


def block_diffs(text: str, blocks: dict[str, str], page: str = "the page") -> list[str]:
    """A unified diff (committed -> generated) for each block of ``text`` that differs from ``blocks``."""
    diffs = []
    for name, content in blocks.items():
        committed = read_block(text, name, page)
        generated = stored(content)
        if committed != generated:
            diff = difflib.unified_diff(
                committed.splitlines(keepends=True),
                generated.splitlines(keepends=True),
                f"{page} (plan:{name}, committed)",
                f"{page} (plan:{name}, generated)",
            )
            diffs.append("".join(diff))
    return diffs


def by_page(blocks: dict[str, tuple[str, str]]) -> dict[str, dict[str, str]]:
    """``{name: (page, content)}`` regrouped as ``{page: {name: content}}``."""
    pages: dict[str, dict[str, str]] = {}
    for name, (page, content) in blocks.items():
        pages.setdefault(page, {})[name] = content
    return pages


def write_pages(root: Path, blocks: dict[str, tuple[str, str]]) -> list[str]:
    """Rewrite each page's blocks under ``root``; the pages that changed."""
    changed = []
    for page, contents in by_page(blocks).items():
        path = root / page
        before = path.read_text()
        after = replace_blocks(before, contents, page)
        if after != before:
            path.write_text(after)
            changed.append(page)
    return changed


def check_pages(root: Path, blocks: dict[str, tuple[str, str]]) -> list[str]:
    """The diffs between the pages under ``root`` and ``blocks`` (empty when every block is as generated)."""
    diffs = []
    for page, contents in by_page(blocks).items():
        diffs += block_diffs((root / page).read_text(), contents, page)
    return diffs
