"""TRL end to end: the real ``trl.GRPOTrainer`` trains a tiny random Qwen3-MoE on the
CPU for a few steps with ``report_to="mlflow"`` and the router-metrics callback
(integrations/trl_router_metrics.py), logging into a live lab (gunicorn, LabStack)
exactly as docs/integrations.md tells a user to; a lab run of the real trainer
trains in the same experiment through a worker meanwhile.

Then the lab's side: the TRL run is a finished external run with its parameters
and source; TRL's own metrics arrive under the lab's keys (metric_map.py) with
the values TRL logged; the router metrics arrive, the per-expert scalars joined
into the lab's expert-load vectors, and chart; the experiment's stability review
and the compare page hold the lab run and the TRL run side by side.
"""

from __future__ import annotations

import http.cookiejar
import importlib.util
import json
import os
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

import torch  # noqa: E402
from hf_tiny_checkpoints import save_hf_checkpoint  # noqa: E402
from lab_processes import TINY_OVERRIDES, LabStack  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from integrations.trl_router_metrics import DEAD, add_router_metrics  # noqa: E402
from trainer import metric_keys as mk  # noqa: E402
from trainer.hf.builtin_tokenizer import write_builtin_tokenizer  # noqa: E402

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.timeout(600),
    # TRL 1.16 still calls transformers' gradient_checkpointing names (renamed in 5.x)
    pytest.mark.filterwarnings("ignore:.*gradient_checkpointing.*:FutureWarning"),
    # imported where they train (trl alone takes seconds to import, at every collection)
    pytest.mark.skipif(
        importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None,
        reason="needs trl and datasets",
    ),
]

EXPERIMENT = "Qwen3-MoE GRPO: lab vs TRL"
TRL_RUN = "trl-grpo-qwen3moe"
LAB_VARIANT = "lab-moe-grpo"
STEPS = 4
COMPLETIONS_PER_STEP = 8  # per_device_train_batch_size: 2 prompts x 4 generations
MOE_LAYERS = (0, 2)  # the tiny Qwen3-MoE's layer 1 is dense (mlp_only_layers)
N_EXPERTS = 8

# What TRL 1.16's GRPOTrainer (and the transformers Trainer under it) logs at every
# step under these names, and the lab key each is stored under (metric_map.py).
TRL_TO_LAB = {
    "reward": mk.REWARD_MEAN,
    "kl": mk.POLICY_KL_REF,  # logged when beta != 0
    "entropy": mk.POLICY_ENTROPY,
    "clip_ratio/region_mean": mk.POLICY_CLIP_FRAC,
    "completions/mean_length": mk.RESPONSE_LENGTH_MEAN,
    "loss": mk.POLICY_LOSS,
    "grad_norm": mk.POLICY_GRAD_NORM,
    "learning_rate": mk.OPTIM_LR,
}
# Logged by TRL or the callback and stored under their own names (no lab key means them).
AS_LOGGED = (
    "rewards/correct_sum/mean",
    "reward_std",
    "frac_reward_zero_std",
    "completions/clipped_ratio",
    "aux_loss",
    "step_time",
    DEAD,
)
GENERATE_TIME = "profiling/Time taken: GRPOTrainer.transformers.generate"
ROUTER_KEYS = (mk.EXPERTS_MAX_VIOLATION, mk.EXPERTS_UTILIZATION, mk.EXPERTS_ROUTER_ENTROPY)


def correct_sum(completions, answer, **kwargs):
    """A verifiable reward: 1 when the completion contains the right sum."""
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer, strict=True)]


class RecordLogs(TrainerCallback):
    """Last among the callbacks: every log exactly as the MLflow callback received it."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.by_step.setdefault(state.global_step, {}).update(logs or {})


def _train_trl(root: Path) -> RecordLogs:
    """The real GRPOTrainer on a tiny Qwen3-MoE checkpoint folder, as a user runs it."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model_dir = root / "tiny-qwen3-moe"
    model_dir.mkdir()
    save_hf_checkpoint("qwen3_moe", model_dir, seed=0)
    write_builtin_tokenizer("char", model_dir)  # a tokenizer AutoProcessor loads
    pairs = [(a, b) for a in range(1, 5) for b in range(1, 5)]
    dataset = Dataset.from_dict(
        {"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}
    )
    args = GRPOConfig(
        output_dir=str(root / "trl-out"),
        run_name=TRL_RUN,
        max_steps=STEPS,
        per_device_train_batch_size=COMPLETIONS_PER_STEP,
        num_generations=4,
        max_completion_length=8,
        beta=0.04,  # a reference model, so TRL logs its KL
        learning_rate=1e-3,
        logging_steps=1,
        # a checkpoint half-way and at the end, each uploaded to the lab as an MLflow
        # logged model (HF_MLFLOW_LOG_ARTIFACTS=1: transformers' MLflowCallback.on_save)
        save_strategy="steps",
        save_steps=STEPS // 2,
        use_cpu=True,
        bf16=False,
        seed=0,
        report_to="mlflow",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=correct_sum, args=args, train_dataset=dataset
    )
    add_router_metrics(trainer)
    recorder = RecordLogs()
    trainer.add_callback(recorder)
    trainer.train()
    return recorder


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl-into-lab")
    stack = LabStack(root, "filesystem")
    try:
        stack.env["MOE_LAB_CACHE"] = str(root / "cache")
        stack.start_worker("w1")
        yield stack
    finally:
        stack.close()


@pytest.fixture(scope="module")
def trained(lab):
    """The lab run queued first (a worker trains it meanwhile), then TRL's run, logged
    through the environment docs/integrations.md names."""
    started = time.monotonic()
    experiment = lab.post("/api/experiments", {"name": EXPERIMENT, "preset": "moe-grpo"})
    lab_run = lab.post(
        "/api/runs",
        {"experiment": experiment["id"], "preset": "moe-grpo", "variant": LAB_VARIANT,
         "overrides": {**TINY_OVERRIDES, "run.steps": STEPS}, "queue": lab.queue},
    )  # fmt: skip
    uri = f"http://127.0.0.1:{lab.port}"
    threads = torch.get_num_threads()
    experiment_id_before = os.environ.get("MLFLOW_EXPERIMENT_ID")
    with pytest.MonkeyPatch.context() as env:
        mlflow.set_tracking_uri(None)  # another module may have pointed the client elsewhere
        env.setenv("MLFLOW_TRACKING_URI", uri)
        env.setenv("MLFLOW_TRACKING_TOKEN", lab.token)
        env.setenv("MLFLOW_EXPERIMENT_NAME", EXPERIMENT)
        env.setenv(
            "MLFLOW_TAGS",
            json.dumps({"lab.framework": "trl", "lab.samples_per_step": str(COMPLETIONS_PER_STEP)}),
        )
        for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_RUN_ID"):
            env.delenv(name, raising=False)
        env.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        env.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "0")
        env.setenv("HF_MLFLOW_LOG_ARTIFACTS", "1")
        env.setenv("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(1)
        try:
            recorder = _train_trl(lab.root)
            trl_seconds = time.monotonic() - started
            mlflow_run = mlflow.last_active_run()  # read back from the lab by the client
        finally:
            torch.set_num_threads(threads)
            while mlflow.active_run() is not None:
                mlflow.end_run()
            mlflow.set_tracking_uri(None)
            # set_experiment wrote MLFLOW_EXPERIMENT_ID into the environment
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
            if experiment_id_before is not None:
                os.environ["MLFLOW_EXPERIMENT_ID"] = experiment_id_before
    done = lab.wait_status(lab_run["id"], {"succeeded", "failed", "cancelled"}, timeout=300)
    assert done["status"] == "succeeded", (done["error"], lab.log("w1"))
    print(
        f"TRL run logged {trl_seconds:.0f} s after the start; "
        f"lab run done {time.monotonic() - started:.0f} s after it"
    )
    return {
        "experiment": experiment,
        "trl_id": int(mlflow_run.info.run_id),
        "lab_id": lab_run["id"],
        "logs": recorder.by_step,
        "mlflow_run": mlflow_run,
    }


def _session(stack) -> urllib.request.OpenerDirector:
    """A browser session of the stack's user (login form, CSRF token)."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    base = f"http://127.0.0.1:{stack.port}"
    page = opener.open(f"{base}/accounts/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    data = urllib.parse.urlencode(
        {"username": "e2e", "password": "pw", "csrfmiddlewaretoken": token}
    ).encode()
    req = urllib.request.Request(
        f"{base}/accounts/login/", data=data, headers={"Referer": f"{base}/accounts/login/"}
    )
    opener.open(req, timeout=30).read()
    return opener


@pytest.fixture(scope="module")
def browser(lab):
    session = _session(lab)

    def get(path: str, **params) -> tuple[int, str]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with session.open(f"http://127.0.0.1:{lab.port}{path}{query}", timeout=60) as resp:
            return resp.status, resp.read().decode()

    return get


def _series(lab, run_id: int, keys) -> dict:
    return lab.get(
        f"/api/runs/{run_id}/metrics?"
        + urllib.parse.urlencode({"keys": ",".join(keys), "max_points": 100000})
    )


def _chart(browser, path: str, **params) -> list[dict]:
    """A chart's drawn traces as its JSON download gives them (plain lists)."""
    code, body = browser(path, format="json", **params)
    assert code == 200, (path, params)
    return json.loads(body)["traces"]


def _by_step(got: dict, key: str) -> dict[int, object]:
    """One key's stored values by step (steps that do not hold it left out)."""
    values = got["series"].get(key) or [None] * len(got["steps"])
    return {s: v for s, v in zip(got["steps"], values, strict=True) if v is not None}


def test_the_trl_run_is_a_finished_external_run_with_its_params(lab, trained, browser):
    run = lab.run(trained["trl_id"])
    assert run["status"] == "succeeded"
    assert run["experiment"] == trained["experiment"]["id"]
    assert run["variant"] == TRL_RUN
    assert run["queue"] == "external" and run["worker_host"] in ("", None)
    params = run["config"]["params"]
    # GRPOConfig's arguments and the model's config, as transformers' MLflowCallback logs them
    assert params["num_generations"] == "4"
    assert params["max_completion_length"] == "8"
    assert params["beta"] == "0.04"
    assert params["learning_rate"] == "0.001"
    assert params["model_type"] == "qwen3_moe" and params["num_local_experts"] == str(N_EXPERTS)
    assert params["num_experts_per_tok"] == "2" and params["mlp_only_layers"] == "[1]"
    assert params == trained["mlflow_run"].data.params  # MLflow's own view agrees
    # the model facts the heatmaps need, learnt from the expert-load scalars
    assert run["config"]["model"]["n_experts"] == N_EXPERTS
    assert run["config"]["model"]["n_layers"] == max(MOE_LAYERS) + 1
    # judged by the lab's collapse rule when it ended (no accuracy logged: the mean reward)
    summary = run["summary"]
    assert isinstance(summary["collapsed"], bool) and summary["steps"] == run["current_step"]
    assert summary["collapse_metric"] == mk.REWARD_MEAN
    # where it came from: the run page names the client and the framework
    code, html = browser(f"/runs/{trained['trl_id']}/")
    assert code == 200
    source = re.search(r'data-field="source">(.*?)</p>', html, re.S).group(1)
    assert f"mlflow-python-client/{mlflow.__version__}" in source
    assert "framework trl" in source


def test_trl_metrics_arrive_under_the_lab_keys_with_the_values_trl_logged(lab, trained):
    logs = trained["logs"]
    train_steps = sorted(step for step, entry in logs.items() if "reward" in entry)
    assert train_steps == list(range(1, STEPS + 1))
    for name in list(TRL_TO_LAB) + [k for k in AS_LOGGED if k != DEAD]:
        assert all(name in logs[s] for s in train_steps), f"TRL 1.16 no longer logs {name!r}"
    got = _series(lab, trained["trl_id"], [*TRL_TO_LAB.values(), *AS_LOGGED, GENERATE_TIME])
    # TRL's profiling timings are logged at the trainer's global step while the next step
    # is computed (trl/extras/profiling.py): the lab charts each at the step it timed, so
    # the run has exactly its training steps (MLflow's history keeps them as logged)
    assert got["steps"] == train_steps
    for name, key in [*TRL_TO_LAB.items(), *((k, k) for k in AS_LOGGED)]:
        expected = {s: logs[s][name] for s in train_steps}
        assert _by_step(got, key) == pytest.approx(expected, rel=1e-6, abs=1e-12), (name, key)
    # TRL's timings, names with spaces and a colon, are stored and read as they are
    timing = _by_step(got, GENERATE_TIME)
    assert sorted(timing) == train_steps and all(v > 0 for v in timing.values())
    assert trained["mlflow_run"].data.metrics[GENERATE_TIME] == pytest.approx(timing[STEPS])
    history = lab.get("/api/2.0/mlflow/metrics/get-history?" + urllib.parse.urlencode(
        {"run_id": trained["trl_id"], "metric_key": GENERATE_TIME}))["metrics"]  # fmt: skip
    assert sorted({m["step"] for m in history}) == list(range(STEPS))  # as logged
    # a bare name that is mapped is not stored a second time under its own name
    bare = _series(lab, trained["trl_id"], ["reward", "kl", "loss"])
    assert not any(_by_step(bare, k) for k in ("reward", "kl", "loss"))
    # MLflow's view of the run keeps TRL's names
    assert trained["mlflow_run"].data.metrics["reward"] == pytest.approx(logs[STEPS]["reward"])


def test_router_metrics_arrive_as_the_lab_expert_vectors_and_chart(lab, trained, browser):
    logs = trained["logs"]
    steps = list(range(1, STEPS + 1))
    load_keys = [mk.experts_load(layer) for layer in (0, 1, 2)]
    got = _series(lab, trained["trl_id"], [*ROUTER_KEYS, DEAD, *load_keys])
    for key in ROUTER_KEYS:
        expected = {s: logs[s][key] for s in steps}
        assert _by_step(got, key) == pytest.approx(expected, rel=1e-6)
    for layer in MOE_LAYERS:
        vectors = _by_step(got, mk.experts_load(layer))
        assert sorted(vectors) == steps
        for step, vector in vectors.items():
            shares = [logs[step][f"experts/load/L{layer}/e{e}"] for e in range(N_EXPERTS)]
            assert vector == pytest.approx(shares, rel=1e-6)
            assert sum(vector) == pytest.approx(1.0)
    assert not _by_step(got, mk.experts_load(1))  # the dense layer has none
    dead = _by_step(got, DEAD)
    assert dead == {s: logs[s][DEAD] for s in steps}
    assert all(0 <= v <= len(MOE_LAYERS) * N_EXPERTS for v in dead.values())

    # the run page's charts: a router metric, the unmapped dead-expert count, the heatmap
    for key in (mk.EXPERTS_MAX_VIOLATION, DEAD):
        (trace,) = _chart(browser, f"/runs/{trained['trl_id']}/chart", key=key)
        assert trace["x"] == steps
        assert trace["y"] == pytest.approx([logs[s][key] for s in steps])
    (heat,) = _chart(browser, f"/runs/{trained['trl_id']}/heatmap", layer=2)
    assert heat["x"] == steps and len(heat["z"]) == N_EXPERTS  # experts x steps
    assert [row[-1] for row in heat["z"]] == pytest.approx(_by_step(got, mk.experts_load(2))[STEPS])
    # the run page draws the router charts and offers the MoE layers' heatmaps only
    code, html = browser(f"/runs/{trained['trl_id']}/")
    assert code == 200
    for key in (mk.EXPERTS_MAX_VIOLATION, mk.EXPERTS_ROUTER_ENTROPY):
        assert f"/runs/{trained['trl_id']}/chart?key={urllib.parse.quote(key, safe='')}" in html
    picker = html.split("data-layer-picker")[1].split("</select>")[0]
    assert re.findall(r'value="(\d+)"', picker) == [str(layer) for layer in MOE_LAYERS]


def _outcome(lab, run_id: int) -> tuple[bool, int]:
    """(collapsed, the step the review reads: the collapse step, else the steps the run
    ran: its last stored step + 1 when it counts from 0, as the lab does, its last
    stored step when it counts from 1, as TRL does)."""
    summary = lab.run(run_id)["summary"]
    if summary["collapsed"]:
        return True, summary["collapse_step"]
    steps = _series(lab, run_id, [mk.REWARD_MEAN])["steps"]
    return False, steps[-1] + 1 if steps[0] == 0 else steps[-1]


def test_the_stability_review_holds_the_lab_run_and_the_trl_run(lab, trained, browser):
    trl_id, lab_id = trained["trl_id"], trained["lab_id"]
    experiment = trained["experiment"]["id"]
    outcomes = {TRL_RUN: _outcome(lab, trl_id), LAB_VARIANT: _outcome(lab, lab_id)}
    if not outcomes[TRL_RUN][0]:
        assert outcomes[TRL_RUN][1] == STEPS  # censored at TRL's last logged step
    code, html = browser("/stability/", experiment=experiment)
    assert code == 200
    # the seeds' table: one row per variant, each run a seed with its collapse outcome
    body = html.split('class="stability"')[1].split("</table>")[0].split("<tbody>")[1]
    rows = {
        cells[0]: cells
        for row in body.split("</tr>")
        if (cells := re.findall(r"<td>(.*?)</td>", row))
    }
    assert set(rows) == {TRL_RUN, LAB_VARIANT}
    for variant, (collapsed, step) in outcomes.items():
        # variant, seeds, KL, routing, extreme, collapse step, collapsed, final accuracy
        assert rows[variant][1] == "1"
        assert rows[variant][5] == (str(step) if collapsed else f"&gt;= {step}")
        assert rows[variant][6] == ("1/1" if collapsed else "0/1")
    # the lab's mismatch columns and held-out accuracy: TRL measures none of them
    assert rows[TRL_RUN][2:5] == ["-", "-", "-"] and rows[TRL_RUN][7] == "-"
    assert rows[LAB_VARIANT][2] != "-"
    # the runs table: both runs, their collapse or censoring step; none left out
    runs = html.split("<h2>Runs</h2>")[1].split("</table>")[0]
    for run_id, variant in ((trl_id, TRL_RUN), (lab_id, LAB_VARIANT)):
        collapsed, step = outcomes[variant]
        row = runs.split(f">#{run_id} {variant} s0</a>")[1].split("</tr>")[0]
        assert (f"step {step}" if collapsed else f"&gt;= {step} (censored)") in row
    assert "Not in the table" not in html
    # the downloads and the survival statistics count both
    code, body = browser("/stability/table", experiment=experiment)
    table = json.loads(body)
    assert {r["variant"]: r["runs"] for r in table["rows"]} == {TRL_RUN: 1, LAB_VARIANT: 1}
    assert {r["variant"] for r in table["survival"]} == {TRL_RUN, LAB_VARIANT}
    survival = _chart(browser, "/stability/chart/survival", experiment=experiment)
    names = {t["name"] for t in survival}
    assert {TRL_RUN, LAB_VARIANT} <= {n.split(" (")[0] for n in names if n}


def test_compare_the_lab_run_and_the_trl_run(lab, trained, browser):
    trl_id, lab_id = trained["trl_id"], trained["lab_id"]
    pair = f"{lab_id},{trl_id}"
    code, html = browser("/compare/", runs=pair)
    assert code == 200
    assert f"#{trl_id} {TRL_RUN} s0" in html and f"#{lab_id} {LAB_VARIANT} s0" in html
    labels = {trl_id: f"#{trl_id} {TRL_RUN} s0", lab_id: f"#{lab_id} {LAB_VARIANT} s0"}
    keys = [mk.REWARD_MEAN, mk.POLICY_ENTROPY, mk.EXPERTS_MAX_VIOLATION]
    lab_steps = _series(lab, lab_id, [mk.REWARD_MEAN])["steps"]
    for key in keys:  # each chart of the pair draws both runs, each at its own steps
        drawn = {t["name"]: t for t in _chart(browser, "/compare/chart", runs=pair, key=key)}
        assert set(labels.values()) <= set(drawn), key
        assert drawn[labels[trl_id]]["x"] == list(range(1, STEPS + 1)), key
        assert drawn[labels[lab_id]]["x"] == lab_steps, key
    drawn = _chart(browser, "/compare/chart", runs=pair, key=mk.REWARD_MEAN)
    (trl_reward,) = [t for t in drawn if t["name"] == labels[trl_id]]
    assert trl_reward["y"] == pytest.approx([trained["logs"][s]["reward"] for s in trl_reward["x"]])
    # the page's chart group: every metric of the pair in one response
    code, body = browser("/compare/charts", runs=pair, keys=",".join(keys))
    assert code == 200
    charts = json.loads(body)["charts"]
    for key in keys:
        names = {t.get("name") for t in charts[key]["figure"]["data"]}
        assert set(labels.values()) <= names, key
    for run_id in (lab_id, trl_id):  # both expert-load heatmaps of layer 0, side by side
        assert f"/runs/{run_id}/heatmap?layer=0" in html


def test_trl_checkpoints_are_downloadable_from_the_run_page(lab, trained, browser):
    """With HF_MLFLOW_LOG_ARTIFACTS=1 the Trainer uploads every checkpoint as an MLflow
    logged model (mlflow.pyfunc.log_model: logged-models, the artifact API, finalize)
    and trains to the end; the run page lists them and hands one out as a zip."""
    import io
    import zipfile

    trl_id = trained["trl_id"]
    assert lab.run(trl_id)["status"] == "succeeded"
    assert sorted(trained["logs"])[-1] == STEPS  # trained to the end
    found = lab.request("POST", "/api/2.0/mlflow/logged-models/search", {
        "experiment_ids": [str(trained["experiment"]["id"])]})[1]["models"]  # fmt: skip
    names = sorted(m["info"]["name"] for m in found)
    assert names == [f"checkpoint-{STEPS // 2}", f"checkpoint-{STEPS}"]
    assert all(m["info"]["status"] == "LOGGED_MODEL_READY" for m in found)
    assert {m["info"]["source_run_id"] for m in found} == {str(trl_id)}
    code, html = browser(f"/runs/{trl_id}/")
    assert code == 200
    models = html.split('data-field="artifacts"')[1].split("</section>")[0]
    last = next(m for m in found if m["info"]["name"] == f"checkpoint-{STEPS}")
    assert f'data-model="{last["info"]["model_id"]}"' in models
    opener = _session(lab)
    url = f"http://127.0.0.1:{lab.port}/runs/{trl_id}/models/{last['info']['model_id']}"
    with opener.open(url, timeout=120) as resp:
        archive = zipfile.ZipFile(io.BytesIO(resp.read()))
    files = archive.namelist()
    assert "MLmodel" in files
    weights = [f for f in files if f.endswith("model.safetensors")]
    assert weights and archive.getinfo(weights[0]).file_size > 1000
    assert any(f.endswith("config.json") for f in files)
