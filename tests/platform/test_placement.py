"""Placement by capacity: a worker claims only runs that fit the GPUs (or CPU
slots) it owns, and a run that no live worker can take says why."""

from __future__ import annotations

import uuid

import pytest
from lab_processes import submit_tiny_run

from lab.jobs import capacity, gang, outcome, spawn
from lab.jobs import services as jobs
from lab.jobs.models import Worker
from lab.jobs.queries import waiting_reason
from trainer.launch import torchrun_command

# What the database itself decides (docs/design.md 4): also run on PostgreSQL.
pytestmark = pytest.mark.database


@pytest.fixture
def queue(settings):
    name = f"q-{uuid.uuid4().hex[:8]}"
    settings.LAB_QUEUES = [*settings.LAB_QUEUES, name]
    return name


def _submit(user, experiment, queue, gpus: int):
    # every rank needs a prompt of its own (rollout.prompts_per_step >= ranks)
    overrides = {"run.gpus": gpus, "rollout.prompts_per_step": 8}
    return submit_tiny_run(user, experiment, overrides, queue=queue)


def _register(name: str, queue: str, *, gpus: int = 0, cpu_slots: int = 1) -> None:
    jobs.register_worker(name, queues=[queue], pid=1, gpus=gpus, cpu_slots=cpu_slots, gpu_index="")


# ----------------------------------------------------------------- capacity


@pytest.mark.parametrize(
    ("visible", "setting", "gpus", "devices"),
    [
        ("", None, 0, ()),
        ("-1", None, 0, ()),
        ("0,1, 3", None, 3, ("0", "1", "3")),
        ("0,1,2,3", 2, 2, ("0", "1")),  # LAB_WORKER_GPUS wins and picks the first
        ("", 4, 4, ("0", "1", "2", "3")),  # owns GPUs but names none: the first free
    ],
)
def test_worker_capacity_from_environment(
    monkeypatch, settings, tmp_path, visible, setting, gpus, devices
):
    monkeypatch.setattr(capacity, "_LEASES", {})
    settings.LAB_DEVICE_LOCK_DIR = str(tmp_path / "locks")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    settings.LAB_WORKER_GPUS = setting
    settings.LAB_WORKER_CPU_SLOTS = 2
    owns = capacity.this_worker()
    assert (owns.gpus, owns.devices) == (gpus, devices)
    assert owns.ranks_per_node == (gpus or 2)


def _held_elsewhere(lock_dir, device: str):
    """Another worker's lease on ``device`` (a separate open file: flock conflicts)."""
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    handle = open(lock_dir / f"gpu-{device}.lock", "a+")  # noqa: SIM115
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write("pid 4242 on gpu-host")
    handle.flush()
    return handle


def test_two_workers_on_one_host_never_share_a_gpu(monkeypatch, settings, tmp_path):
    """A worker given LAB_WORKER_GPUS=2 and no devices takes the first two that no
    other worker holds; naming a held device, or asking for more than are free,
    refuses with the device and its holder; the leases are the worker's for life
    (asking again gives the same devices)."""
    locks = tmp_path / "locks"
    settings.LAB_DEVICE_LOCK_DIR = str(locks)
    monkeypatch.setattr(capacity, "_LEASES", {})
    monkeypatch.setattr(capacity, "host_gpu_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    other = _held_elsewhere(locks, "0")
    settings.LAB_WORKER_GPUS = 2
    assert capacity.this_worker().devices == ("1", "2")
    assert capacity.this_worker().devices == ("1", "2")  # its own leases, not new ones
    for handle in capacity._LEASES.values():  # this worker exits: its leases end
        handle.close()
    capacity._LEASES.clear()
    held = [_held_elsewhere(locks, d) for d in ("1", "2")]
    with pytest.raises(capacity.DeviceBusy, match="only 1 of the host's 4 GPUs are free"):
        capacity.this_worker()
    assert capacity._LEASES == {}  # all or nothing: device 3 was given back
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    settings.LAB_WORKER_GPUS = None
    with pytest.raises(capacity.DeviceBusy, match=r"GPU 0 is held by another worker.*pid 4242"):
        capacity.this_worker()
    other.close()  # the other worker exits (or is killed): the device is free again
    assert capacity.this_worker().devices == ("0",)
    for handle in [*held, *capacity._LEASES.values()]:
        handle.close()


def test_a_trainer_sees_only_the_devices_its_run_needs(monkeypatch, settings):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    settings.LAB_WORKER_GPUS = None
    assert spawn.trainer_env(2)["CUDA_VISIBLE_DEVICES"] == "4,5"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # a CPU worker: the environment as is
    assert spawn.trainer_env(1)["CUDA_VISIBLE_DEVICES"] == ""


def test_torchrun_only_for_several_ranks(tmp_path):
    one = spawn.trainer_command(tmp_path / "c.json", tmp_path, resume=False, gpus=1)
    two = spawn.trainer_command(tmp_path / "c.json", tmp_path, resume=False, gpus=2)
    assert "torch.distributed.run" not in one
    assert "torch.distributed.run" in two and "--nproc_per_node=2" in two


# ------------------------------------------------------------------- claims


def test_run_gpus_comes_from_its_config(user, experiment, queue):
    assert submit_tiny_run(user, experiment, queue=queue).gpus == 1
    assert _submit(user, experiment, queue, gpus=4).gpus == 4


def test_a_worker_claims_only_runs_that_fit_it(user, experiment, queue):
    big = _submit(user, experiment, queue, gpus=4)  # first in the queue
    small = _submit(user, experiment, queue, gpus=1)
    claim = jobs.claim_next(queue, worker_host="one-gpu", gpu_index="3", max_ranks_per_node=1)
    assert claim.run_id == small.pk  # the big run is skipped, not blocked on
    assert jobs.claim_next(queue, worker_host="one-gpu", max_ranks_per_node=1) is None
    claim = jobs.claim_next(
        queue, worker_host="eight", gpu_index="0,1,2,3,4,5,6,7", max_ranks_per_node=8
    )
    assert claim.run_id == big.pk
    big.refresh_from_db()
    assert big.worker_host == "eight" and big.gpu_index == "0,1,2,3"  # the devices it uses


# ------------------------------------------------------------- waiting reason


def test_waiting_reason_names_what_is_missing(user, experiment, queue):
    run = _submit(user, experiment, queue, gpus=8)
    assert "No live worker serves" in waiting_reason(run)
    _register(f"cpu-{queue}", queue, cpu_slots=2)
    assert waiting_reason(run).startswith(
        f"needs 8 ranks; the largest live worker on {queue} has 2 CPU slots"
    )
    _register(f"gpu-{queue}", queue, gpus=4)
    assert waiting_reason(run).startswith(
        f"needs 8 GPUs; the largest live worker on {queue} has 4 GPUs"
    )
    _register(f"big-{queue}", queue, gpus=8)
    assert waiting_reason(run) is None
    Worker.objects.filter(hostname=f"big-{queue}").delete()
    run.status = "running"
    assert waiting_reason(run) is None  # only a queued run waits


def test_api_and_run_page_say_why_a_run_waits(api, client, user, experiment, queue):
    run = _submit(user, experiment, queue, gpus=4)
    _register(f"w-{queue}", queue, gpus=1)
    body = api.get(f"/api/runs/{run.pk}").json()
    assert body["gpus"] == 4
    assert body["waiting_reason"].startswith("needs 4 GPUs; the largest live worker")
    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "needs 4 GPUs; the largest live worker" in page
    status = client.get(f"/runs/{run.pk}/status").json()
    assert status["waiting_reason"] == body["waiting_reason"]


# -------------------------------------------------------------------- gangs


def _gang_run(user, experiment, queue, nodes: int = 2):
    overrides = {"run.nodes": nodes, "rollout.prompts_per_step": 8}
    return submit_tiny_run(user, experiment, overrides, queue=queue)


def test_a_gang_waits_for_enough_live_workers(user, experiment, queue):
    run = _gang_run(user, experiment, queue)
    assert run.nodes == 2
    _register(f"a-{queue}", queue)
    assert waiting_reason(run).startswith(
        f"needs 2 workers with 1 rank each at once; 1 live worker on {queue}"
    )
    claim = jobs.claim_next(queue, worker_host=f"a-{queue}", max_ranks_per_node=1)
    assert not gang.lead(claim.run_id, claim.attempt, f"a-{queue}")
    run.refresh_from_db()
    # Undone, not spent: back in the queue for the reconciler's next wake-up. The
    # allowance grows instead of the attempt number going back: the next claim
    # takes attempt 2, so every claim has its own fencing token.
    assert (run.status, run.attempts, run.max_attempts, run.published_at) == ("queued", 1, 4, None)
    again = jobs.claim_next(queue, worker_host=f"a-{queue}", max_ranks_per_node=1)
    assert again.attempt == 2


def test_gang_lead_join_and_release(user, experiment, queue, django_capture_on_commit_callbacks):
    run = _gang_run(user, experiment, queue, nodes=3)
    for name in "abc":
        _register(f"{name}-{queue}", queue)
    claim = jobs.claim_next(queue, worker_host=f"a-{queue}", max_ranks_per_node=1)
    with django_capture_on_commit_callbacks(execute=False) as woken:
        assert gang.lead(claim.run_id, claim.attempt, f"a-{queue}")
    assert len(woken) == 2  # one wake-up per missing member
    assert gang.join(queue, worker_host=f"a-{queue}", max_ranks_per_node=1) is None  # already in
    assert gang.join(queue, worker_host=f"b-{queue}", max_ranks_per_node=1) == (run.pk, 1, 1)
    assert not gang.assembled(run.pk, 1)
    assert gang.join(queue, worker_host=f"c-{queue}", max_ranks_per_node=1) == (run.pk, 1, 2)
    assert gang.assembled(run.pk, 1)
    assert gang.join(queue, worker_host=f"d-{queue}", max_ranks_per_node=1) is None  # complete
    run.refresh_from_db()
    host, port = run.rdzv_endpoint.rsplit(":", 1)
    assert host  # LAB_RDZV_HOST: where the other members reach the store
    assert 29400 <= int(port) <= 29499
    args = torchrun_command([], nproc_per_node=1, rendezvous=gang.rendezvous(run, 30))
    assert "--nnodes=3" in args and f"--rdzv-id=run{run.pk}-a1" in args
    assert f"--rdzv-endpoint={run.rdzv_endpoint}" in args
    assert "--rdzv-conf=join_timeout=30" in args

    assert gang.release(run.pk, 1, "the gang did not assemble")
    run.refresh_from_db()
    assert run.status == "queued" and run.max_attempts == 4  # the release is not counted
    assert not jobs.heartbeat(jobs.Claim(run.pk, 1, node=1))  # members stop their trainers
    # The next attempt's gang starts empty: nobody joins the old one.
    claim = jobs.claim_next(queue, worker_host=f"b-{queue}", max_ranks_per_node=1)
    assert gang.join(queue, worker_host=f"c-{queue}", max_ranks_per_node=1) is None
    assert gang.lead(claim.run_id, claim.attempt, f"b-{queue}")
    assert gang.join(queue, worker_host=f"c-{queue}", max_ranks_per_node=1) == (run.pk, 2, 1)


def test_the_ranks_exit_code_is_read_from_the_run_folder(tmp_path):
    assert outcome.ranks_exit_code(tmp_path, 1) == 1  # no file: torchrun's own
    (tmp_path / "exit_code").write_text("2")
    assert outcome.ranks_exit_code(tmp_path, 1) == 2  # a bad config: fail at once
    assert outcome.ranks_exit_code(tmp_path, 0) == 0


# ------------------------------------------------------------ GPU slots


def _slot_held_elsewhere(lock_dir, device: str, slot: int):
    """Another worker in slot ``slot`` of ``device``: a shared device lock and the
    slot's exclusive lock (separate open files: flock conflicts as between processes)."""
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    shared = open(lock_dir / f"gpu-{device}.lock", "a+")  # noqa: SIM115
    fcntl.flock(shared, fcntl.LOCK_SH | fcntl.LOCK_NB)
    mine = open(lock_dir / f"gpu-{device}.slot-{slot}.lock", "a+")  # noqa: SIM115
    fcntl.flock(mine, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return shared, mine


def test_a_gpu_is_cut_into_slots_by_memory():
    assert capacity.slots_per_gpu(80, 20) == 4
    assert capacity.slots_per_gpu(80, 30) == 2
    assert capacity.slots_per_gpu(141, 20) == 7  # an H200
    assert capacity.slots_per_gpu(10, 20) == 1  # a slot never exceeds a whole GPU


@pytest.fixture
def slot_host(monkeypatch, settings, tmp_path):
    """A host with one 80 GB GPU cut into 20 GB slots, this process a fresh worker."""
    monkeypatch.setattr(capacity, "_LEASES", {})
    monkeypatch.setattr(capacity, "_SLOTS", {})
    monkeypatch.setattr(capacity, "host_gpu_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    settings.LAB_DEVICE_LOCK_DIR = str(tmp_path / "locks")
    settings.LAB_WORKER_GPUS = 1
    settings.LAB_GPU_SLOT_GB = 20
    settings.LAB_GPU_MEMORY_GB = 80
    yield tmp_path / "locks"
    for handle in capacity._LEASES.values():
        handle.close()


def test_workers_sharing_a_gpu_each_hold_their_own_slot_and_memory_share(slot_host):
    others = [_slot_held_elsewhere(slot_host, "0", slot) for slot in (0, 1)]
    owns = capacity.this_worker()
    assert (owns.devices, owns.slot, owns.slots, owns.memory_share) == (("0",), 2, 4, 0.25)
    assert owns.ranks_per_node == 1  # a slot trains single-GPU runs
    assert capacity.this_worker().slot == 2  # its own lease for life, not a new slot
    env = owns.trainer_environment(1)
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "MOE_LAB_GPU_MEMORY_SHARE": "0.250000"}
    assert spawn.trainer_env(1)["MOE_LAB_GPU_MEMORY_SHARE"] == "0.250000"
    assert owns.describe() == "GPU 0, slot 3 of 4"
    for handles in others:
        for handle in handles:
            handle.close()


def test_a_full_gpu_refuses_a_fifth_slot_worker_and_a_whole_gpu_worker(slot_host, settings):
    others = [_slot_held_elsewhere(slot_host, "0", slot) for slot in range(4)]
    with pytest.raises(capacity.DeviceBusy, match="every slot of GPU 0 is taken"):
        capacity.this_worker()
    settings.LAB_GPU_SLOT_GB = None  # a whole-GPU worker while slot workers hold it
    with pytest.raises(capacity.DeviceBusy, match="only 0 of the host's 1 GPUs are free"):
        capacity.this_worker()
    for handles in others:
        for handle in handles:
            handle.close()
    assert capacity.this_worker().devices == ("0",)  # all slot workers gone: whole again
    settings.LAB_GPU_SLOT_GB = 20  # and a slot worker while a whole-GPU worker holds it
    with pytest.raises(capacity.DeviceBusy, match="whole-GPU worker holds"):
        capacity.this_worker()


def test_slot_settings_that_cannot_work_are_refused_by_name(slot_host, settings, monkeypatch):
    settings.LAB_WORKER_GPUS = 2
    with pytest.raises(capacity.DeviceBusy, match="LAB_WORKER_GPUS=1"):
        capacity.this_worker()
    settings.LAB_WORKER_GPUS = 1
    settings.LAB_GPU_MEMORY_GB = None
    monkeypatch.setattr(capacity, "gpu_memory_gb", lambda device: None)
    with pytest.raises(capacity.DeviceBusy, match="LAB_GPU_MEMORY_GB"):
        capacity.this_worker()
