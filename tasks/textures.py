"""Scene parts that domain randomisation needs built into the model: procedural textures on the
table and the floor, and extra lights.

They are added only when the randomisation block asks for them (``textures``, a ``light_count``
above the scene's two lights), so a default scene is the very model it always was. The textures
are drawn once, from a fixed seed, when the model is built; :class:`tasks.randomization.
DomainRandomizer` then picks one of them, and a tiling scale, for each surface at every reset
(switching textures is a model parameter, so no texture is uploaded to the renderer again).
"""

from __future__ import annotations

import mujoco
import numpy as np

from tasks.randomization import RandomizationConfig

TEXTURE_COUNT = 8
TEXTURE_SEED = 20_261_130
TEXTURE_SIZE = 64
SURFACES = ("table", "floor")
NOMINAL_LIGHTS = 2  # tasks.scene.add_lights


def procedural_texture(rng: np.random.Generator, size: int = TEXTURE_SIZE) -> np.ndarray:
    """One ``(size, size, 3)`` uint8 texture: a checker, stripes, a gradient or smooth noise,
    in two random colours.

    Args:
        rng: Where the pattern and its colours come from.
        size: Side in texels.
    """
    a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    y, x = np.mgrid[0:size, 0:size] / size
    kind = int(rng.integers(4))
    if kind == 0:  # checker
        cells = int(rng.integers(2, 9))
        mix = ((np.floor(x * cells) + np.floor(y * cells)) % 2).astype(float)
    elif kind == 1:  # stripes at a random angle
        angle, period = rng.uniform(0, np.pi), rng.uniform(0.05, 0.3)
        mix = (np.sin((x * np.cos(angle) + y * np.sin(angle)) * 2 * np.pi / period) > 0) * 1.0
    elif kind == 2:  # gradient
        angle = rng.uniform(0, 2 * np.pi)
        mix = x * np.cos(angle) + y * np.sin(angle)
        mix = (mix - mix.min()) / max(np.ptp(mix), 1e-9)
    else:  # smooth noise: coarse random values, bilinearly upsampled
        coarse = rng.uniform(0, 1, (9, 9))
        grid = np.linspace(0, 8, size)
        rows = np.array([np.interp(grid, np.arange(9), row) for row in coarse])
        mix = np.array([np.interp(grid, np.arange(9), column) for column in rows.T]).T
    texture = a[None, None] * (1 - mix[..., None]) + b[None, None] * mix[..., None]
    return texture.astype(np.uint8)


def add_randomization_parts(spec: mujoco.MjSpec, config: RandomizationConfig) -> None:
    """Add what ``config`` needs built: textures (and a material on each surface) and lights.

    Textures are named ``random_texture_<i>`` and materials ``random_<surface>``, the names the
    randomiser looks for; extra lights ``random_light_<i>`` start switched off.
    """
    if not config.enabled:
        return
    if config.textures:
        # The same textures in every process; each set draws its own (set 1 holds textures
        # that no run on set 0 has seen: a held-out visual domain).
        rng = np.random.default_rng(TEXTURE_SEED + config.texture_set)
        for i in range(TEXTURE_COUNT):
            texture = spec.add_texture(name=f"random_texture_{i}",
                                       type=mujoco.mjtTexture.mjTEXTURE_2D,
                                       width=TEXTURE_SIZE, height=TEXTURE_SIZE, nchannel=3)
            texture.data = procedural_texture(rng).tobytes()
        roles = [""] * int(mujoco.mjtTextureRole.mjNTEXROLE)
        roles[int(mujoco.mjtTextureRole.mjTEXROLE_RGB)] = "random_texture_0"
        for surface in SURFACES:
            material = spec.add_material(name=f"random_{surface}")
            material.textures = roles
            spec.geom(surface).material = material.name
    if config.light_count is not None:
        for i in range(NOMINAL_LIGHTS, config.light_count[1]):
            angle = 2 * np.pi * i / config.light_count[1]
            position = np.array([0.6 * np.cos(angle), 0.6 * np.sin(angle), 1.1])
            spec.worldbody.add_light(name=f"random_light_{i}", pos=position, dir=-position,
                                     diffuse=[0.4, 0.4, 0.4], castshadow=False, active=False)
