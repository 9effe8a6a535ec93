"""docs/catalog.md is generated from the checks themselves and must stay current."""

from pathlib import Path

from nndoctor.catalog.cli import markdown_catalog


def test_docs_catalog_matches_the_registered_checks():
    path = Path(__file__).parents[1] / "docs" / "catalog.md"
    assert path.read_text() == markdown_catalog(), "regenerate: nndoctor checks --markdown > docs/catalog.md"


def test_catalog_lists_every_runtime_code_of_the_shared_catalog():
    text = markdown_catalog()
    for code in ("M101", "M106", "O101", "O108", "P108", "C101", "C103", "D101", "D109", "L101", "L106",
                 "O104", "O109", "N101", "N105", "B101", "B103", "R101", "R102", "C104", "C105"):
        assert f"| {code} |" in text
    for code in [f"E1{n:02d}" for n in range(1, 29)] + [f"F1{n:02d}" for n in range(1, 14)] + ["F201", "F202", "F203"]:
        assert f"| {code} |" in text, code
