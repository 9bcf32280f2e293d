"""Camera frames to an mp4 and back, with the ffmpeg that imageio-ffmpeg ships.

Frames are H.264 (libx264), every second frame a key frame (``-g 2``, LeRobot's choice, so a
loader seeking to any timestamp decodes at most one extra frame) and no B-frames, so each
frame's presentation time is ``index / fps``. H.264 rather than LeRobot's default AV1: every
ffmpeg build and video library decodes it, it encodes fast, and SVT-AV1 (LeRobot's AV1 encoder)
crashes on frames as small as 16x16. The chroma is kept whole (``yuv444p``) by default because
our frames are small: subsampled chroma (``yuv420p``) smears a 5-pixel coloured cube into the
table, and on 84x84 push frames its mean error is 1.7 levels with edge pixels off by up to 170,
against 0.6 and 54 for ``yuv444p`` at the same quality (``CRF``); ``yuv420p`` remains for players
that only take it (web browsers), and needs even sides.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

CODEC = "libx264"
CODEC_NAME = "h264"  # what a reader's probe reports (``video.codec`` in info.json)
PIX_FMTS: tuple[str, ...] = ("yuv444p", "yuv420p")
CRF = 10  # x264's constant rate factor: 0 is lossless, 23 its default
GOP = 2


def check_pix_fmt(pix_fmt: str, height: int, width: int) -> None:
    """Raise ``ValueError`` unless ``pix_fmt`` can hold ``height x width`` frames."""
    if pix_fmt not in PIX_FMTS:
        raise ValueError(f"pix_fmt={pix_fmt!r}; choose one of {PIX_FMTS}")
    if pix_fmt == "yuv420p" and (height % 2 or width % 2):
        raise ValueError(f"pix_fmt='yuv420p' needs even frame sides; the frames are "
                         f"{height}x{width} (use pix_fmt='yuv444p')")


def encode_video(path: str | os.PathLike, frames: Iterable[np.ndarray], fps: int,
                 pix_fmt: str = "yuv444p") -> int:
    """Encode RGB frames into an mp4 at ``path`` (the caller makes the write atomic).

    Args:
        path: The mp4 file.
        frames: ``(H, W, 3)`` uint8 frames, all of one size.
        fps: Frames per second: frame ``i`` is shown at ``i / fps`` seconds.
        pix_fmt: One of :data:`PIX_FMTS`.

    Returns:
        The number of frames written.

    Raises:
        ValueError: No frames, frames of different sizes, or a bad ``pix_fmt``.
    """
    frames = iter(frames)
    first = next(frames, None)
    if first is None:
        raise ValueError(f"no frames to encode into {path}")
    height, width = first.shape[:2]
    check_pix_fmt(pix_fmt, height, width)
    import imageio_ffmpeg  # here: importing harness.config needs no ffmpeg

    writer = imageio_ffmpeg.write_frames(
        str(path), (width, height), fps=fps, codec=CODEC, pix_fmt_out=pix_fmt, quality=None,
        macro_block_size=1, ffmpeg_log_level="error",
        output_params=["-crf", str(CRF), "-g", str(GOP), "-bf", "0"],
    )
    writer.send(None)
    count = 0
    try:
        for frame in (first, *frames):
            if frame.shape != first.shape:
                raise ValueError(f"frame {count} has shape {frame.shape}; the first had "
                                 f"{first.shape}")
            writer.send(np.ascontiguousarray(frame, dtype=np.uint8))
            count += 1
    finally:
        writer.close()
    return count


def decode_video(path: str | os.PathLike) -> np.ndarray:
    """Every frame of a video file as ``(N, H, W, 3)`` uint8 RGB, in presentation order.

    Raises:
        ValueError: ffmpeg cannot read the file.
    """
    import imageio_ffmpeg

    try:
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
        width, height = next(reader)["size"]
        frames = [np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader]
    except (OSError, RuntimeError, StopIteration) as error:
        raise ValueError(f"cannot decode the video {path}: {error}") from None
    if not frames:
        raise ValueError(f"the video {path} holds no frames")
    return np.stack(frames)
