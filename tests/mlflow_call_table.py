"""The MLflow call table: one script of the calls training code and teams make with the
real ``mlflow`` client (experiments, runs, tags, params, metrics and their history,
search with every clause MLflow takes, delete and restore, nested runs, dataset
inputs, artifacts, logged models, the model registry), run against a tracking
server. It returns what each call answered, with server-made ids replaced by
names, so that the answers of the lab and of a real MLflow server can be compared
row by row (tests/integrations/test_mlflow_call_table.py).

    python tests/mlflow_call_table.py http://127.0.0.1:5000   # prints the table as JSON

Every time and step is fixed by the script, so both servers get the same data.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

T0 = 1_700_000_000_000  # ms: every start, end and metric time is T0 + an offset
PREFIX = "ct-"

# (name, params, tags, metrics {key: [(step, value, t offset)]}, status)
RUNS = [
    (
        "r0",
        {"lr": "0.001", "optimizer": "adam", "seed": "0"},
        {"variant": "a", "seed": "0"},
        {"reward": [(0, 0.1, 1), (1, 0.5, 2), (2, 0.7, 3)], "loss": [(0, 2.0, 1), (2, 0.9, 3)]},
        "FINISHED",
    ),
    (
        "r1",
        {"lr": "0.001", "optimizer": "adamw", "seed": "1"},
        {"variant": "a", "seed": "1"},
        {"reward": [(0, 0.2, 1), (2, 0.9, 3)], "loss": [(2, 1.5, 3)]},
        "FINISHED",
    ),
    (
        "r2",
        {"lr": "0.0003", "optimizer": "sgd", "seed": "0"},
        {"variant": "b"},
        {"reward": [(0, 0.4, 1), (1, 0.3, 2)]},
        "FAILED",
    ),
    (
        "R3",
        {"lr": "0.01", "seed": "2"},
        {"variant": "ab"},
        {"loss": [(0, 0.5, 1)], "reward": [(0, 0.7, 1)]},
        "KILLED",
    ),
    (
        "r4",
        {"optimizer": "Adam"},
        {},
        {"reward": [(5, float("nan"), 4)], "kl": [(5, 0.01, 4)]},
        "FINISHED",
    ),
    ("r5", {}, {"variant": "b", "team": "rl"}, {}, "RUNNING"),
]

RUN_FILTERS = [
    "",
    "metrics.reward > 0.5",
    "metrics.reward >= 0.5",
    "metrics.reward < 0.5",
    "metrics.reward <= 0.7",
    "metrics.reward = 0.7",
    "metrics.reward != 0.7",
    "metrics.loss < 1",
    "metrics.`loss` >= 0.9",
    "params.lr = '0.001'",
    "params.lr != '0.001'",
    "params.optimizer LIKE 'adam%'",
    "params.optimizer ILIKE 'ADAM%'",
    "params.optimizer LIKE '%d_m%'",
    "params.optimizer != 'sgd'",
    "tags.variant = 'a'",
    "tags.variant != 'a'",
    "tags.variant LIKE '%b'",
    "tags.variant ILIKE 'A%'",
    "tags.`mlflow.runName` = 'r1'",
    "tags.team IS NULL",
    "tags.team IS NOT NULL",
    "params.optimizer IS NULL",
    "attributes.status = 'FINISHED'",
    "attributes.status != 'FAILED'",
    "attributes.status IN ('FAILED', 'KILLED')",
    "attributes.status NOT IN ('FINISHED')",
    "attributes.run_name LIKE 'r%'",
    "attributes.run_name ILIKE 'r%'",
    "run_name = 'r2'",
    "attributes.`Run name` = 'R3'",
    f"attributes.start_time > {T0 + 2500}",
    f"attributes.start_time <= {T0 + 2000}",
    f"attributes.end_time > {T0 + 4500}",
    f"attributes.created >= {T0 + 4000}",
    "metrics.reward > 0.2 AND params.optimizer = 'adam'",
    "metrics.reward > 0 and tags.variant = 'a' AND attributes.status = 'FINISHED'",
    "params.seed = '0' AND metrics.reward < 0.6",
    "datasets.name = 'prompts'",
    "datasets.context = 'training'",
    "datasets.digest != 'nope'",
]

RUN_ORDERS = [
    [],
    ["metrics.reward DESC"],
    ["metrics.reward ASC"],
    ["metrics.reward"],
    ["params.lr ASC", "metrics.loss DESC"],
    ["params.optimizer DESC"],
    ["tags.variant ASC", "attributes.run_name DESC"],
    ["attributes.start_time ASC"],
    ["attributes.end_time DESC"],
    ["attributes.run_name"],
    ["attributes.status ASC", "start_time DESC"],
    ["metrics.`loss` ASC"],
]

BAD_FILTERS = [
    "metrics.reward LIKE 'x'",
    "params.lr > '1'",
    "reward = 1",
    "metrics.reward = 'abc'",
    "attributes.nope = 'x'",
    "tags.x = 'a' OR tags.y = 'b'",
]

EXPERIMENT_FILTERS = [
    f"name LIKE '{PREFIX}%'",
    f"name ILIKE '{PREFIX.upper()}O%'",
    f"name = '{PREFIX}other'",
    f"name != '{PREFIX}other' AND name LIKE '{PREFIX}%'",
    "tags.team = 'rl'",
    "tags.goal = 'stability'",
    "tags.team != 'rl'",
    f"tags.team IS NULL AND name LIKE '{PREFIX}%'",
    f"name LIKE '{PREFIX}%' AND creation_time > 0",
]


class Ids:
    """Server-made ids and the names the table uses for them."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def add(self, server_id: str, name: str) -> str:
        self.names[str(server_id)] = name
        return server_id

    def name(self, server_id: str) -> str:
        return self.names.get(str(server_id), "?")

    def scrub(self, text: str) -> str:
        for server_id, name in sorted(self.names.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(server_id, f"<{name}>")
        return text


def _answer(call) -> Any:
    """What the call returned, or the error code the server refused it with."""
    from mlflow.exceptions import MlflowException

    try:
        return call()
    except MlflowException as exc:
        return f"error {exc.error_code}"


def _error(call) -> str:
    from mlflow.exceptions import MlflowException

    try:
        call()
    except MlflowException as exc:
        return exc.error_code
    return "no error"


def call_table(uri: str, work: Path) -> dict[str, Any]:
    """Run the table against the tracking server at ``uri``; {call: answer}."""
    import mlflow
    import numpy as np
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, ViewType

    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    ids = Ids()
    out: dict[str, Any] = {}

    # -- experiments -------------------------------------------------------------------
    main = ids.add(client.create_experiment(f"{PREFIX}main", tags={"team": "rl"}), "main")
    other = ids.add(client.create_experiment(f"{PREFIX}other"), "other")
    doomed = ids.add(client.create_experiment(f"{PREFIX}doomed"), "doomed")
    mlflow.set_experiment(experiment_id=main)  # the fluent calls below resume main's runs
    client.set_experiment_tag(main, "goal", "stability")
    client.set_experiment_tag(other, "team", "infra")
    got = client.get_experiment(main)
    out["experiments.get"] = [got.name, got.lifecycle_stage, dict(got.tags)]
    out["experiments.get_by_name"] = ids.name(
        client.get_experiment_by_name(f"{PREFIX}other").experiment_id
    )
    out["experiments.create existing"] = _error(lambda: client.create_experiment(f"{PREFIX}main"))
    client.rename_experiment(other, f"{PREFIX}Other")
    out["experiments.rename"] = client.get_experiment(other).name
    client.delete_experiment(doomed)
    out["experiments.delete"] = client.get_experiment(doomed).lifecycle_stage

    def experiment_names(**kw) -> list[str]:
        found = client.search_experiments(**kw)
        return [e.name for e in found if e.name.lower().startswith(PREFIX)]

    for f in EXPERIMENT_FILTERS:
        out[f"experiments.search filter={f}"] = _answer(
            lambda f=f: sorted(experiment_names(filter_string=f))
        )
    out["experiments.search order name ASC"] = experiment_names(order_by=["name ASC"])
    out["experiments.search order name DESC"] = experiment_names(order_by=["name DESC"])
    out["experiments.search deleted only"] = experiment_names(view_type=ViewType.DELETED_ONLY)
    out["experiments.search all"] = sorted(experiment_names(view_type=ViewType.ALL))
    client.restore_experiment(doomed)
    out["experiments.restore"] = client.get_experiment(doomed).lifecycle_stage
    client.delete_experiment_tag(main, "goal")
    out["experiments.delete_tag"] = dict(client.get_experiment(main).tags)

    # -- runs: params, tags, metrics with their own times ----------------------------
    run_ids = {}
    for i, (name, params, tags, metrics, status) in enumerate(RUNS):
        run = client.create_run(main, start_time=T0 + 1000 * (i + 1), run_name=name, tags=tags)
        run_ids[name] = ids.add(run.info.run_id, name)
        points = [
            Metric(key, value, T0 + 1000 * (i + 1) + dt, step)
            for key, series in metrics.items()
            for step, value, dt in series
        ]
        client.log_batch(
            run.info.run_id,
            metrics=points,
            params=[Param(k, v) for k, v in params.items()],
        )
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status, end_time=T0 + 1000 * (i + 1) + 500)
    # two points at one step, each with its own timestamp, and a retried batch
    r0 = run_ids["r0"]
    client.log_batch(r0, metrics=[Metric("acc", 0.25, T0 + 10, 3), Metric("acc", 0.75, T0 + 20, 3)])
    client.log_batch(r0, metrics=[Metric("acc", 0.25, T0 + 10, 3), Metric("acc", 0.75, T0 + 20, 3)])
    client.log_metric(r0, "acc", 0.5, timestamp=T0 + 30, step=4)
    out["metrics.history two points at one step"] = [
        (m.step, m.value, m.timestamp - T0) for m in client.get_metric_history(r0, "acc")
    ]
    out["metrics.history nan"] = [
        (m.step, str(m.value), m.timestamp - T0)
        for m in client.get_metric_history(run_ids["r4"], "reward")
    ]
    out["metrics.history missing"] = client.get_metric_history(r0, "never-logged")
    # tags set after the run started (transformers' MLFLOW_TAGS), and removed
    client.set_tag(run_ids["r5"], "seed", "7")
    client.set_tag(run_ids["r5"], "note", "x")
    client.delete_tag(run_ids["r5"], "note")
    got = client.get_run(run_ids["r5"])
    out["runs.get tags"] = {k: v for k, v in got.data.tags.items() if not k.startswith("mlflow.")}
    got = client.get_run(r0)
    out["runs.get r0"] = [
        got.info.run_name, got.info.status, got.info.start_time - T0, got.info.end_time - T0,
        got.info.lifecycle_stage, dict(got.data.params), dict(got.data.metrics),
    ]  # fmt: skip
    out["runs.get r4 latest nan"] = str(client.get_run(run_ids["r4"]).data.metrics["reward"])
    out["params.change refused"] = _error(lambda: client.log_param(r0, "lr", "0.5"))

    # dataset inputs
    dataset = mlflow.data.from_numpy(np.arange(6).reshape(3, 2), name="prompts", source="s3://b/p")
    with mlflow.start_run(run_id=r0):
        mlflow.log_input(dataset, context="training")
    got = client.get_run(r0)
    out["runs.log_inputs"] = [
        (d.dataset.name, d.dataset.digest == dataset.digest, [(t.key, t.value) for t in d.tags])
        for d in got.inputs.dataset_inputs
    ]

    # nested runs: a parent and two children
    parent = client.create_run(main, start_time=T0 + 9000, run_name="sweep")
    ids.add(parent.info.run_id, "sweep")
    for k in range(2):
        child = client.create_run(
            main, start_time=T0 + 9100 + k, run_name=f"trial{k}",
            tags={"mlflow.parentRunId": parent.info.run_id},
        )  # fmt: skip
        ids.add(child.info.run_id, f"trial{k}")
        client.log_metric(child.info.run_id, "reward", 0.3 + k, timestamp=T0 + 9200, step=0)
        client.set_terminated(child.info.run_id, end_time=T0 + 9300)
    client.set_terminated(parent.info.run_id, end_time=T0 + 9400)

    def names(filter_string: str = "", order_by=None, view=ViewType.ACTIVE_ONLY, **kw) -> list[str]:
        found = client.search_runs(
            [main], filter_string=filter_string, order_by=order_by or [], run_view_type=view, **kw
        )
        return [ids.name(r.info.run_id) for r in found]

    out["runs.search children of sweep"] = names(
        f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    listed = ", ".join(f"'{run_ids[n]}'" for n in ("r1", "r2"))
    out["runs.search run_id IN"] = names(f"attributes.run_id IN ({listed})")
    for f in RUN_FILTERS:
        out[f"runs.search filter={f}"] = _answer(lambda f=f: sorted(names(f)))
    for order in RUN_ORDERS:
        out[f"runs.search order={order}"] = _answer(lambda order=order: names(order_by=order))
    out["runs.search filter+order"] = names("params.lr != '0.01'", ["metrics.reward DESC"])
    for f in BAD_FILTERS:
        out[f"runs.search refuses {f}"] = _error(lambda f=f: names(f))
    out["runs.search bad order"] = _error(lambda: names(order_by=["metrics.reward sideways"]))
    pages, token = [], None
    while True:
        page = client.search_runs(
            [main], max_results=3, page_token=token, order_by=["attributes.run_name ASC"]
        )
        pages.append([ids.name(r.info.run_id) for r in page])
        token = page.token
        if not token:
            break
    out["runs.search pages of 3"] = pages
    out["runs.search fluent best run"] = [
        ids.name(r.info.run_id)
        for r in mlflow.search_runs(
            [main], order_by=["metrics.reward DESC"], max_results=1, output_format="list"
        )
    ]

    # soft delete and restore
    client.delete_run(run_ids["r2"])
    out["runs.delete"] = client.get_run(run_ids["r2"]).info.lifecycle_stage
    out["runs.search after delete"] = sorted(names())
    out["runs.search deleted only"] = names(view=ViewType.DELETED_ONLY)
    out["runs.search all"] = sorted(names(view=ViewType.ALL))
    out["runs.log to deleted"] = _error(lambda: client.log_metric(run_ids["r2"], "x", 1.0))
    client.restore_run(run_ids["r2"])
    out["runs.restore"] = client.get_run(run_ids["r2"]).info.lifecycle_stage
    out["runs.search after restore"] = sorted(names())

    # -- artifacts (proxied: mlflow-artifacts:) --------------------------------------
    local = Path(tempfile.mkdtemp(dir=work))
    (local / "weights.bin").write_bytes(bytes(range(256)) * 40)
    (local / "ckpt").mkdir()
    (local / "ckpt" / "a.txt").write_text("alpha")
    (local / "ckpt" / "b.txt").write_text("beta")
    with mlflow.start_run(run_id=r0):
        mlflow.log_artifact(str(local / "weights.bin"))
        mlflow.log_artifacts(str(local / "ckpt"), artifact_path="ckpt")
        mlflow.log_dict({"lr": 0.001, "steps": [1, 2]}, "config/train.json")
        mlflow.log_text("hello", "notes/readme.txt")
        mlflow.log_table({"step": [1, 2], "reward": [0.1, 0.2]}, "tables/rewards.json")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots()
        axis.plot([0, 1], [0, 1])
        mlflow.log_figure(figure, "figures/line.png")
        plt.close(figure)
    out["artifacts.uri scheme"] = client.get_run(r0).info.artifact_uri.split(":")[0]
    out["artifacts.list root"] = [
        (f.path, f.is_dir, f.file_size) for f in client.list_artifacts(r0)
    ]
    out["artifacts.list ckpt"] = [
        (f.path, f.is_dir, f.file_size) for f in client.list_artifacts(r0, "ckpt")
    ]
    down = Path(
        mlflow.artifacts.download_artifacts(
            run_id=r0, artifact_path="ckpt", dst_path=str(work / "d1")
        )
    )
    out["artifacts.download folder"] = sorted(p.name for p in down.iterdir())
    out["artifacts.download file"] = (
        Path(client.download_artifacts(r0, "weights.bin", str(work / "d2"))).read_bytes()
        == (local / "weights.bin").read_bytes()
    )
    out["artifacts.load_dict"] = mlflow.artifacts.load_dict(f"runs:/{r0}/config/train.json")
    out["artifacts.load_text"] = mlflow.artifacts.load_text(f"runs:/{r0}/notes/readme.txt")
    out["artifacts.missing"] = _error(
        lambda: mlflow.artifacts.download_artifacts(
            run_id=r0, artifact_path="nope.txt", dst_path=str(work / "d3")
        )
    )

    # -- a logged model, as transformers' MLflowCallback logs a checkpoint -------------
    checkpoint = local / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"\x00" * 2048)
    (checkpoint / "config.json").write_text('{"model_type": "qwen3_moe"}')
    with mlflow.start_run(run_id=r0):
        info = mlflow.pyfunc.log_model(
            "checkpoint-2",
            artifacts={"model_path": str(checkpoint)},
            python_model=mlflow.pyfunc.PythonModel(),
        )
    ids.add(info.model_id, "model")
    model = mlflow.get_logged_model(info.model_id)
    out["logged_models.get"] = [model.name, str(model.status), ids.name(model.source_run_id)]
    out["logged_models.search"] = [
        m.name
        for m in mlflow.search_logged_models(
            experiment_ids=[main], filter_string="name = 'checkpoint-2'", output_format="list"
        )
    ]
    files = sorted(
        f.path
        for f in mlflow.artifacts.list_artifacts(
            artifact_uri=model.artifact_location + "/artifacts/checkpoint-2"
        )
    )
    out["logged_models.artifacts"] = [Path(f).name for f in files]
    out["runs.outputs"] = [ids.name(o.model_id) for o in client.get_run(r0).outputs.model_outputs]

    # -- the model registry ------------------------------------------------------------
    version = mlflow.register_model(f"models:/{info.model_id}", f"{PREFIX}policy")
    out["registry.register"] = [version.name, version.version, ids.name(version.run_id or "")]
    client.set_registered_model_alias(f"{PREFIX}policy", "champion", version.version)
    out["registry.alias"] = client.get_model_version_by_alias(f"{PREFIX}policy", "champion").version
    client.update_registered_model(f"{PREFIX}policy", description="the GRPO policy")
    client.set_registered_model_tag(f"{PREFIX}policy", "task", "math")
    client.set_model_version_tag(f"{PREFIX}policy", version.version, "checked", "yes")
    registered = client.get_registered_model(f"{PREFIX}policy")
    out["registry.get"] = [
        registered.name,
        registered.description,
        dict(registered.tags),
        dict(registered.aliases),
    ]
    out["registry.search"] = [
        m.name for m in client.search_registered_models(f"name LIKE '{PREFIX}%'")
    ]
    out["registry.versions"] = [
        (v.version, dict(v.tags)) for v in client.search_model_versions(f"name = '{PREFIX}policy'")
    ]
    uri_of_version = client.get_model_version_download_uri(f"{PREFIX}policy", version.version)
    out["registry.download uri"] = ids.scrub(uri_of_version).split(":", 1)[0]
    loaded = Path(
        mlflow.artifacts.download_artifacts(
            f"models:/{PREFIX}policy/{version.version}", dst_path=str(work / "d4")
        )
    )
    out["registry.download model"] = sorted(p.name for p in loaded.iterdir())
    client.delete_registered_model_alias(f"{PREFIX}policy", "champion")
    out["registry.alias deleted"] = dict(client.get_registered_model(f"{PREFIX}policy").aliases)
    return json.loads(json.dumps(out, default=str))


if __name__ == "__main__":
    print(json.dumps(call_table(sys.argv[1], Path(tempfile.mkdtemp())), indent=1))
