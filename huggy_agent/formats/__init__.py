"""Policy file formats: one module per format, all producing a `LoadedPolicy`."""

from __future__ import annotations

from pathlib import Path

from huggy_agent.errors import PolicyLoadError
from huggy_agent.formats.loaded import LoadedPolicy
from huggy_agent.formats.results import resolve_results_folder
from huggy_agent.formats.sources import resolve_policy_source


def load_policy(path: str | Path) -> LoadedPolicy:
    """Load an ML-Agents policy, local or on the Hugging Face Hub.

    Args:
        path: an `.onnx` export, a `.pt` checkpoint or a `results/<run>/` folder (its final
            `<Behavior>.onnx`, else its newest checkpoint), or a Hub source
            `hf://owner/repo[@revision][/path]` (see `huggy_agent.formats.sources`).

    Returns:
        The architecture, the actor's float32 weights and their origin.

    Raises:
        FileNotFoundError: the path, results folder or Hub source does not exist.
        ValueError: a malformed Hub source.
        PolicyLoadError: anything unusable: an unknown format, a damaged or unsupported file.
    """
    path = resolve_policy_source(path).path
    if not path.exists():
        raise FileNotFoundError(f"policy not found: {path} (expected a .onnx, a .pt or a results folder)")
    if path.is_dir():
        return load_policy(resolve_results_folder(path))
    # start-up time: each format's module imports torch (and onnx), which `huggy --help` and
    # the parsers that name policies (envs.cli, via formats.sources) must not pay for
    if path.suffix == ".onnx":
        from huggy_agent.formats.mlagents_onnx import load_onnx

        return load_onnx(path)
    if path.suffix == ".pt":
        from huggy_agent.formats.mlagents_pt import load_pt

        return load_pt(path)
    raise PolicyLoadError(f"{path}: unknown policy format {path.suffix!r}; expected .onnx, .pt or a "
                          "results folder")


__all__ = ["LoadedPolicy", "load_policy"]
