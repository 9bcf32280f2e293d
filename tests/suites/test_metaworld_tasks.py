"""Every Meta-World v3 task as ours: the env contract, Gymnasium's checker and exact snapshots.

Runs in the suites' environment (.venv-suites, `make suites`; `make test` runs it there).
``tasks.make`` checks each task's snapshots by replay (state and pixels, restored in the same
env and in a fresh one) the first time it builds it; a task that failed would raise here.
"""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import tasks
from tasks import language
from tasks.suites import metaworld


@pytest.mark.parametrize("name", metaworld.TASKS)
def test_every_v3_task_keeps_the_contract_and_its_snapshots_are_exact(name):
    env = tasks.make(f"metaworld/{name}", obs_mode="pixels_state")  # replay check inside
    try:
        obs, info = env.reset(seed=7)
        assert set(obs) == {"state", "pixels", "proprio", "instruction"}
        assert obs["state"].shape == (8 + 39,) and obs["state"].dtype == np.float32
        assert obs["pixels"].shape == (84, 84, 3) and obs["pixels"].dtype == np.uint8
        assert obs["pixels"].std() > 5  # a scene, not a blank frame
        assert np.array_equal(obs["proprio"], obs["state"][:8])
        assert language.detokenize(obs["instruction"]) == info["instruction"]
        assert info["is_success"] is False and info["steps"] == 0
        again, _ = env.reset(seed=7)
        other, _ = env.reset(seed=8)
        assert all(np.array_equal(obs[key], again[key]) for key in obs)
        assert not np.array_equal(obs["state"], other["state"])  # a new start state
        check_env(env, skip_render_check=True)
        env.reset(seed=1)
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        assert np.isfinite(reward) and info["reward_terms"] == {"suite": reward}
        assert not truncated and terminated == info["is_success"]
    finally:
        env.close()


def test_every_suite_instruction_is_its_task_name_in_our_vocabulary():
    """No task's instruction loses a word to ``<unk>``, and the 53 instructions are all distinct,
    so that one policy over several suite tasks can tell them apart by language."""
    from tasks.suites.robosuite import INSTRUCTIONS

    texts = {name: name.rsplit("-v", 1)[0].replace("-", " ") for name in metaworld.TASKS}
    texts.update(INSTRUCTIONS)
    for name, text in texts.items():
        ids = language.tokenize(text)  # strict: raises on a word outside the vocabulary
        assert language.UNK not in ids and language.detokenize(ids) == text, name
    assert len({language.tokenize(text).tobytes() for text in texts.values()}) == len(texts) == 53
    assert set(language.SUITE_WORDS).isdisjoint(language.CORE_VOCAB)
    assert language.VOCAB[:language.CORE_SIZE] == language.CORE_VOCAB  # ours keep their ids
    env = tasks.make("metaworld/button-press-topdown-v3", verify=False)
    try:
        assert env.reset(seed=0)[1]["instruction"] == "button press topdown"
    finally:
        env.close()


def _expert_successes(name: str, seeds, steps: int = 500) -> int:
    env = tasks.make(f"metaworld/{name}", verify=False)
    wins = 0
    for seed in seeds:
        env.reset(seed=seed)
        for _ in range(steps):
            _, _, terminated, truncated, info = env.step(env.expert_action())
            if terminated or truncated:
                break
        wins += info["is_success"]
    env.close()
    return wins


def test_metaworlds_scripted_policies_solve_mt10_through_the_adapter():
    # 3 held-out starts per task; the rates over 20 seeds are in docs/tasks.md
    wins = {name: _expert_successes(name, range(1000, 1003)) for name in metaworld.MT10}
    assert sum(wins.values()) >= 27, wins
    assert min(wins.values()) >= 2, wins
