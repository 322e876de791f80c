"""The worker's pieces on real files: trainer command, tailer, outcome."""

from __future__ import annotations

import json
import sys

from lab.jobs.outcome import outcome
from lab.jobs.spawn import has_checkpoint, trainer_command
from lab.jobs.tailer import MetricsTail
from trainer.launch import Rendezvous, torchrun_command
from trainer.run_folder.files import parse_metric_lines


def test_trainer_command_single_gpu_and_resume(tmp_path):
    cmd = trainer_command(tmp_path / "config.json", tmp_path, resume=False, gpus=1)
    assert cmd == [sys.executable, "-m", "trainer", "run", "--config",
                   str(tmp_path / "config.json"), "--out", str(tmp_path)]  # fmt: skip
    assert trainer_command(tmp_path / "c.json", tmp_path, resume=True, gpus=1)[-1] == "--resume"


def test_trainer_command_uses_torchrun_for_several_gpus(tmp_path):
    cmd = trainer_command(tmp_path / "c.json", tmp_path, resume=False, gpus=4)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    assert cmd[5:8] == ["-m", "trainer", "run"]


def test_a_gang_members_trainer_command_is_torchrun_with_the_gangs_rendezvous(tmp_path):
    rdzv = Rendezvous(nnodes=2, endpoint="10.0.0.5:29400", run_id="run3-a1", join_timeout_s=120)
    cmd = trainer_command(tmp_path / "c.json", tmp_path, resume=True, gpus=1, rendezvous=rdzv)
    trainer = ["-m", "trainer", "run", "--config", str(tmp_path / "c.json"),
               "--out", str(tmp_path), "--resume"]  # fmt: skip
    assert cmd == torchrun_command(trainer, nproc_per_node=1, rendezvous=rdzv)


def test_has_checkpoint(tmp_path):
    assert not has_checkpoint(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    assert not has_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"x")
    assert has_checkpoint(tmp_path)


def test_tail_reads_complete_lines_only_and_restarts_after_a_rewrite(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read_new() == []  # no file yet
    with path.open("w") as fh:
        fh.write('{"step": 0, "a": 1}\n{"step": 1, "a"')
        fh.flush()
        assert [r["step"] for r in tail.read_new()] == [0]
        fh.write(': 2}\nnot json\n{"step": 2, "a": 3}\n')
        fh.flush()
        assert [r["step"] for r in tail.read_new()] == [1, 2]
        assert tail.read_new() == []
    # A resumed trainer keeps the lines up to its checkpoint: the file shrinks.
    path.write_text('{"step": 0, "a": 1}\n')
    assert [r["step"] for r in tail.read_new()] == [0]
    assert [r["step"] for r in tail.read_all()] == [0]


def test_parse_metric_lines_keeps_the_partial_tail():
    blob = b'{"step": 0}\n\n[1, 2]\n\xff\n{"step": 1, "a": nu'
    records, tail = parse_metric_lines(blob)
    assert records == [{"step": 0}]  # blank, non-object and undecodable lines skipped
    assert tail == b'{"step": 1, "a": nu'
    assert parse_metric_lines(b"") == ([], b"")


def _summary(tmp_path, **fields):
    (tmp_path / "summary.json").write_text(json.dumps(fields))


def test_outcome_from_summary_and_exit_code(tmp_path):
    log = tmp_path / "trainer.log"
    log.write_text("Traceback ...\nRuntimeError: boom\n")
    assert outcome(1, tmp_path, log, cancelled=False)[0] == "failed"
    assert "boom" in outcome(1, tmp_path, log, cancelled=False)[2]
    assert outcome(2, tmp_path, log, cancelled=False)[2].startswith("invalid config")
    assert outcome(-15, tmp_path, log, cancelled=True)[0] == "cancelled"
    _summary(tmp_path, status="succeeded", collapsed=True, collapse_step=40)
    status, summary, error = outcome(0, tmp_path, log, cancelled=False)
    assert (status, summary["collapse_step"], error) == ("succeeded", 40, "")
    _summary(tmp_path, status="cancelled")
    assert outcome(0, tmp_path, log, cancelled=True)[0] == "cancelled"
