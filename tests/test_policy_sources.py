"""Policies from the Hugging Face Hub (`hf://owner/repo[@revision][/path]`), offline: a cache laid
out as huggingface_hub lays it out (models--OWNER--NAME/snapshots/<commit>/..., refs/main) is built
from the fixture files in each test, with HF_HUB_OFFLINE=1. Nothing is downloaded.

The fast tests resolve sources and load policies in this process; the `standin` ones run
`huggy rollout` and `huggy evaluate --no-ray` as subprocesses against the same cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from huggy_agent import HuggyAgent
from huggy_agent.cli import main
from huggy_agent.formats import load_policy
from huggy_agent.formats.sources import (
    hub_provenance,
    parse_hub_source,
    resolve_policy_source,
)
from tests.support.fixtures import REPO_ROOT, fixtures_dir
from tests.support.processes import free_port

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLD_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def build_cache(root: Path) -> Path:
    """HF_HUB_CACHE with repository huggy-test/ppo: main at COMMIT holds the ppo_baseline run
    at its top level (Huggy.onnx, Huggy/Huggy-2000343.pt, ...) and the ppo_normalize_False run
    in the folder `other/`; OLD_COMMIT holds only Huggy.onnx of ppo_normalize_False."""
    repo = root / "models--huggy-test--ppo"
    snapshot = repo / "snapshots" / COMMIT
    shutil.copytree(fixtures_dir() / "ppo_baseline", snapshot)
    shutil.copytree(fixtures_dir() / "ppo_normalize_False", snapshot / "other")
    old = repo / "snapshots" / OLD_COMMIT
    old.mkdir(parents=True)
    shutil.copy(fixtures_dir() / "ppo_normalize_False" / "Huggy.onnx", old / "Huggy.onnx")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return root


@pytest.fixture
def offline_cache(tmp_path, monkeypatch) -> Path:
    cache = build_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_parse_hub_sources() -> None:
    ref = parse_hub_source("hf://owner/repo@v1.0/results/run/Huggy.onnx")
    assert (ref.repo_id, ref.revision, ref.path) == ("owner/repo", "v1.0", "results/run/Huggy.onnx")
    assert str(ref) == "hf://owner/repo@v1.0/results/run/Huggy.onnx"
    ref = parse_hub_source("hf://owner/repo")
    assert (ref.repo_id, ref.revision, ref.path) == ("owner/repo", None, "")
    for bad in ("hf://owner", "hf://owner/", "hf://owner/repo@", "hf://own er/repo",
                "hf://owner/repo/../x.onnx"):
        with pytest.raises(ValueError, match="expected"):
            parse_hub_source(bad)


def test_resolve_file_folder_and_revision_offline(offline_cache: Path) -> None:
    snapshot = offline_cache / "models--huggy-test--ppo" / "snapshots" / COMMIT
    found = resolve_policy_source("hf://huggy-test/ppo/Huggy.onnx")
    assert found.path == snapshot / "Huggy.onnx" and found.revision == COMMIT
    assert found.describe() == f"hf://huggy-test/ppo@{COMMIT}/Huggy.onnx"
    folder = resolve_policy_source("hf://huggy-test/ppo@main/other")
    assert folder.path == snapshot / "other" and folder.revision == COMMIT
    root = resolve_policy_source("hf://huggy-test/ppo")
    assert root.path == snapshot and root.repo_path == ""
    old = resolve_policy_source(f"hf://huggy-test/ppo@{OLD_COMMIT}/Huggy.onnx")
    assert old.revision == OLD_COMMIT
    assert old.path.read_bytes() == (fixtures_dir() / "ppo_normalize_False" /
                                     "Huggy.onnx").read_bytes()
    provenance = hub_provenance(snapshot / "Huggy" / "Huggy-2000343.pt")
    assert provenance is not None and provenance.repo_id == "huggy-test/ppo"
    assert provenance.revision == COMMIT and provenance.repo_path == "Huggy/Huggy-2000343.pt"
    assert hub_provenance(fixtures_dir() / "ppo_baseline" / "Huggy.onnx") is None
    with pytest.raises(FileNotFoundError, match=r"policy not found: hf://huggy-test/ppo/Nope.onnx"
                                                r": no such repository, revision or file in the "
                                                r"cache .* \(HF_HUB_OFFLINE is set\)"):
        resolve_policy_source("hf://huggy-test/ppo/Nope.onnx")
    with pytest.raises(FileNotFoundError, match="policy not found: hf://someone/else") as missing:
        resolve_policy_source("hf://someone/else/Huggy.onnx")
    # what to do, in this project's terms: no advice about huggingface_hub's own arguments
    assert str(missing.value).endswith("(not downloaded yet: unset HF_HUB_OFFLINE and run once "
                                       "with network access to fill the cache)")
    assert "local_files_only" not in str(missing.value)
    with pytest.raises(FileNotFoundError, match="the repository has no 'missing_folder'"):
        resolve_policy_source("hf://huggy-test/ppo/missing_folder")


def test_an_unreachable_hub_is_named_as_such(tmp_path: Path) -> None:
    """Online, with nothing listening at the Hub's address (a free port on 127.0.0.1, in a
    process of its own, as huggingface_hub reads HF_ENDPOINT once): the error says the Hub
    could not be reached, with the connection's error, not that the repository does not exist."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path / "empty"))
    code = ("from huggy_agent.formats.sources import resolve_policy_source\n"
            "try:\n    resolve_policy_source('hf://huggy-test/ppo')\n"
            "except FileNotFoundError as error:\n    print(error)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.startswith(f"policy hf://huggy-test/ppo: the Hub at {endpoint} could not be "
                          "reached (")
    assert "Connection refused" in out and "set HF_HUB_OFFLINE=1" in out
    assert "no such repository" not in out


def test_hub_policy_loads_as_the_local_file(offline_cache: Path) -> None:
    local = HuggyAgent(fixtures_dir() / "ppo_baseline" / "Huggy.onnx", device="cpu")
    hub = HuggyAgent("hf://huggy-test/ppo/Huggy.onnx", device="cpu")
    assert hub.fingerprint == local.fingerprint
    assert hub.describe()["hub_source"] == f"hf://huggy-test/ppo@{COMMIT}/Huggy.onnx"
    assert local.describe()["hub_source"] is None
    # A folder in the repository loads as a results folder: its final export.
    other = HuggyAgent("hf://huggy-test/ppo/other", device="cpu")
    assert other.fingerprint == HuggyAgent(fixtures_dir() / "ppo_normalize_False",
                                           device="cpu").fingerprint
    assert load_policy("hf://huggy-test/ppo/other").origin.parent.name == "other"


def test_huggy_info_names_the_hub_revision(offline_cache: Path, capsys) -> None:
    assert main(["info", "--policy", "hf://huggy-test/ppo/Huggy.onnx", "--device", "cpu"]) == 0
    assert f"hf://huggy-test/ppo@{COMMIT}/Huggy.onnx" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["info", "--policy", "hf://huggy-test/ppo/Nope.onnx"])
    assert "argument --policy: policy not found: hf://huggy-test/ppo/Nope.onnx" in \
        capsys.readouterr().err


def test_expand_hub_sources_for_evaluation(offline_cache: Path) -> None:
    from deploy.evaluation.sources import policy_specs

    specs = policy_specs(["hf://huggy-test/ppo", "hf://huggy-test/ppo/other/Huggy.onnx"])
    assert [spec.label for spec in specs] == ["ppo@2000343", "other/Huggy.onnx"]
    assert specs[0].run == "ppo" and specs[0].step == 2000343
    assert specs[0].source == f"hf://huggy-test/ppo@{COMMIT}" and specs[0].revision == COMMIT
    assert specs[1].source == f"hf://huggy-test/ppo@{COMMIT}/other/Huggy.onnx"


def test_serve_app_pins_a_hub_policy_to_its_commit(offline_cache: Path) -> None:
    from deploy.serving.settings import AppArgs

    args = AppArgs(policy="hf://huggy-test/ppo@main/Huggy.onnx")
    assert args.policy == f"hf://huggy-test/ppo@{COMMIT}/Huggy.onnx"
    with pytest.raises(ValueError, match="policy not found: hf://huggy-test/ppo/Nope.onnx"):
        AppArgs(policy="hf://huggy-test/ppo/Nope.onnx")


def _offline_env(cache: Path) -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache))


@pytest.mark.standin
def test_rollout_and_evaluate_from_the_hub_offline(tmp_path) -> None:
    """`huggy rollout --policy hf://...` plays the same episodes as the local file and records
    the commit; `huggy evaluate hf://... --no-ray` writes it into evaluation.json."""
    cache = build_cache(tmp_path / "hub")
    common = ["--episodes", "18", "--seed", "3", "--no-progress"]
    records = {}
    for name, policy in (("hub", "hf://huggy-test/ppo/Huggy.onnx"),
                         ("local", str(fixtures_dir() / "ppo_baseline" / "Huggy.onnx"))):
        done = subprocess.run(
            [sys.executable, "-m", "huggy_agent.cli", "rollout", "--policy", policy,
             "--record", str(tmp_path / f"{name}.jsonl"), *common],
            cwd=REPO_ROOT, env=_offline_env(cache), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        records[name] = [json.loads(line) for line in
                         (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert [r["return"] for r in records["hub"]] == [r["return"] for r in records["local"]]
    assert {r["policy"] for r in records["hub"]} == {f"hf://huggy-test/ppo@{COMMIT}/Huggy.onnx"}
    out = tmp_path / "eval"
    done = subprocess.run(
        [sys.executable, "-m", "huggy_agent.cli", "evaluate", "hf://huggy-test/ppo/other",
         "--no-ray", "--max-steps", "40", "--out", str(out), "--model-card", *common],
        cwd=REPO_ROOT, env=_offline_env(cache), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (entry,) = json.loads((out / "evaluation.json").read_text())["policies"]
    assert entry["revision"] == COMMIT and entry["source"] == f"hf://huggy-test/ppo@{COMMIT}/other"
    assert (out / "model_cards" / "other" / "README.md").is_file()  # never into the cache
    assert not (cache / "models--huggy-test--ppo" / "snapshots" / COMMIT / "other" /
                "README.md").exists()
