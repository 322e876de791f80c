"""Weights checked before they are trusted: a checkpoint with a NaN or Inf weight, or
a weight stored as an integer, is refused at registration naming the tensor (large
ones by the control worker's scan) and at run start; a run whose loss is not finite
at its first step fails with that reason, not as a collapse at step 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_tiny_checkpoints import poisoned, retyped, save_char_tokenizer, save_hf_checkpoint

from lab.assets import services
from lab.assets.models import DatasetStatus, RegisteredModel
from lab.runs.models import Run
from trainer.hf.finite import nonfinite_tensors, tensor_is_finite
from trainer.hf.validate import read_safetensors_header

pytestmark = pytest.mark.slow  # a transformers checkpoint

NORM = "model.norm.weight"


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    save_hf_checkpoint("llama", folder)
    save_char_tokenizer(folder)
    return folder


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_the_scan_names_the_tensor(clean, tmp_path, value):
    folder = poisoned(clean, tmp_path / "bad", NORM, value)
    assert nonfinite_tensors(folder) == [NORM]
    assert nonfinite_tensors(clean) == []
    entry = read_safetensors_header(folder / "model.safetensors")[NORM]
    assert not tensor_is_finite(entry)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_registration_refuses_non_finite_weights(api, clean, tmp_path, value):
    folder = poisoned(clean, tmp_path / "bad", NORM, value)
    response = api.post("/api/models", {"name": "m", "path": str(folder)}, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert list(errors) == ["path"] and NORM in errors["path"][0] and "NaN" in errors["path"][0]
    assert not RegisteredModel.objects.exists()


def test_registration_refuses_an_integer_weight(api, clean, tmp_path):
    folder = retyped(clean, tmp_path / "int", NORM)
    response = api.post("/api/models", {"name": "m", "path": str(folder)}, format="json")
    assert response.status_code == 400, response.content
    message = response.json()["errors"]["path"][0]
    assert NORM in message and "I32" in message


def test_a_large_checkpoint_is_scanned_by_the_control_worker(user, clean, tmp_path, settings):
    settings.LAB_MODEL_INLINE_BYTES = 0  # every checkpoint counts as large
    folder = poisoned(clean, tmp_path / "bad", NORM, float("nan"))
    model = services.register_model(owner=user, name="big", path=str(folder))
    assert model.status == DatasetStatus.CHECKING
    with pytest.raises(Exception, match="still being checked"):
        services.model_overrides(model)
    assert services.check_model(model.pk) == DatasetStatus.FAILED
    model.refresh_from_db()
    assert model.status == DatasetStatus.FAILED and NORM in model.error
    with pytest.raises(Exception, match="failed its check"):
        services.model_overrides(model)
    good = services.register_model(owner=user, name="good", path=str(clean))
    assert services.check_model(good.pk) == DatasetStatus.READY
    assert services.check_model(good.pk) == "skipped"  # a repeated delivery


def test_a_run_cannot_pick_a_model_still_being_checked(api, user, experiment, clean, settings):
    settings.LAB_MODEL_INLINE_BYTES = 0
    services.register_model(owner=user, name="big", path=str(clean))
    response = api.post(
        "/api/runs",
        {"experiment": experiment.pk, "preset": "moe-grpo", "model": "big"},
        format="json",
    )
    assert (
        response.status_code == 400
        and "still being checked" in response.json()["errors"]["model"][0]
    )
    assert not Run.objects.exists()
