"""The README's model table is generated from the profiles table; this test fails when they drift."""

from pathlib import Path

from glm53.profiles_doc import END_MARKER, START_MARKER, markdown_table, render

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_table_matches_profiles() -> None:
    text = README.read_text(encoding="utf-8")
    assert render(text) == text, "README profile table drifted: run `python -m glm53.profiles_doc README.md`"


def test_rows_carry_the_seed_facts() -> None:
    rows = markdown_table()
    assert "`[1152, 1152, 1152, 1152, 1152, 0]` (N = 1152 at TP 4 only)" in rows
    assert "| 4 (TP 4) |" in rows and "| 8 (TP 8) |" in rows
    assert "| 256 (also validated: 1024) |" in rows


def test_markers_present_once() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count(START_MARKER) == 1 and text.count(END_MARKER) == 1
