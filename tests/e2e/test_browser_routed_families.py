"""DeepSeek-V3- and GPT-OSS-shaped checkpoints trained from the browser with R3.

For each family a tiny random checkpoint (transformers' own classes,
tests/hf_tiny_checkpoints.py: latent attention, sigmoid group-limited routing with a
live correction bias, a shared expert and a dense first block; sinks, biased experts
with the clamped SwiGLU, alternating sliding/full layers) with a tokenizer of the word
problems' characters is, in a real browser against a real platform (web server,
Celery worker running the trainer CLI, the control queue's worker):

1. registered on the Models & data page, its family shown;
2. picked in the run form with the shipped word problems, R3 switched on, 20 RL
   steps, queued;
3. trained by the worker; the run page shows the routing metrics (routing
   inconsistency, MaxVio) with 20 points and the expert-load heatmap's layer picker
   lists exactly the routed layers (DeepSeek's dense block 0 is not among them);
4. exported from the run page; transformers loads the export to the logits of the
   run's policy (fp32 round-off).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from browser_harness import CHART_POINTS_JS, ceiling_ms, ceiling_s, open_form_field
from hf_tiny_checkpoints import save_char_tokenizer, save_hf_checkpoint, word_problem_characters
from lab_processes import LabStack
from playwright.sync_api import Page, expect

from trainer.hf import build_model, resolve_model_source
from trainer.model.layers import positions_from_mask
from trainer.run.checkpoint import load_checkpoint
from trainer.tasks.text_data import SHIPPED_DATA
from trainer.validation import validate_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(ceiling_s(900))]
transformers = pytest.importorskip("transformers")

STEPS = 20
FORM_VALUES = {
    "run.steps": str(STEPS),
    "run.threads": "1",
    "run.eval_every": "10",
    "run.checkpoint_every": "10",
    "warm_start.max_steps": "4",
    "warm_start.eval_every": "4",
    "warm_start.eval_size": "8",
    "rollout.prompts_per_step": "2",
    "rollout.group_size": "4",
    "algorithm.minibatches": "1",
    "model.max_seq_len": "256",
}
ROUTED_LAYERS = {"deepseek_v3": ["1", "2"], "gpt_oss": ["0", "1", "2"]}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    stack = LabStack(root, "filesystem")
    try:
        stack.env["MOE_LAB_CACHE"] = str(root / "cache")
        stack.start_worker("w1")
        stack.start_reconciler()  # the control queue: weight checks and exports
        stack.url = f"http://127.0.0.1:{stack.port}"
        stack.post(
            "/api/datasets",
            {"name": "word-problems", "path": str(SHIPPED_DATA / "word_problems.jsonl")},
        )
        stack.experiment = stack.post(
            "/api/experiments", {"name": "families", "preset": "text-grpo"}
        )
        yield stack
    finally:
        stack.close()


def _log_in(page: Page, lab) -> None:
    page.goto(f"{lab.url}/")
    page.get_by_label("Username").fill("e2e")
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Experiments")).to_be_visible()


def _register(page: Page, lab, name: str, folder: Path, family: str) -> None:
    page.goto(f"{lab.url}/assets/")
    form = page.locator("#register-model")
    form.get_by_label("Name").fill(name)
    form.get_by_label("Checkpoint folder").fill(str(folder))
    form.get_by_role("button", name="Register model").click()
    expect(page.locator("table.runs").first).to_contain_text(name)
    lab.wait_for(
        lambda: any(
            m["name"] == name and m["status"] == "ready" for m in lab.get("/api/models")["results"]
        ),
        ceiling_s(120),
        f"{name}'s weights checked",
    )
    page.reload()
    row = page.locator("table.runs tr", has_text=name)
    expect(row).to_contain_text(family)


def _queue_r3_run(page: Page, lab, name: str) -> int:
    page.goto(f"{lab.url}/experiments/{lab.experiment['id']}/runs/new?preset=text-grpo")
    page.locator("select[name=registered_model]").select_option(name)
    page.locator("select[name=registered_dataset]").select_option("word-problems")
    page.locator("select[name=queue]").first.select_option(lab.queue)
    for path, value in FORM_VALUES.items():
        open_form_field(page, path).fill(value)
    open_form_field(page, "stabilizers.replay.mode").select_option("r3")
    page.get_by_role("button", name="Queue run", exact=True).click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    return int(re.search(r"/runs/(\d+)/$", page.url).group(1))


def _logits_match(run: dict, export_dir: Path) -> float:
    hf = transformers.AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    cfg = resolve_model_source(validate_config(run["config"])).model
    policy = build_model(cfg, cfg.vocab_size).eval()
    policy.load_state_dict(load_checkpoint(Path(run["run_dir"]))["policy"])
    tokens = torch.randint(3, 59, (2, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, :3] = False
    with torch.no_grad():
        ours = policy(tokens, mask).logits
        theirs = hf(
            input_ids=tokens, attention_mask=mask.long(), position_ids=positions_from_mask(mask)
        ).logits
    return float((ours - theirs)[mask].abs().max())


@pytest.mark.parametrize("family", ["deepseek_v3", "gpt_oss"])
def test_a_routed_family_trains_with_r3_from_the_browser_and_exports(
    lab, guard, screenshots, tmp_path, family
):
    folder = tmp_path / f"{family}-tiny"
    save_hf_checkpoint(family, folder)
    save_char_tokenizer(folder, word_problem_characters())
    page = guard.context.new_page()
    _log_in(page, lab)
    _register(page, lab, f"{family}-tiny", folder, family)
    screenshots.take(page, f"{family}-registered")

    run_id = _queue_r3_run(page, lab, f"{family}-tiny")
    done = lab.wait_status(run_id, {"succeeded", "failed"}, timeout=ceiling_s(600))
    assert done["status"] == "succeeded", done["error"]
    assert done["config"]["model"]["family"] == family
    assert done["config"]["stabilizers"]["replay"]["mode"] == "r3"

    page.reload()
    expect(page.locator("[data-field=status]")).to_have_text("succeeded")
    expect(page.locator("[data-field=model-facts]")).to_contain_text(family)
    for chart in ("chart-mismatch-routing_inconsistency", "chart-experts-max_violation"):
        page.wait_for_function(
            f"() => ({CHART_POINTS_JS})(document.getElementById('{chart}')) >= {STEPS}",
            timeout=ceiling_ms(120),
        )
    layers = page.locator("select[data-layer-picker] option").evaluate_all(
        "options => options.map(o => o.value)"
    )
    assert layers == ROUTED_LAYERS[family]
    if family == "deepseek_v3":  # its correction bias is logged as the selection bias
        expect(page.locator("#chart-router-selection_bias_abs_mean")).to_be_visible()
    page.locator("#chart-mismatch-routing_inconsistency").scroll_into_view_if_needed()
    screenshots.take(page, f"{family}-run")

    page.get_by_text("Export as a Hugging Face checkpoint").click()  # a folded section
    page.get_by_role("button", name="Export the checkpoint").click()
    row = page.locator("table.exports tr", has_text=str(STEPS))
    lab.wait_for(
        lambda: any(e["status"] == "succeeded" for e in lab.get(f"/api/runs/{run_id}/exports")),
        ceiling_s(300),
        "the export",
    )
    page.reload()
    expect(row).to_contain_text("succeeded")
    export_dir = Path(row.locator("code").inner_text())
    assert (export_dir / "config.json").exists()
    assert _logits_match(done, export_dir) < 1e-4
