"""Results folders: the checkpoint table from run_logs/training_status.json, and which file a
folder stands for."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from huggy_agent import HuggyAgent, PolicyLoadError
from huggy_agent.formats.results import list_checkpoints, resolve_results_folder
from huggy_agent.numerics import FP32_ACTION_ATOL
from tests.support.fixtures import FIXTURE_RUNS, fixtures_dir

pytestmark = pytest.mark.numerics  # rerun by .ci/run under other CPU kernel paths


def _recorded(run: str) -> list[dict]:
    """The run's checkpoint records, read straight from its status file."""
    status = json.loads((fixtures_dir() / run / "run_logs" / "training_status.json").read_text())
    return status["Huggy"]["checkpoints"]


def _local(folder: Path, record: dict) -> Path | None:
    """Where this copy of the folder holds a recorded checkpoint: its .onnx, else its .pt."""
    names = [Path(p).name for p in [record["file_path"], *record["auxillary_file_paths"]]]
    for suffix in (".onnx", ".pt"):
        for name in names:
            if name.endswith(suffix) and (folder / "Huggy" / name).is_file():
                return folder / "Huggy" / name
    return None


def _copy_run(run: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(fixtures_dir() / run, tmp_path / run))


@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_list_checkpoints_matches_the_status_file(run: str) -> None:
    folder = fixtures_dir() / run
    records = sorted(_recorded(run), key=lambda r: r["steps"])
    entries = list_checkpoints(folder)
    assert [e.step for e in entries] == [r["steps"] for r in records]
    assert [e.reward for e in entries] == [r["reward"] for r in records]
    assert [e.path for e in entries] == [_local(folder, r) for r in records]
    assert {e.behavior for e in entries} == {"Huggy"}
    assert len(entries) == 10


@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_only_the_final_checkpoint_file_is_present_in_the_fixtures(run: str) -> None:
    entries = list_checkpoints(fixtures_dir() / run)
    assert all(e.path is None for e in entries[:-1])
    final = entries[-1]
    assert final.path == fixtures_dir() / run / "Huggy" / f"Huggy-{final.step}.onnx"


def test_checkpoint_on_disk_but_not_in_the_status_file_is_listed(tmp_path: Path) -> None:
    folder = _copy_run("ppo_baseline", tmp_path)
    extra = folder / "Huggy" / "Huggy-2500000.pt"
    shutil.copy(folder / "Huggy" / "Huggy-2000343.pt", extra)
    last = list_checkpoints(folder)[-1]
    assert (last.step, last.path, last.reward) == (2_500_000, extra, None)


def test_pt_is_listed_when_the_onnx_checkpoint_is_gone(tmp_path: Path) -> None:
    folder = _copy_run("ppo_num_layers_2", tmp_path)
    (folder / "Huggy" / "Huggy-2000139.onnx").unlink()
    assert list_checkpoints(folder)[-1].path == folder / "Huggy" / "Huggy-2000139.pt"


@pytest.mark.parametrize("run", FIXTURE_RUNS)
def test_a_results_folder_resolves_to_its_final_export(run: str) -> None:
    folder = fixtures_dir() / run
    assert resolve_results_folder(folder) == folder / "Huggy.onnx"


def test_without_final_export_the_newest_checkpoint_is_used(tmp_path: Path) -> None:
    folder = _copy_run("ppo_baseline", tmp_path)
    (folder / "Huggy.onnx").unlink()
    assert resolve_results_folder(folder) == folder / "Huggy" / "Huggy-2000343.onnx"
    newer = folder / "Huggy" / "Huggy-2100000.pt"
    shutil.copy(folder / "Huggy" / "Huggy-2000343.pt", newer)
    assert resolve_results_folder(folder) == newer


def test_only_checkpoint_pt_left_is_used(tmp_path: Path) -> None:
    folder = _copy_run("ppo_baseline", tmp_path)
    (folder / "Huggy.onnx").unlink()
    for name in ("Huggy-2000343.onnx", "Huggy-2000343.pt"):
        (folder / "Huggy" / name).unlink()
    assert resolve_results_folder(folder) == folder / "Huggy" / "checkpoint.pt"
    assert HuggyAgent.from_checkpoint(folder, device="cpu").describe()["format"] == "mlagents-pt"


def test_agent_from_folder_acts_like_the_final_export() -> None:
    folder = fixtures_dir() / "ppo_num_layers_2"
    obs = np.random.default_rng(5).standard_normal((32, 59)).astype(np.float32)
    agent = HuggyAgent.from_checkpoint(folder, device="cpu")
    assert agent.describe()["source"] == str(folder / "Huggy.onnx")
    direct = HuggyAgent.from_checkpoint(folder / "Huggy.onnx", device="cpu")
    assert np.abs(agent.compute_action(obs) - direct.compute_action(obs)).max() <= FP32_ACTION_ATOL


def test_agent_from_folder_without_final_export_loads_the_checkpoint(tmp_path: Path) -> None:
    folder = _copy_run("ppo_normalize_False", tmp_path)
    (folder / "Huggy.onnx").unlink()
    description = HuggyAgent.from_checkpoint(folder, device="cpu").describe()
    assert description["source"] == str(folder / "Huggy" / "Huggy-2000073.onnx")
    assert description["step"] == 2_000_073


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"results folder not found: {tmp_path / 'nope'}")):
        list_checkpoints(tmp_path / "nope")


def test_empty_folder_names_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{tmp_path}: no <Behavior>.onnx and no checkpoint found; expected an ML-Agents "
            "results/<run_id>/ folder")):
        HuggyAgent.from_checkpoint(tmp_path, device="cpu")


def test_two_final_exports_are_ambiguous(tmp_path: Path) -> None:
    folder = _copy_run("ppo_baseline", tmp_path)
    shutil.copy(folder / "Huggy.onnx", folder / "Other.onnx")
    with pytest.raises(PolicyLoadError, match=re.escape(
            "several final exports ['Huggy.onnx', 'Other.onnx']; name the one to load")):
        resolve_results_folder(folder)


def test_corrupt_status_file(tmp_path: Path) -> None:
    folder = _copy_run("ppo_baseline", tmp_path)
    (folder / "run_logs" / "training_status.json").write_text('{"Huggy": ')
    with pytest.raises(PolicyLoadError, match=re.escape("training_status.json: not valid JSON")):
        list_checkpoints(folder)


def test_folder_without_status_file_lists_files_on_disk(tmp_path: Path) -> None:
    folder = _copy_run("ppo_baseline", tmp_path)
    (folder / "run_logs" / "training_status.json").unlink()
    entries = list_checkpoints(folder)
    assert [(e.step, e.reward) for e in entries] == [(2_000_343, None)]
