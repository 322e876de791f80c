from bench.bench_downsample import main, synthetic_runs


def test_bench_runs_small_and_downsampling_shrinks_the_payload(tmp_path, capsys):
    out = tmp_path / "downsample.json"
    results = main(
        [
            "--runs",
            "3",
            "--steps",
            "400",
            "--metrics",
            "2",
            "--max-points",
            "50",
            "--repeat",
            "1",
            "--out",
            str(out),
        ]
    )
    assert out.is_file()
    assert results["points_in"] == 3 * 400 * 2
    assert results["figures_minmax"]["payload_mb"] < results["figures_full"]["payload_mb"]
    assert results["lists_minmax"]["payload_mb"] < results["lists_full"]["payload_mb"]
    assert "targets met" in capsys.readouterr().out


def test_synthetic_runs_shape():
    data = synthetic_runs(n_runs=2, n_steps=10, n_metrics=12)
    assert len(data) == 12 and all(len(per_run) == 2 for per_run in data.values())
    steps, values = next(iter(next(iter(data.values())).values()))
    assert steps.tolist() == list(range(10)) and values.shape == (10,)
