"""The update rule of the group-relative fine-tuner: advantages, then clipped-surrogate epochs.

:class:`GroupTrainer` holds the policy being fine-tuned, the frozen reference policy (its starting
weights), the optimiser and the minibatch generator, all on the run's ``device``. The maths are
the pure functions of :mod:`harness.objectives`; this module turns a
:class:`~harness.algos.rollout.core.RolloutBatch` into their tensors.

Every log-probability (the sampling policy's ``old_logp``, the policy's at each step, the
reference's) is taken at the sampling temperature ``algo.temperature``, so the ratio compares
the very distributions the tokens were drawn from and is exactly 1 before the first step.

The data are decisions (:class:`~harness.algos.rollout.core.RolloutBatch`): each is evaluated once
on the observation it was taken on, and the policy spec's :meth:`~harness.policies.PolicySpec.
executed_mask` says which of its log-probability entries count, the units of the control steps
it played (:mod:`harness.policies.chunks`). An attempt's units in the loss are those entries,
decision after decision; with one action per decision they are its tokens, step after step.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import numpy as np
import torch

from harness.algos.rollout.core import RolloutBatch
from harness.objectives import (
    gae,
    group_advantages,
    kl_k3,
    policy_loss,
    ratio_units,
    value_loss,
)
from harness.policies import Policy, obs_to_batch

log = logging.getLogger(__name__)
ESTIMATORS_ON_GROUPS = ("grpo", "dr_grpo", "rloo")  # compare attempts within a group


DIAGNOSTIC_STEPS = 512  # decisions on which entropy and KL to the reference are estimated

def attempt_tensor(values: torch.Tensor, counts: np.ndarray,
                   valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-decision values ``(N_decisions, U)`` -> the valid ones of each attempt, padded,
    ``(A, T)``, and the mask of what is not padding.

    Args:
        values: One row per decision, attempts contiguous.
        counts: ``(A,)`` decisions of each attempt.
        valid: ``(N_decisions, U)`` bool, the entries that count (the executed tokens).
    """
    rows = torch.split(values.reshape(len(values), -1), counts.tolist())
    keeps = torch.split(valid.reshape(len(valid), -1), counts.tolist())
    flat = [v[keep] for v, keep in zip(rows, keeps, strict=True)]
    padded = torch.nn.utils.rnn.pad_sequence(flat, batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(v, dtype=torch.bool) for v in flat],
                                           batch_first=True)
    return padded, mask


def select_attempts(batch_obs: dict[str, torch.Tensor], tokens: torch.Tensor, starts: np.ndarray,
                    counts: np.ndarray, attempts: np.ndarray):
    """Decisions of the chosen attempts, concatenated in their order (``starts`` and
    ``counts``: each attempt's first decision and number of decisions)."""
    index = np.concatenate([np.arange(starts[a], starts[a] + counts[a]) for a in attempts])
    index_t = torch.as_tensor(index, device=tokens.device)
    return {k: v[index_t] for k, v in batch_obs.items()}, tokens[index_t], index_t


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)``: 1 for a perfect critic, 0 for one that
    predicts the mean, negative for a worse one; NaN when the returns do not vary."""
    spread = float(returns.var()) if len(returns) > 1 else 0.0
    return 1.0 - float((returns - values).var()) / spread if spread > 0 else float("nan")


class GroupTrainer:
    """State and update rule of the group-relative fine-tuner (see the module docstring).

    Args:
        cfg: The run's ``TrainConfig`` (``cfg.algo`` a ``GroupAlgoConfig``; ``algo.name`` is
            the advantage estimator).
        policy: The policy to fine-tune (its starting weights become the KL reference).
        device: Where the policy, the reference, the optimiser state and every batch live.
    """

    def __init__(self, cfg, policy: Policy, device: torch.device | str = "cpu") -> None:
        algo = cfg.algo
        self.cfg = cfg
        self.algo = algo
        self.device = torch.device(device)
        self.estimator = algo.name
        if self.estimator in ESTIMATORS_ON_GROUPS and algo.group_size < 2:
            raise ValueError(f"algo.group_size={algo.group_size}: the {algo.name!r} estimator "
                             "compares attempts within a group and needs group_size >= 2")
        self.aggregation = algo.aggregation  # conf/algo/dr_grpo.yaml picks token_sum_const
        self.policy = policy.to(self.device)
        # The policy provides its frozen reference: a deep copy, or (hf_vla with LoRA) itself
        # with the adapters switched off, with no second copy of the weights.
        self.reference = policy.frozen_reference()
        self.freeze_encoder = bool(algo.freeze_encoder)
        if self.freeze_encoder:
            policy.freeze_encoder()
        # vla_ppo's value network: the policy's own value head (shared features) or a copy of
        # the start policy's network, trained by the value loss alone.
        self.critic = policy
        if self.estimator == "vla_ppo" and algo.critic.network == "separate":
            self.critic = copy.deepcopy(policy)
            if self.freeze_encoder:
                self.critic.freeze_encoder()
        self._trainable = [p for p in policy.parameters() if p.requires_grad]
        if self.critic is not policy:
            self._trainable += [p for p in self.critic.parameters() if p.requires_grad]
        # What the value network alone moves: a separate critic whole, else the value head.
        critic_own = (list(self.critic.parameters()) if self.critic is not policy
                      else policy.value_parameters())
        self._critic_ids = {id(p) for p in critic_own}
        self.optimizer = torch.optim.Adam(self._parameter_groups(), lr=algo.learning_rate)
        # One generator for the run (saved in checkpoints): each epoch of each iteration draws
        # its own minibatch order.
        self.generator = np.random.default_rng(cfg.seeds.generator)
        steps = algo.num_iterations * -(-algo.num_start_states * algo.group_size
                                        // algo.minibatch_size)
        if steps == 1:
            log.warning("algo.num_iterations=%d, algo.minibatch_size=%d: one gradient step per "
                        "batch, so the ratio is always 1 and clip_low/clip_high never act",
                        algo.num_iterations, algo.minibatch_size)
        self.max_tokens = None  # set from the env's episode limit (set_episode_limit)
        self.anchor = None  # algo.bc_coef's demos (harness.algos.group.anchor), set by the run
        self.updates_done = 0  # update() calls: the critic's warm-up counts them

    def _parameter_groups(self) -> list[dict[str, Any]]:
        """One group, or with ``algo.critic.learning_rate`` the value network's own."""
        rate = self.algo.critic.learning_rate
        if rate is None:
            return [{"params": self._trainable}]
        return [{"params": [p for p in self._trainable if id(p) not in self._critic_ids]},
                {"params": [p for p in self._trainable if id(p) in self._critic_ids],
                 "lr": rate}]

    def set_episode_limit(self, max_episode_steps: int) -> None:
        """Dr. GRPO's constant ``T_max`` from the attempts' step limit, in ratio units."""
        self.max_tokens = self.policy.spec.max_ratio_units(max_episode_steps,
                                                           self.algo.ratio.unit)

    @property
    def warming_up(self) -> bool:
        """Whether this update trains the value network alone (``algo.critic.
        warmup_iterations``)."""
        return self.updates_done < self.algo.critic.warmup_iterations

    def advantages(self, rollout: RolloutBatch, rewards: np.ndarray) -> torch.Tensor:
        """``(A,)`` advantages of the attempts of ``rollout`` by the run's estimator."""
        rewards_t = torch.as_tensor(rewards, dtype=torch.float32, device=self.device)
        values = None
        if self.estimator in ("critic", "vla_ppo"):
            first = {k: v[rollout.starts] for k, v in rollout.obs.items()}
            with torch.no_grad():
                values = self.critic.value(obs_to_batch(first, device=self.device, batched=True))
        # vla_ppo trains on per-decision GAE advantages (update()); per attempt it reports
        # r - V(s0), which says whether a group carries signal as the critic baseline's does.
        estimator = "critic" if self.estimator == "vla_ppo" else self.estimator
        return group_advantages(rewards_t, self.algo.group_size, estimator, values=values)

    def group_has_signal(self, advantages: torch.Tensor) -> np.ndarray:
        """``(groups,)`` bool: groups whose attempts do not all have zero advantage.

        That is the estimator's own "no signal": an all-equal group for ``grpo``, ``dr_grpo``
        and ``rloo``; an all-failed group for ``reinforce`` (r = 0); for ``critic``
        (r - V(s0)) a group carries signal unless the value matches every outcome exactly.
        """
        grouped = advantages.detach().view(-1, self.algo.group_size)
        return (grouped != 0).any(dim=1).cpu().numpy()

    def update(self, rollout: RolloutBatch, rewards: np.ndarray, advantages: torch.Tensor,
               keep_groups: np.ndarray) -> dict[str, float]:
        """``num_iterations`` epochs of minibatch updates on the kept groups; returns metrics.

        Only the steps of the kept groups' attempts are evaluated: with ``zero_signal=drop``
        the others carry no gradient, so no log-probability of theirs is computed, and the
        loss of each minibatch is aggregated over kept attempts only.

        Args:
            rollout: The iteration's attempts.
            rewards: ``(A,)`` verifier rewards.
            advantages: ``(A,)`` from :meth:`advantages`.
            keep_groups: ``(groups,)`` bool, the groups to train on.
        """
        algo, policy = self.algo, self.policy
        obs = obs_to_batch(rollout.obs, batched=True, device=self.device)
        tokens = torch.as_tensor(rollout.decisions, device=self.device)
        executed = torch.as_tensor(rollout.executed, device=self.device)
        valid = policy.spec.executed_mask(executed)  # the native units (entropy's)
        unit_valid = policy.spec.ratio_mask(executed, algo.ratio.unit)
        starts, counts = rollout.starts, rollout.decision_counts
        rewards_t = torch.as_tensor(rewards, dtype=torch.float32, device=self.device)

        # The update's data: the kept attempts, renumbered 0..A-1, their decisions concatenated.
        attempts = np.flatnonzero(np.repeat(keep_groups, algo.group_size))
        kept_counts = counts[attempts]
        kept_starts = np.concatenate([[0], np.cumsum(kept_counts)[:-1]]).astype(np.int64)
        kept_advantages, kept_rewards = advantages[attempts], rewards_t[attempts]
        metrics: dict[str, list[float]] = {}
        old_logp = ref_logp = None
        if len(attempts):
            kept_obs, kept_tokens, index = select_attempts(obs, tokens, starts, counts, attempts)
            kept_valid, kept_executed = unit_valid[index], executed[index]
            with torch.no_grad():
                if self.freeze_encoder:  # the encoder never changes: encode each frame once
                    kept_obs = policy.encode_frozen(kept_obs)
                old_logp = self._log_probs(policy, kept_obs, kept_tokens, kept_executed)
                # Without a KL penalty the reference is only watched, on a subsample of steps
                # (a full pass costs as much as a third of an update epoch on pixels).
                if algo.beta > 0:
                    ref_logp = self._log_probs(self.reference, kept_obs, kept_tokens,
                                               kept_executed)
            ppo = None
            if self.estimator == "vla_ppo":
                ppo = self._decision_targets(kept_obs, kept_counts, kept_rewards)
                metrics["explained_variance"] = [explained_variance(ppo[1], ppo[2])]
            data = (kept_obs, kept_tokens, kept_valid, kept_executed, kept_starts, kept_counts)
            self._epochs(data, old_logp, ref_logp, kept_advantages, kept_rewards, ppo, metrics)

        result = {f"train/{k}": float(np.mean(v)) for k, v in metrics.items()
                  if k != "early_stop"}
        if algo.target_kl is not None:
            result["train/early_stop"] = float(bool(metrics.get("early_stop")))
        if algo.critic.warmup_iterations:
            result["train/critic_warmup"] = float(self.warming_up)
        result.update({f"train/{k}": v for k, v in policy.exploration().items()})
        if old_logp is not None:
            result.update(self._diagnostics(kept_obs, valid[index], kept_tokens, old_logp,
                                            ref_logp, kept_valid, kept_executed))
        else:  # no group carried signal: nothing was evaluated, the KL is unknown
            result.update(self._diagnostics(obs, valid))
        self.updates_done += 1
        result.update({
            "train/advantage_mean": float(advantages.mean()),
            "train/advantage_std": float(advantages.std()) if len(advantages) > 1 else 0.0,
            "train/advantage_abs_max": float(advantages.abs().max()),
            "train/updated_attempts": float(len(attempts)),
            "train/gradient_steps": float(len(metrics.get("loss", []))),
        })
        return result

    def _epochs(self, data, old_logp, ref_logp, advantages, rewards, ppo,
                metrics: dict[str, list[float]]) -> None:
        """``num_iterations`` epochs of minibatch steps over the kept attempts ``data``; with
        ``algo.target_kl``, the epochs stop at the first minibatch whose KL(old || new) per unit
        passes it, before its step (as SB3's PPO)."""
        algo = self.algo
        attempts = len(data[5])
        for _ in range(algo.num_iterations):
            order = self.generator.permutation(attempts)
            for begin in range(0, attempts, algo.minibatch_size):
                chosen = np.sort(order[begin:begin + algo.minibatch_size])
                stats = self._step(data, chosen, old_logp, ref_logp, advantages, rewards, ppo)
                if stats is None:
                    metrics["early_stop"] = [1.0]
                    return
                for key, value in stats.items():
                    metrics.setdefault(key, []).append(float(value))

    @torch.no_grad()
    def _diagnostics(self, obs, valid, tokens=None, old_logp=None, ref_logp=None,
                     unit_valid=None, executed=None) -> dict[str, float]:
        """``train/entropy`` (per native unit) and ``train/kl_to_reference`` (k3 estimate of
        KL(sampling policy || reference) per ratio unit on the sampled records, and its sum
        over each decision's units, ``train/kl_to_reference_decision``; NaN without
        ``old_logp``), means over a subsample of decisions: they are diagnostics, and on pixels
        each evaluated frame costs as much as in the update itself."""
        stride = max(1, len(next(iter(obs.values()))) // DIAGNOSTIC_STEPS)
        sample, counted = {k: v[::stride] for k, v in obs.items()}, valid[::stride]
        entropy = self.policy.entropy(sample, self.algo.temperature)
        result = {"train/entropy": float(entropy[counted].mean()),
                  "train/kl_to_reference": float("nan")}
        if old_logp is not None:
            if ref_logp is None:
                ref_logp = self._log_probs(self.reference, sample, tokens[::stride],
                                           executed[::stride])
            else:
                ref_logp = ref_logp[::stride]
            units = unit_valid[::stride]
            kl = kl_k3(old_logp[::stride], ref_logp)
            result["train/kl_to_reference"] = float(kl[units].mean())
            result["train/kl_to_reference_decision"] = float((kl * units).sum(dim=1).mean())
        return result

    def _decision_targets(self, obs, counts: np.ndarray, rewards: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """vla_ppo's per-decision ``(advantages, old values, returns)``, each ``(N,)``.

        The verifier's reward comes at each attempt's last decision and the attempt ends there
        (it is scored once, at its end), so the value after it is 0; GAE (:func:`harness.
        objectives.gae`) runs over decisions with ``algo.gamma`` and ``algo.gae_lambda``.
        With ``normalize_advantages`` the advantages are standardised over the decisions.
        """
        algo, size = self.algo, len(next(iter(obs.values())))
        with torch.no_grad():
            values = torch.cat([self.critic.value({k: v[i:i + 1024] for k, v in obs.items()})
                                for i in range(0, size, 1024)]).float()
        lengths = torch.as_tensor(counts, device=self.device)
        rows = torch.repeat_interleave(torch.arange(len(counts), device=self.device), lengths)
        columns = torch.arange(size, device=self.device) - (torch.cumsum(lengths, 0)
                                                             - lengths)[rows]
        padded = values.new_zeros((len(counts), int(lengths.max())))
        per_decision = padded.clone()
        per_decision[torch.arange(len(counts)), lengths - 1] = rewards.float()
        padded[rows, columns] = values
        advantages, returns = gae(per_decision, padded, lengths, values.new_zeros(len(counts)),
                                  torch.ones(len(counts), dtype=torch.bool, device=self.device),
                                  algo.gamma, algo.gae_lambda)
        advantages, returns = advantages[rows, columns], returns[rows, columns]
        if algo.normalize_advantages and size > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return advantages, values, returns

    def _step(self, data, chosen, old_logp, ref_logp, advantages, rewards,
              ppo=None) -> dict[str, float] | None:
        """One gradient step on the attempts ``chosen`` (indices into ``data``'s starts and
        counts); ``ppo``: vla_ppo's per-decision targets (:meth:`_decision_targets`). ``None``
        when ``algo.target_kl`` stops the epochs before it."""
        algo, policy = self.algo, self.policy
        obs, tokens, valid, executed, starts, counts = data
        mb_obs, mb_tokens, index = select_attempts(obs, tokens, starts, counts, chosen)
        mb_counts, mb_valid = counts[chosen], valid[index]
        logp_pad, mask = attempt_tensor(
            self._unit_log_probs(policy, mb_obs, mb_tokens, executed[index]), mb_counts,
            mb_valid)
        old_pad, _ = attempt_tensor(old_logp[index], mb_counts, mb_valid)
        ref_pad = (None if ref_logp is None
                   else attempt_tensor(ref_logp[index], mb_counts, mb_valid)[0])
        weights = advantages[chosen]
        if ppo is not None:  # each decision's advantage on each of its units
            per_unit = ppo[0][index].unsqueeze(1).expand(-1, mb_valid.shape[1])
            weights = attempt_tensor(per_unit, mb_counts, mb_valid)[0]
        loss, stats = policy_loss(
            logp_pad, old_pad, weights, mask,
            clip_low=algo.clip_low, clip_high=algo.clip_high,
            aggregation=self.aggregation, max_tokens=self.max_tokens,
            ref_logp=ref_pad, beta=algo.beta,
        )
        if algo.target_kl is not None and stats["approx_kl"] > algo.target_kl:
            return None
        warming = self.warming_up
        if warming:  # the value network alone: its loss is all that moves it
            loss = loss * 0.0
        if self.anchor is not None and not warming:
            bc = self.anchor.loss(policy)
            loss = loss + algo.bc_coef * bc
            stats["bc_loss"] = float(bc.detach())
        if self.estimator == "critic":
            first = torch.as_tensor(starts[chosen], device=self.device)
            value = policy.value({k: v[first] for k, v in obs.items()})
            baseline_loss = torch.mean((value - rewards[chosen]) ** 2)
            loss = loss + 0.5 * baseline_loss
            stats["value_loss"] = float(baseline_loss.detach())
        if ppo is not None:
            _, old_values, returns = ppo
            values = self.critic.value(mb_obs)
            critic_loss = value_loss(values, old_values[index], returns[index],
                                     torch.ones_like(values), algo.vf_clip)
            loss = loss + algo.vf_coef * critic_loss
            stats["value_loss"] = float(critic_loss.detach())
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite policy loss ({float(loss)}) at a minibatch of "
                f"{len(chosen)} attempts; the last good checkpoint is kept"
            )
        self.optimizer.zero_grad()
        loss.backward()
        if warming:  # nothing but the value network steps
            for parameter in self._trainable:
                if id(parameter) not in self._critic_ids:
                    parameter.grad = None
        grad_norm = torch.nn.utils.clip_grad_norm_(self._trainable, algo.max_grad_norm)
        self.optimizer.step()
        stats["loss"] = float(loss.detach())
        stats["grad_norm"] = float(grad_norm)
        return stats

    def _unit_log_probs(self, policy, obs: dict[str, torch.Tensor], records: torch.Tensor,
                        executed: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``(B, U)`` of ``records`` at the sampling temperature, in the units
        of ``algo.ratio`` (:func:`harness.objectives.ratio_units`; the policy's own with
        ``native``)."""
        ratio, temperature = self.algo.ratio, self.algo.temperature
        if ratio.unit == "native":
            return policy.log_prob(obs, records, temperature)
        parts = policy.log_prob_parts(obs, records, temperature)
        return ratio_units(parts, executed, ratio.unit, ratio.normalize, ratio.clamp)

    def _log_probs(self, policy, obs: dict[str, torch.Tensor], tokens: torch.Tensor,
                   executed: torch.Tensor) -> torch.Tensor:
        """:meth:`_unit_log_probs` in chunks of 1,024 decisions."""
        size, chunk = len(tokens), 1024
        return torch.cat([
            self._unit_log_probs(policy, {k: v[i:i + chunk] for k, v in obs.items()},
                                 tokens[i:i + chunk], executed[i:i + chunk])
            for i in range(0, size, chunk)
        ])

    def state_dict(self) -> dict[str, Any]:
        state = {"policy": self.policy.state_dict(), "reference": self.reference.state_dict(),
                 "optimizer": self.optimizer.state_dict(),
                 "minibatch_rng": self.generator.bit_generator.state,
                 "updates_done": self.updates_done}
        if self.anchor is not None:
            state["bc_anchor"] = self.anchor.state_dict()
        if self.critic is not self.policy:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.reference.load_state_dict(state["reference"])
        if self.critic is not self.policy:
            if "critic" not in state:
                raise ValueError("the checkpoint holds no separate critic; resume with the "
                                 "algo.critic.network the run started with")
            self.critic.load_state_dict(state["critic"])
        if "minibatch_rng" in state:
            self.generator.bit_generator.state = state["minibatch_rng"]
        self.updates_done = int(state.get("updates_done", 0))
        if self.anchor is not None and "bc_anchor" in state:
            self.anchor.load_state_dict(state["bc_anchor"])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as error:  # Adam's state covers another set of parameters
            raise ValueError(
                f"the checkpoint's optimizer does not fit this run ({error}); resume with the "
                f"algo.freeze_encoder the run started with (now {self.freeze_encoder})"
            ) from error

