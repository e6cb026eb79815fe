"""bench/RESULTS.md is what bench/run_all.py makes of the JSON results kept beside it: no number
in the report is typed by hand."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_end_to_end_benchmark_runs_a_tiny_model_on_cpu(tmp_path):
    """bench_e2e.py's flow (eager, kernelize, Liger; same logits, loss and gradients checked before timing)
    on a 64-wide model on CPU, so that a GPU run does not find a broken script. Liger may be
    missing here: it is then reported, not fatal."""
    pytest.importorskip("transformers")
    out = tmp_path / "e2e.json"
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_e2e.py"), "--tiny", "--device", "cpu",
                             "--json", str(out)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "KJIT_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    for phase in ("forward", "training"):
        assert {"torch eager", "kjit"} <= set(report[phase]), report
        assert f"{phase} kjit" not in report["errors"], report["errors"]
    grads = report["checks"]["kjit gradients"]  # checked against eager's, parameter by parameter
    assert 0 <= grads["median_relative_error"] <= grads["max_relative_error"] <= 0.1, grads
    rendered = run_all.render(tmp_path, "bench_e2e.py --tiny")  # the report reads both checks
    assert "Forward logits against eager's: kjit relative error" in rendered
    assert "A training step's gradients against eager's, each parameter's relative error: kjit median" in rendered


def test_the_autotuning_table_counts_its_criteria():
    tune = {"device": "GPU", "torch": "2.11.0", "date": "2026-12-04",
            "second_process": {"calls": 2, "seconds": 0.25, "new_entries": 0},
            "rows": [
                {"op": "rms_norm", "dtype": "bfloat16", "rows": 1, "hidden": 4096, "tuned": {"BLOCK": 128},
                 "best": {"BLOCK": 128}, "tune_s": 0.5,
                 "ms": {"default": 0.0040, "exhaustive best": 0.0030, "kjit tuned": 0.0030,
                        "inductor max-autotune": 0.0050, "Liger": 0.0045}},
                {"op": "rms_norm", "dtype": "bfloat16", "rows": 4096, "hidden": 4096, "tuned": {"BLOCK": 512},
                 "best": {"BLOCK": 256}, "tune_s": 0.7,
                 "ms": {"default": 0.0100, "exhaustive best": 0.0090, "kjit tuned": 0.0095}},
            ]}
    text = "\n".join(run_all.tune_lines(tune))
    assert "| rms_norm | bfloat16 | 1 x 4096 | 4.00 | 3.00 (BLOCK=128) | 3.00 (BLOCK=128) | 1.000 | 0.750 | 5.00 (1.67x) | 4.50 | 0.50 |" in text
    assert "within 3% of the exhaustive best: 1 of 2" in text
    assert "no slower than the default (1% noise): 2 of 2" in text
    assert "ahead of inductor's max-autotune: 1 of 1; ahead of Liger: 1 of 1." in text
    assert "tuning 0 buckets" in text
    titled = "\n".join(run_all.tune_lines(tune, "Autotuning, the full sweep"))
    assert "## Autotuning, the full sweep\n" in titled
    assert run_all.tune_lines({}) == []
    merged = dict(tune, second_process=[{"calls": 2, "seconds": 0.25, "new_entries": 0, "runs": "first runs"},
                                        {"calls": 1, "seconds": 0.01, "new_entries": 1, "runs": "a rerun"}])
    text = "\n".join(run_all.tune_lines(merged))
    assert "second process on the same store (first runs) made the same 2 calls' first calls in 0.25 s" in text
    assert "(a rerun) made the same 1 calls' first calls in 0.01 s in all, tuning 1 buckets" in text


def test_merging_a_later_kernels_run(tmp_path):
    row = {"op": "rms_norm", "direction": "forward", "dtype": "bfloat16", "size": "large", "rows": 8,
           "hidden": 16, "bytes": 512, "ms": {"kjit": 2.0}}
    base = {"device": "GPU A", "torch": "2.11", "date": "2026-12-01", "copy_gbps": 100.0,
            "rows": [row, dict(row, op="layer_norm")]}
    (tmp_path / "kernels.json").write_text(json.dumps(base))
    later = dict(base, date="2026-12-06", copy_gbps=110.0,
                 rows=[dict(row, ms={"kjit": 1.0}), dict(row, op="softmax")])
    (tmp_path / "later.json").write_text(json.dumps(later))
    run_all.merge_kernels(tmp_path, [tmp_path / "later.json"])
    rows = json.loads((tmp_path / "kernels.json").read_text())["rows"]
    assert [r["op"] for r in rows] == ["rms_norm", "layer_norm", "softmax"]  # in place, then new
    assert rows[0]["ms"] == {"kjit": 1.0} and rows[0]["copy_gbps"] == 110.0 and rows[0]["date"] == "2026-12-06"
    assert "copy_gbps" not in rows[1]
    (tmp_path / "other.json").write_text(json.dumps(dict(later, device="GPU B")))
    with pytest.raises(SystemExit, match="measured on GPU B, the table on GPU A: not merged"):
        run_all.merge_kernels(tmp_path, [tmp_path / "other.json"])
    (tmp_path / "gpu_alone.json").write_text(json.dumps(dict(later, timing="gpu alone, host queued first")))
    with pytest.raises(SystemExit, match="timed as gpu alone, host queued first, the table as host "
                                         "and GPU together: not merged"):
        run_all.merge_kernels(tmp_path, [tmp_path / "gpu_alone.json"])


def test_kernel_rows_with_host_times(tmp_path):
    row = {"op": "rms_norm", "direction": "backward", "dtype": "bfloat16", "size": "mid", "rows": 8,
           "hidden": 16, "bytes": 1000, "ms": {"kjit": 0.01, "kjit under torch.compile": 0.0101},
           "host_ms": {"kjit": 0.030, "kjit under torch.compile": 0.060}}
    kernels = {"device": "GPU A", "torch": "2.11", "date": "2026-12-06", "copy_gbps": 200.0,
               "timing": "gpu alone, host queued first", "rows": [row]}
    (tmp_path / "kernels.json").write_text(json.dumps(kernels))
    text = run_all.render(tmp_path, "cmd")
    assert "the host's queueing not counted" in text
    assert "| rms_norm | backward | bfloat16 | 8 x 16 | 30 | - | - | 60 | - |" in text
    assert "| kernel library under torch.compile vs eager, mid shapes, GPU time | median 1.010x, worst 1.010x | <= 1.05x | yes |" in text
    assert "| kernel library under torch.compile vs eager, mid shapes, host time | median 2.000x, worst 2.000x | <= 1.05x | **no** |" in text
    later = dict(kernels, device="GPU B", command="with `bench_kernels.py --ops rms_norm`")
    (tmp_path / "kernels-gpu-b.json").write_text(json.dumps(later))
    text = run_all.render(tmp_path, "cmd")
    assert "## Kernel library, a later run on GPU B (`kernels-gpu-b.json`)" in text
    assert "Measured on GPU B (torch 2.11), 2026-12-06, with `bench_kernels.py --ops rms_norm`." in text
    assert text.count("| rms_norm | backward | bfloat16 | 8 x 16 | 30 | - | - | 60 | - |") == 2
    # The later run's rows count against the targets too, named as its run.
    assert ("| kernel library under torch.compile vs eager, mid shapes, GPU time (GPU B, `kernels-gpu-b.json`) "
            "| median 1.010x, worst 1.010x | <= 1.05x | yes |") in text
    # A superseded run (a 'before' kept for comparison) is a table, not a target.
    (tmp_path / "kernels-gpu-c.json").write_text(json.dumps(dict(later, device="GPU C", superseded=True)))
    text = run_all.render(tmp_path, "cmd")
    assert "## Kernel library, a later run on GPU C (`kernels-gpu-c.json`)" in text
    assert "(GPU C, `kernels-gpu-c.json`)" not in text
