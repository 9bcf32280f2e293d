"""Behaviour-clone a token policy on demonstrations, save it, and report its held-out success.

usage: python scripts/pretrain_bc.py [--demos data/demos/push.hdf5] [--policy tiny_vla|mlp]
           [--num-bins 11] [--epochs 250] [--lr 3e-3] [--batch-size 32] [--no-augment]
           [--eval-episodes 50] [--seed 0] [--out outputs/bc/push_tiny_vla.pt]

The policy is sized from the observation space of the environment the demos were recorded in
(``env_args`` of the demo file) and evaluated there on reset seeds ``10_000 + seed`` onwards,
which collection (seeds from 0) does not reach with fewer than 10,000 attempts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from harness.bc import evaluate_policy, pretrain_bc
from harness.demos import load_demos, rebuild_env
from harness.policies import KINDS, TokenPolicyConfig, make, save_policy
from harness.runs import atomic_write_text

HELD_OUT_SEED_OFFSET = 10_000


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demos", type=Path, default=Path("data/demos/push.hdf5"))
    parser.add_argument("--policy", default="tiny_vla", choices=KINDS)
    parser.add_argument("--num-bins", type=int, default=11)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=250)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--no-augment", action="store_true", help="no random shifts of pixels")
    parser.add_argument("--eval-episodes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, default=Path("outputs/bc/push_tiny_vla.pt"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    demos = load_demos(args.demos)
    env = rebuild_env(demos.env_args)
    config = TokenPolicyConfig(kind=args.policy, num_bins=args.num_bins, hidden=args.hidden)
    policy = make(config, env.observation_space)
    print(f"{args.policy} policy, {sum(p.numel() for p in policy.parameters()):,} parameters;"
          f" {demos.num_episodes} demos, {len(demos)} steps from {args.demos}")

    metrics = pretrain_bc(
        policy, demos, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
        seed=args.seed, augment=not args.no_augment, val_fraction=args.val_fraction,
    )
    save_policy(args.out, policy)
    print(f"trained {args.epochs} epochs in {metrics['bc/seconds']:.0f} s: train loss"
          f" {metrics['bc/train_loss']:.3f}, val loss {metrics['bc/val_loss']:.3f}, val token"
          f" accuracy {metrics['bc/val_accuracy']:.1%}; saved {args.out}")

    start = time.perf_counter()
    result = evaluate_policy(policy, env, args.eval_episodes,
                             seed=HELD_OUT_SEED_OFFSET + args.seed)
    env.close()
    print(f"held-out success {result['eval/success_rate']:.1%}"
          f" (95% CI {result['eval/success_low']:.1%}-{result['eval/success_high']:.1%}) over"
          f" {args.eval_episodes} episodes, mean length {result['eval/mean_length']:.1f}"
          f" ({time.perf_counter() - start:.0f} s)")
    summary = {key: value for key, value in metrics.items() if key != "history"} | result
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
