"""Errors raised when a policy file cannot be used."""


class PolicyLoadError(ValueError):
    """A policy file exists but cannot be loaded: truncated, corrupt, not an ML-Agents policy,
    or a kind of policy this project cannot run (visual, discrete, recurrent, mismatched shapes).
    The message names the file and the cause."""
