"""Errors raised when a policy file cannot be used."""


class PolicyLoadError(ValueError):
    """A policy file exists but cannot be loaded: truncated, corrupt, not an ML-Agents policy,
    its recorded shapes disagree with its weights, or it uses a network feature this project
    cannot run (goal-conditioned hypernetwork bodies, LSTMs of more than one layer, unknown
    encoders or ONNX operators). Vector, visual, continuous, discrete, hybrid and recurrent
    policies all load. The message names the file and the cause."""
