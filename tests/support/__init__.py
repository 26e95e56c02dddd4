"""Helpers the tests share (importable as `tests.support.*`; `tests/conftest.py` holds only
pytest's hooks and fixtures): fixture paths, processes and ports, the session's Ray cluster,
envs helpers, a float64 reference policy."""
