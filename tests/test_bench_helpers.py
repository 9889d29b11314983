"""bench/benchlib.py (results metadata, medians) and bench/report.py's rendering of a results file."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load(name: str):
    sys.path.insert(0, str(ROOT / "bench"))  # report.py imports benchlib from beside it
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


benchlib = _load("benchlib")

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16
"""


def test_cpu_info_reads_the_model_and_the_flags_that_choose_the_kernels():
    info = benchlib.cpu_info(CPUINFO)
    assert info["model"] == "Intel(R) Xeon(R) Platinum 8488C"
    assert info["flags"] == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"]
    assert info["bf16"] is True and info["amx"] is True
    old = benchlib.cpu_info("model name\t: Old CPU\nflags\t\t: sse2 avx2\n")
    assert old["flags"] == ["avx2"] and old["bf16"] is False and old["amx"] is False


def test_metadata_records_versions_threads_and_the_load_at_both_ends(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    meta = benchlib.metadata("unit", argv=["--quick"], packages=("numpy", "no-such-distribution-sg"))
    assert meta["versions"]["sparkgrad"] == benchlib.sparkgrad_version() != "unknown"
    assert meta["versions"]["numpy"] and meta["versions"]["no-such-distribution-sg"] is None
    assert meta["threads"]["OMP_NUM_THREADS"] == "3" and meta["argv"] == ["--quick"]
    assert len(meta["load_average_start"]) == 3 and "model" in meta["cpu"]
    rows = [benchlib.row("s", "m", 1.5, "s"), benchlib.not_measured("anchor", "m", "no tensorflow")]
    written = benchlib.write_results(tmp_path / "r.json", rows, meta)
    assert len(written["load_average_end"]) == 3 and "load_average_end" not in meta
    got_meta, got_rows = benchlib.read_results(tmp_path / "r.json")
    assert got_rows == rows and got_meta["bench"] == "unit" and got_meta["finished"]
    (tmp_path / "old.json").write_text(json.dumps(rows))  # a file from before the metadata
    assert benchlib.read_results(tmp_path / "old.json") == (None, rows)
    (tmp_path / "bad.json").write_text('{"rows": 3}')
    with pytest.raises(ValueError, match="expected a list of rows"):
        benchlib.read_results(tmp_path / "bad.json")


def test_summarise_gives_median_min_max_runs_and_spread():
    s = benchlib.summarise([3.0, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": 3, "spread": 1.0}
    assert benchlib.summarise([4.0, 2.0])["median"] == 3.0
    with pytest.raises(ValueError, match="no measurements"):
        benchlib.summarise([])
    r = benchlib.median_row("sg", "rate", [10.04, 12.0, 11.26], "1/s", digits=1, config="x")
    assert r == {"system": "sg", "metric": "rate", "value": 11.3, "unit": "1/s", "min": 10.0, "max": 12.0,
                 "runs": 3, "config": "x"}  # fmt: skip
    assert benchlib.median_row("sg", "n", [1.4, 2.6], "", digits=0)["value"] == 2
    calls = iter([5.0, 7.0, 6.0])
    assert benchlib.repeat(lambda: next(calls), 3)["median"] == 6.0
    runs = [{"wall_s": 2.0, "ok": True, "name": "a"}, {"wall_s": 4.0}, {"wall_s": 3.0}]
    assert benchlib.summarise_runs(runs) == {"wall_s": 3.0, "wall_s_min": 2.0, "wall_s_max": 4.0, "runs": 3}


def test_report_renders_a_file_with_metadata_and_rows_not_measured(tmp_path, monkeypatch):
    report = _load("report")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    meta = benchlib.metadata("train", argv=[])
    meta["notes"] = ["a note the bench wrote"]
    rows = [
        benchlib.median_row("sparkgrad", "mlp_b100_t1_samples_per_s", [90.0, 100.0, 110.0], "samples/s (median)"),
        benchlib.row("torch", "mlp_b100_t1_samples_per_s", 50.0, "samples/s", config="torch.compile"),
        benchlib.not_measured("keras", "mlp_b100_t1_samples_per_s", "no tensorflow here"),
    ]
    benchlib.write_results(tmp_path / "train.json", rows, meta)
    text = report.render()
    assert "| MLP, 1 thread | sparkgrad | torch (torch.compile) | 100 samples/s | 50 samples/s | 2.00x |" in text
    assert "not measured: no tensorflow here" in text and "- a note the bench wrote" in text
    assert "median of 3, 90–110 (20%)" in text
    raw = report.render_raw()
    assert "| keras | mlp_b100_t1_samples_per_s | not measured: no tensorflow here |" in raw
    assert f"sparkgrad {benchlib.sparkgrad_version()}" in raw
    (tmp_path / "train.json").write_text(json.dumps(rows))  # the same rows without metadata
    assert "not recorded" in report.render() and "not recorded" in report.render_raw()


def test_every_bench_script_writes_its_results_through_benchlib():
    """One writer for every results file, so each records its metadata (versions, CPU, threads, load)."""
    scripts = sorted((ROOT / "bench").glob("bench_*.py")) + [ROOT / "bench" / "accuracy_cnn.py"]
    missing = [p.name for p in scripts if "benchlib.write_results(" not in p.read_text()]
    assert scripts and not missing, f"results written without bench/benchlib.py: {missing}"


def test_python_with_finds_the_first_interpreter_that_imports_the_modules_or_says_why():
    assert benchlib.python_with(["/nonexistent/python", sys.executable], ["json"]) == (sys.executable, "")
    python, why = benchlib.python_with(["/nonexistent/python", sys.executable], ["no_such_module_here"])
    assert python is None
    assert "/nonexistent/python: absent" in why and "No module named 'no_such_module_here'" in why


# ---- bench_tabular.py's data and scores -------------------------------------------------------------


def test_run_worker_returns_the_last_json_line_or_says_why_there_is_none(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        "import json, sys\n"
        "mode = sys.argv[2]\n"
        "print('noise')\n"
        "if mode == 'fail':\n"
        "    sys.exit('broke on purpose')\n"
        "print(json.dumps({'unsupported': 'no bf16'} if mode == 'unsupported' else {'rate': 7}))\n"
    )
    run = benchlib.run_worker
    assert run(str(script), sys.executable, ["ok"], dict(os.environ), 60) == ({"rate": 7}, "")
    assert run(str(script), sys.executable, ["unsupported"], dict(os.environ), 60) == (None, "no bf16")
    res, why = run(str(script), sys.executable, ["fail"], dict(os.environ), 60)
    assert res is None and why == "exit status 1: broke on purpose"


def test_tabular_cardinalities_are_criteo_capped_to_the_table_budget():
    tab = _load("bench_tabular")
    for budget in (2_000_000, 220_000):
        cards = tab.capped_cardinalities(budget)
        cap = max(cards)
        assert budget - len(cards) < sum(cards) <= budget  # the largest cap that fits
        assert [min(c, cap) for c in tab.CRITEO_CARDINALITIES] == cards
    assert tab.capped_cardinalities(10**9) == list(tab.CRITEO_CARDINALITIES)


def test_tabular_roc_auc_counts_pairs_with_ties_as_halves_and_r2_is_one_minus_the_residual_share():
    import numpy as np

    tab = _load("bench_tabular")
    rng = np.random.default_rng(3)
    y = rng.random(300) < 0.3
    s = rng.integers(0, 20, 300).astype(np.float32)  # many ties
    pos, neg = s[y], s[~y]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert tab.roc_auc(y, s) == pytest.approx(pairs / (len(pos) * len(neg)), abs=1e-12)
    assert tab.roc_auc([0, 1, 0, 1], [0.1, 0.9, 0.2, 0.8]) == 1.0
    with pytest.raises(ValueError, match="both classes"):
        tab.roc_auc([1, 1], [0.2, 0.3])
    t = rng.normal(size=100)
    assert tab.r2_score(t, t) == 1.0 and tab.r2_score(t, np.full(100, t.mean())) == pytest.approx(0.0)


def test_tabular_data_has_the_structure_the_bench_claims():
    import numpy as np

    tab = _load("bench_tabular")
    cards = tab.capped_cardinalities(220_000)
    d = tab.click_data(20_000, cards, seed=5)
    assert d["cat"].dtype == np.int32 and d["cat"].shape == (20_000, 26) and d["num"].shape == (20_000, 13)
    starts = np.concatenate([[0], np.cumsum(cards)[:-1]])
    local = d["cat"] - starts
    assert (local >= 0).all() and (local < np.array(cards)).all()  # each column inside its own table
    big = int(np.argmax(cards))  # Zipf ids: the 1% most frequent rows of the largest table take most draws
    counts = np.sort(np.bincount(local[:, big], minlength=cards[big]))[::-1]
    assert counts[: cards[big] // 100].sum() > 0.4 * len(local)
    assert 0.2 < d["y"].mean() < 0.4 and tab.roc_auc(d["y"], d["p"]) > 0.8  # learnable, and not trivially
    r = tab.rossmann_data(20_000)
    assert r["cat"].shape == (20_000, 13) and abs(float(r["y"].std()) - 1) < 1e-3 and 0.8 < 1 - r["noise_var"] < 0.95


def test_tabular_report_compares_with_each_anchor_at_its_best_and_the_ps_rows(tmp_path, monkeypatch):
    tab, report = _load("bench_tabular"), _load("report")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    m = "click_b512_t1_samples_per_s"

    def worker(rate, nbytes):  # what one ps worker process reports
        return {"rates": [rate, rate * 1.1, rate * 0.9], "bytes_per_step": nbytes, "steps_per_segment": 20,
                "security": "auth"}  # fmt: skip

    rows = [
        benchlib.not_measured("sparkgrad", m, "sparkgrad: Embedding not available", "samples/s"),
        benchlib.median_row("torch", m, [40e3, 50e3, 45e3], "samples/s (median)", config="sparse + SparseAdam, eager"),
        benchlib.row("torch", "click_auc_median", 0.76, "AUC (median over 3 seeds)", config="sparse"),
        benchlib.row("sparkgrad", "click_auc_median", 0.758, "AUC (median over 3 seeds)"),
        *tab.ps_result_rows(
            {
                True: ([worker(10e3, 1e6), worker(11e3, 1.2e6)], ""),
                False: ([worker(500.0, 1e8), worker(510.0, 1e8)], ""),
            }
        ),
    ]
    failed = tab.ps_result_rows({True: (None, "a worker failed"), False: (None, "a worker failed")})
    assert len(failed) == 4 and all(r["value"] is None and r["reason"] == "a worker failed" for r in failed)
    lines = {(ln["name"], ln["anchor"]): ln for ln in report.comparison_lines("tabular", rows)}
    speed = lines[("wide-and-deep click model, 1 thread", "torch (sparse + SparseAdam, eager)")]
    assert speed["ratio"] is None and speed["theirs"]["value"] == 45e3
    assert lines[("wide-and-deep click model, AUC (median over seeds)", "torch (sparse)")]["ratio"] == pytest.approx(
        -0.002
    )
    ps_speed = lines[("ps, 1M-row table: samples/s", "sparkgrad ps, 1 ps + 2 workers, dense table")]
    assert ps_speed["ratio"] == pytest.approx(21e3 / 1010.0, rel=1e-3)  # both workers' rates summed
    ps_bytes = lines[("ps, 1M-row table: bytes on the wire per step", "sparkgrad ps, 1 ps + 2 workers, dense table")]
    assert ps_bytes["ratio"] == pytest.approx(1e8 / 1.1e6, rel=1e-3)
    benchlib.write_results(tmp_path / "tabular.json", rows, benchlib.metadata("tabular", argv=[]))
    assert "not measured: sparkgrad: Embedding not available" in report.render()


def test_torch_and_tables_reports_compare_with_their_anchors_and_grey_out_the_floors(tmp_path, monkeypatch):
    report = _load("report")
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    formed = "cnn: formation, second run() in the driver (2 ranks, 937 steps)"
    ar = "allreduce 4 MB float32, 2 ranks on local Spark"
    torch_rows = [
        benchlib.median_row("TorchDistributor (DDP, gloo)", formed, [8.0, 9.0, 10.0], "s"),
        benchlib.median_row("sparkgrad.torch.Distributor (DDP, gloo)", formed, [0.4, 0.5, 0.6], "s"),
        benchlib.not_measured("sparkgrad.hvd.torch (DistributedOptimizer)", formed, "no torch", "s"),
        benchlib.median_row("TorchDistributor (DDP, gloo)", "cnn: step, first run()", [0.01] * 3, "s/step"),
        benchlib.median_row("sparkgrad.hvd.torch allreduce_", ar, [0.001] * 3, "s", digits=5),
        benchlib.median_row("torch.distributed.all_reduce (gloo)", ar, [0.004] * 3, "s", digits=5),
    ]
    lines = {(ln["name"], ln["system"]): ln for ln in report.comparison_lines("torch", torch_rows)}
    assert lines[(formed, "sparkgrad.torch.Distributor (DDP, gloo)")]["ratio"] == pytest.approx(18.0)
    assert lines[(formed, "sparkgrad.hvd.torch (DistributedOptimizer)")]["ratio"] is None
    assert lines[(ar, "sparkgrad.hvd.torch allreduce_")]["ratio"] == pytest.approx(4.0)
    assert not any(name.startswith("cnn: step") for name, _ in lines)  # s/step rows are not compared
    # where the bench paired its runs, the line shows the median of those ratios, not the ratio of the medians
    paired = "cnn: formation, second run() in the driver, TorchDistributor / sparkgrad.torch.Distributor (DDP, gloo)"
    torch_rows += [
        benchlib.median_row("ratio", paired, [15.0, 16.0, 25.0], "x"),
        benchlib.median_row("ratio", f"{ar}: gloo / sparkgrad", [3.0, 3.5, 5.0], "x"),
    ]
    lines = {(ln["name"], ln["system"]): ln for ln in report.comparison_lines("torch", torch_rows)}
    assert lines[(formed, "sparkgrad.torch.Distributor (DDP, gloo)")]["ratio"] == pytest.approx(16.0)
    assert lines[(ar, "sparkgrad.hvd.torch allreduce_")]["ratio"] == pytest.approx(3.5)
    fit = "seconds, list<float>, 2 workers, 2 epochs"
    rate = "rows/s, list<float>, 1 worker"
    table_rows = [
        benchlib.median_row("sparkgrad ParquetDataset", rate, [90e3] * 3, "rows/s"),
        benchlib.median_row("pyarrow -> NumPy (file floor)", rate, [100e3] * 3, "rows/s"),
        benchlib.not_measured("Petastorm 0.13", rate, "No module named 'pyarrow.filesystem'", "rows/s"),
        benchlib.median_row("Estimator.fit, one task per worker (files)", fit, [2.0] * 3, "s"),
        benchlib.median_row("Estimator.fit, --fit-baseline (feeding tasks)", fit, [6.0] * 3, "s"),
        benchlib.median_row(report.TABLES_FIT[2], fit.replace("seconds", "seconds of a worker's work"), [1.5] * 3, "s"),
        benchlib.median_row("Estimator.fit, one task per worker (files)", f"{fit}, second fit", [1.0] * 3, "s"),
        benchlib.median_row("Estimator.fit, --fit-baseline (feeding tasks)", f"{fit}, second fit", [5.0] * 3, "s"),
    ]
    lines = {(ln["name"], ln["anchor"]): ln for ln in report.comparison_lines("tables", table_rows)}
    assert lines[(rate, "pyarrow -> NumPy (file floor)")]["ratio"] == pytest.approx(0.9)
    assert lines[(rate, "Petastorm 0.13")]["ratio"] is None
    assert lines[(f"Estimator.fit, {fit}", "Estimator.fit, --fit-baseline (feeding tasks)")]["ratio"] == 3.0
    assert lines[(f"Estimator.fit, {fit}", report.TABLES_FIT[2])]["ratio"] == pytest.approx(0.75)
    second = f"Estimator.fit, {fit}, second fit"
    assert lines[(second, "Estimator.fit, --fit-baseline (feeding tasks)")]["ratio"] == 5.0
    assert (second, report.TABLES_FIT[2]) not in lines  # the worker's floor is compared with the first fit only
    assert (second, report.TABLES_FIT[3]) not in lines  # no Spark floor row in this table
    assert report._is_bound("pyarrow -> NumPy (file floor)") and not report._is_bound("Petastorm 0.13")
    benchlib.write_results(tmp_path / "tables.json", table_rows, benchlib.metadata("tables", argv=[]))
    assert "not measured: No module named 'pyarrow.filesystem'" in report.render()


def test_tables_binary_goal_is_taken_against_the_tfrecord_reader_that_yields_the_same_floats(tmp_path):
    import numpy as np
    from sparkgrad.data import FixedLenFeature, TFRecordDataset, TFRecordWriter, encode_example

    tables = _load("bench_tables")
    rows = np.arange(2 * 784, dtype=np.uint8).reshape(2, 784)
    path = str(tmp_path / "t.tfrecords")
    with TFRecordWriter(path) as w:
        for r in rows:
            w.write(encode_example({"pixels": r.tobytes(), "label": np.array([1])}))
    schema = {"pixels": FixedLenFeature([], "bytes"), "label": FixedLenFeature([], "int64")}
    batch = next(iter(TFRecordDataset([path], tables.decoded_schema(schema), 2)))
    assert batch["pixels"].dtype == np.float32 and batch["pixels"].shape == (2, 784)  # what ParquetDataset gives
    np.testing.assert_array_equal(batch["pixels"], rows.astype(np.float32))
    binary, floats_metric = "rows/s, binary[784], 1 worker", "rows/s, array<float>[784], 1 worker"
    measured = [
        benchlib.row(tables.PARQUET_DS, binary, 600.0, "rows/s"),
        benchlib.row(tables.TFRECORD_DS, binary, 2000.0, "rows/s"),
        benchlib.row(tables.TFRECORD_DECODED, binary, 1000.0, "rows/s"),
        benchlib.row(tables.PARQUET_DS, floats_metric, 100.0, "rows/s"),
        benchlib.row(tables.TFRECORD_DS, floats_metric, 400.0, "rows/s"),
    ]
    ratios = {(r["system"], r["metric"]): r["value"] for r in tables.goal_ratios(measured)}
    assert ratios[(f"{tables.PARQUET_DS} / {tables.TFRECORD_DECODED}", "ratio, binary[784], 1 worker")] == 0.6
    assert (f"{tables.PARQUET_DS} / {tables.TFRECORD_DS}", "ratio, binary[784], 1 worker") not in ratios
    assert ratios[(f"{tables.PARQUET_DS} / {tables.TFRECORD_DS}", "ratio, array<float>[784], 1 worker")] == 0.25


def test_kept_rows_carry_an_earlier_files_other_rows_and_say_which_run(tmp_path):
    rows = [benchlib.row("a", "allreduce 1 MB", 1.0, "s"), benchlib.row("b", "cnn: step", 2.0, "s/step")]
    meta = benchlib.metadata("torch", argv=[])
    benchlib.write_results(tmp_path / "torch.json", rows, meta)
    kept, old = benchlib.kept_rows(tmp_path / "torch.json", lambda r: r["metric"].startswith("allreduce "))
    assert kept == rows[:1] and old["started"] == meta["started"]
    assert benchlib.run_of(old) == f"the run of {meta['started']} (commit {meta.get('commit', '?')})"
    assert benchlib.kept_rows(tmp_path / "none.json", lambda r: True) == ([], {})
