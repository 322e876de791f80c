"""Compacted run folders: a finished run's metrics.jsonl gzipped, read back the same."""

from __future__ import annotations


def test_a_finished_run_compacts_and_reads_back(tmp_path):
    import json

    from trainer.cli import main as cli_main
    from trainer.run_folder.files import compact_run, read_metrics

    run = tmp_path / "cell" / "seed0"
    run.mkdir(parents=True)
    rows = [{"step": s, "reward/accuracy": s / 10} for s in range(5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"status": "stopped"}))
    assert not compact_run(run)  # a run that may resume keeps appending to its text
    (run / "summary.json").write_text(json.dumps({"status": "succeeded"}))
    assert cli_main(["compact", str(tmp_path)]) == 0
    assert not (run / "metrics.jsonl").exists() and (run / "metrics.jsonl.gz").exists()
    assert read_metrics(run) == rows
    first = (run / "metrics.jsonl.gz").read_bytes()
    assert not compact_run(run)  # already compact
    assert first[:2] == b"\x1f\x8b"
