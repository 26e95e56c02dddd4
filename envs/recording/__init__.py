"""Keeping what a policy does, fed by the rollout loop (`envs.rollout`): the sink interface
(`base`), whole counted episodes (`episodes`), videos (`video`), ML-Agents demonstrations
(`demo`), Minari datasets (`dataset`) and the replay of one episode (`replay`).

Nothing is imported here: `envs.rollout` imports `base`, and `replay` imports `envs.rollout`.
"""
