"""Stable-Baselines3's PPO, A2C and TRPO on the harness's tasks: the run
(:mod:`~harness.algos.sb3.run`), its environments (:mod:`~harness.algos.sb3.envs`) and the
callbacks for the curriculum, evaluation and success logging
(:mod:`~harness.algos.sb3.callbacks`); never a fork of SB3."""
