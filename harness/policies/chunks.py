"""Action chunks: one decision predicts ``H`` actions, of which the first ``k`` are played.

A token policy with ``chunk_size = H`` scores ``H * action_dim`` tokens per observation, step
major: token ``h * action_dim + d`` is dimension ``d`` of the chunk's action ``h``. The rollout
plays ``k = execute_steps`` of them before it asks again (ACT's and LeRobot's ``n_action_steps``);
an attempt that ends earlier plays fewer, so each decision records how many it ``executed``.

The log-probability of a decision is that of the actions it played: the tokens of its executed
steps. The tail it never played had no effect on the environment, so the outcome says nothing
about it; counting its tokens in the ratio would only add noise (their ratio moves the policy
on actions whose result was never seen). With ``k = H`` every token counts. In the group
trainer each executed token keeps its own clipped ratio, as every token does with ``H = 1``
(:func:`harness.objectives.policy_loss`); a decision's log-probability, the sum of those
tokens' (over :func:`executed_token_mask`), is what a head without tokens gives as one unit.
"""

from __future__ import annotations

import numpy as np
import torch


def executed_token_mask(executed: torch.Tensor, chunk_tokens: int,
                        action_dim: int) -> torch.Tensor:
    """Which of each decision's tokens belong to the steps it played.

    Args:
        executed: ``(B,)`` int, control steps each decision played (``1 <= executed <= H``).
        chunk_tokens: ``H * action_dim``, tokens per decision.
        action_dim: Tokens per control step.

    Returns:
        ``(B, chunk_tokens)`` bool: token ``j`` of row ``b`` counts when
        ``j // action_dim < executed[b]``.
    """
    executed = torch.as_tensor(executed)
    step_of_token = torch.arange(chunk_tokens, device=executed.device) // action_dim
    return step_of_token.unsqueeze(0) < executed.unsqueeze(1)


def chunk_targets(actions: np.ndarray, episode_ids: np.ndarray,
                  chunk_size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Behaviour-cloning targets of chunks: for step ``t``, actions ``t .. t+H-1`` of its episode.

    The last ``H - 1`` steps of an episode have fewer than ``H`` actions after them. Their
    missing actions are masked out of the loss rather than padded with copies of the last one:
    a copied action would teach the policy to hold the expert's final command for steps the
    expert never took (LeRobot's ``action_is_pad`` masks them the same way). The masked slots
    hold the last action, so the array is well defined.

    Args:
        actions: ``(N, A)`` float actions, episodes contiguous and in step order.
        episode_ids: ``(N,)`` episode of each step.
        chunk_size: ``H >= 1``.

    Returns:
        ``(targets (N, H, A), valid (N, H) bool)``; ``valid`` is ``None`` when every slot is an
        action of the episode (always with ``H = 1``).

    Raises:
        ValueError: ``chunk_size < 1``, mismatched lengths, or an episode's steps not
            contiguous.
    """
    actions, episode_ids = np.asarray(actions), np.asarray(episode_ids)
    if chunk_size < 1 or len(actions) != len(episode_ids):
        raise ValueError(f"chunk_size={chunk_size} with {len(actions)} actions and "
                         f"{len(episode_ids)} episode ids; need chunk_size >= 1 and one id per "
                         "action")
    changes = np.flatnonzero(episode_ids[1:] != episode_ids[:-1]) + 1
    starts = np.concatenate(([0], changes))
    if len(np.unique(episode_ids)) != len(starts):
        raise ValueError("the demos' episodes are not contiguous: chunks are cut within an "
                         "episode's consecutive steps")
    ends = np.concatenate((changes, [len(actions)]))  # one past each step's episode end
    last = np.repeat(ends - 1, ends - starts)  # (N,) index of each step's episode's last step
    wanted = np.arange(len(actions))[:, None] + np.arange(chunk_size)[None, :]  # (N, H)
    valid = wanted <= last[:, None]
    targets = actions[np.minimum(wanted, last[:, None])]
    return targets, (None if valid.all() else valid)
