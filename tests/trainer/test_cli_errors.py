"""Every error of the trainer's command line is a message naming what is wrong, not
a traceback: an --out that cannot be made is said as such."""

from __future__ import annotations

from trainer.cli import main as cli_main


def test_a_run_into_an_unwritable_out_is_a_message(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    code = cli_main(
        ["run", "--preset", "moe-grpo", "--set", "run.steps=1", "--out", str(a_file / "run")]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err
    assert str(a_file) in err
