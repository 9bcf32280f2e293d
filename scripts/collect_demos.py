"""Record scripted-expert demonstrations of a task into an HDF5 file (robomimic layout).

usage: python scripts/collect_demos.py [--task push] [--episodes 20] [--noise 0.0]
           [--obs-mode pixels_state] [--camera front] [--image-size 84] [--difficulty 0.0]
           [--seed 0] [--keep-failures] [--out data/demos/push.hdf5]

The default difficulty is 0: a pixel TinyVLA cloned from 20 push demos by
``scripts/pretrain_bc.py``'s defaults succeeded in 8 of 50 held-out episodes at difficulty 0, but
in none of 30 at difficulty 1, which would leave group fine-tuning no signal to work from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import tasks
from harness.demos import collect_demos


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="push", choices=sorted(tasks.TASKS))
    parser.add_argument("--episodes", type=int, default=20, help="demos to keep")
    parser.add_argument("--noise", type=float, default=0.0, help="std of the expert's noise")
    parser.add_argument("--obs-mode", default="pixels_state",
                        choices=("state", "pixels", "pixels_state"))
    parser.add_argument("--camera", default="front")
    parser.add_argument("--image-size", type=int, default=84)
    parser.add_argument("--difficulty", type=float, default=0.0)
    parser.add_argument("--max-episode-steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="reset seed of the first attempt")
    parser.add_argument("--keep-failures", action="store_true",
                        help="also record failed episodes (marked by their 'success' attribute)")
    parser.add_argument("--out", type=Path, default=Path("data/demos/push.hdf5"))
    args = parser.parse_args(argv)

    summary = collect_demos(
        args.out, args.task, args.episodes, noise=args.noise, obs_mode=args.obs_mode,
        camera=args.camera, image_size=args.image_size, difficulty=args.difficulty,
        seed=args.seed, only_successes=not args.keep_failures,
        max_episode_steps=args.max_episode_steps,
    )
    print(
        f"wrote {summary['episodes']} {args.task} demos ({summary['steps']} steps) to"
        f" {summary['path']}; the expert succeeded in {summary['expert_success_rate']:.0%} of"
        f" {summary['attempts']} attempts"
    )
    return summary


if __name__ == "__main__":
    main()
