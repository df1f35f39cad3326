"""One licence, stated alike in LICENSE, pyproject.toml (SPDX expression and licence file) and
CITATION.cff."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_licence_file_pyproject_and_citation_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert project["project"]["license"] == citation["license"] == "MIT"
    assert project["project"]["license-files"] == ["LICENSE"]
    assert licence.startswith("MIT License\n")
    assert re.search(r"^Copyright \(c\) \d{4} headprobe contributors$", licence, re.M)
    assert "Permission is hereby granted, free of charge" in licence
    # an SPDX `license` string and `license-files` need setuptools 77 or later
    (setuptools,) = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert setuptools == "setuptools>=77"
