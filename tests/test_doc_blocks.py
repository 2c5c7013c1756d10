"""The docs' generated blocks (video_grpo.plan.doc_blocks, ``python -m video_grpo.plan --markdown``): a block is
rewritten between its markers and nowhere else, a differing block is reported with a diff and exit code 1, and a
page whose markers are broken is refused by name. Text only: the real blocks are made and compared in
tests/test_plan.py, in the process that plans every shipped recipe."""

from __future__ import annotations

import re

import pytest

from video_grpo.plan import cli, docs
from video_grpo.plan.doc_blocks import block_diffs, read_block, replace_blocks
from video_grpo.plan.doc_tables import DocPlans

PAGE = """# A page

Prose that stays.

<!-- plan:table begin -->
| old | table |
<!-- plan:table end -->

More prose, with `<!-- plan:table begin -->` quoted inline (not a marker line).

<!-- plan:example begin -->
old example
<!-- plan:example end -->
"""


def outside_blocks(text: str) -> str:
    """``text`` with every block emptied: what a rewrite must leave as it was."""
    return re.sub(r"(?ms)^(<!-- plan:\w+ begin -->\n).*?^(<!-- plan:\w+ end -->)$", r"\1\2", text)


def test_a_block_is_replaced_between_its_markers_only():
    new = replace_blocks(PAGE, {"table": "| new | table |\n|---|---|", "example": "new example\n"})
    assert read_block(new, "table") == "\n| new | table |\n|---|---|\n\n"  # a blank line on each side
    assert read_block(new, "example") == "\nnew example\n\n"
    assert outside_blocks(new) == outside_blocks(PAGE)  # the inline quote of a marker is prose, left alone
    assert "`<!-- plan:table begin -->` quoted inline" in new
    assert replace_blocks(new, {"table": "| new | table |\n|---|---|"}) == new  # rewriting is idempotent


def test_a_differing_block_gives_a_diff_and_an_equal_one_none():
    page = replace_blocks(PAGE, {"table": "| old | table |", "example": "old example"})
    diffs = block_diffs(page, {"table": "| old | table |", "example": "new example"}, "page.md")
    assert len(diffs) == 1
    assert "page.md (plan:example, committed)" in diffs[0]
    assert "-old example" in diffs[0] and "+new example" in diffs[0]


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("no markers\n", "0 lines '<!-- plan:table begin -->'"),
        (PAGE + "<!-- plan:table begin -->\n<!-- plan:table end -->\n", "2 lines"),
        ("<!-- plan:table begin -->\n| t |\n", "has no '<!-- plan:table end -->' line"),
    ],
)
def test_broken_markers_are_refused_by_page_and_name(page, message):
    with pytest.raises(ValueError, match="page.md: ") as error:
        read_block(page, "table", "page.md")
    assert message in str(error.value)


def test_the_command_writes_and_checks_the_pages(tmp_path, monkeypatch, capsys):
    """``--markdown --check`` exits 1 with the diff while a block differs, ``--write`` rewrites it, and the check
    then passes; ``--write`` without ``--markdown`` is refused. The blocks here are made by a stand-in (planning
    every shipped recipe is tests/test_plan.py's)."""
    (tmp_path / "page.md").write_text(PAGE)
    monkeypatch.setattr(docs, "DocPlans", lambda: DocPlans(tmp_path))
    monkeypatch.setattr(
        docs,
        "BLOCKS",
        {
            "table": ("page.md", lambda plans, fit: "| new | table |"),
            "example": ("page.md", lambda plans, fit: "old example"),
        },
    )
    assert cli.main(["--markdown", "--check"]) == 1
    out = capsys.readouterr()
    assert "+| new | table |" in out.out and "--markdown --write" in out.err
    assert cli.main(["--markdown", "--write"]) == 0
    assert read_block((tmp_path / "page.md").read_text(), "table") == "\n| new | table |\n\n"
    assert cli.main(["--markdown", "--check"]) == 0
    assert "all 2 blocks are what the planner gives" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--write"])
    assert "--write and --check go with --markdown" in capsys.readouterr().err
