"""What every camera of a task sees: one PNG row per moment of a scripted-expert episode.

usage: python studies/camera_views.py [--task push [pick_place ...]] [--cameras front wrist]
                                      [--size 168] [--seed 0] [--difficulty 1.0]
                                      [--moments 0 20 40] [--out outputs/camera_views_push.png]

Columns are the task's cameras in model order (``front``, ``side``, ``overhead``, ``wrist``, and
``goal``, ``goal_side`` in tasks with a goal marker), or those of ``--cameras``, rendered as the
learning pipeline renders them (no shadows); rows are the expert's state after each of
``--moments`` control steps, one block of rows per task of ``--task``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import tasks


def camera_grid(task: str, size: int, seed: int, difficulty: float, moments: list[int],
                cameras: list[str] | None = None) -> tuple[np.ndarray, tuple[str, ...]]:
    """The ``(rows * size, cameras * size, 3)`` image and the camera names of its columns
    (``cameras``, or every camera of the task in model order)."""
    if any(m < 0 for m in moments) or moments != sorted(moments):
        raise ValueError(f"moments={moments}; expected increasing step counts >= 0")
    env = tasks.make(task)
    base = env.unwrapped
    names = tuple(cameras) if cameras else base.camera_names
    unknown = [name for name in names if name not in base.camera_names]
    if unknown:
        env.close()
        raise ValueError(f"cameras={list(names)}: {unknown} not among {task}'s cameras "
                         f"{base.camera_names}")
    expert = tasks.ScriptedExpert(env)
    env.reset(seed=seed, options={"difficulty": difficulty})
    rows, step, done = [], 0, False
    for moment in moments:
        while step < moment and not done:  # after the episode ends, later rows repeat its end
            _, _, terminated, truncated, _ = env.step(expert())
            step += 1
            done = terminated or truncated
        rows.append(np.concatenate([base.render_camera(name, size) for name in names], axis=1))
    env.close()
    return np.concatenate(rows, axis=0), names


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", nargs="+", default=["push"], choices=sorted(tasks.TASKS))
    parser.add_argument("--cameras", nargs="+", default=None,
                        help="the columns (default: every camera of the task)")
    parser.add_argument("--size", type=int, default=168)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--difficulty", type=float, default=1.0)
    parser.add_argument("--moments", type=int, nargs="+", default=[0, 20, 40])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    grids = [camera_grid(task, args.size, args.seed, args.difficulty, args.moments,
                         args.cameras) for task in args.task]
    names = grids[0][1]
    if any(other != names for _, other in grids):
        raise SystemExit(f"the tasks {args.task} have different cameras; pick common ones "
                         "with --cameras")
    image = np.concatenate([grid for grid, _ in grids], axis=0)
    out = args.out or Path(f"outputs/camera_views_{'_'.join(args.task)}.png")
    out.parent.mkdir(parents=True, exist_ok=True)

    import imageio.v3 as iio

    iio.imwrite(out, image)
    print(f"wrote {out}: columns {', '.join(names)}; rows after steps {args.moments} "
          f"({', '.join(args.task)})")
    return out


if __name__ == "__main__":
    main()
