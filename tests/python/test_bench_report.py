"""bench/RESULTS.md is what bench/run_all.py makes of the JSON results kept beside it: no number
in the report is typed by hand."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import run_all  # noqa: E402


def test_results_md_is_rendered_from_the_kept_json():
    results = ROOT / "bench" / "results"
    rendered = run_all.render(results, "scripts/gpu-check bench", run_all.stored_note(results))
    assert rendered == (ROOT / "bench" / "RESULTS.md").read_text(), (
        "bench/RESULTS.md differs from its JSON: run "
        "`python3 bench/run_all.py --report-only --out bench/results`")


def test_every_target_row_says_whether_it_is_met():
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    section = text.split("## Against the targets")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 10
    assert all(line.endswith("| yes |") or line.endswith("| **no** |") for line in rows)
