"""Layers the harness's own networks (mlp, tiny_vla) are built from: the instruction encoder, the
spatial softmax and
the keypoints an instruction chooses."""

from __future__ import annotations

import torch
from torch import nn

from tasks.language import CORE_SIZE, PAD, VOCAB_SIZE

# The seed of the embedding rows of the suites' words (tasks.language.SUITE_WORDS).
SUITE_ROWS_SEED = 0


def _suite_rows(embed_dim: int) -> torch.Tensor:
    """The embedding rows of the suites' words: ``N(0, 1)`` from :data:`SUITE_ROWS_SEED`."""
    generator = torch.Generator().manual_seed(SUITE_ROWS_SEED)
    return torch.randn(VOCAB_SIZE - CORE_SIZE, embed_dim, generator=generator)


class InstructionEncoder(nn.Module):
    """Mean of the token embeddings over non-pad tokens; all-pad gives zeros.

    The rows of our tasks' words (:data:`tasks.language.CORE_VOCAB`) are drawn from the global
    generator exactly as an ``nn.Embedding`` of that size draws them, and the suites' words'
    rows from a fixed seed, so that adding the suites changed no run on our tasks; a state dict
    saved before the suites' words existed loads with those rows filled the same way.
    """

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        core = nn.Embedding(CORE_SIZE, embed_dim, padding_idx=PAD)  # the global generator
        self.embedding = nn.Embedding(VOCAB_SIZE, embed_dim, padding_idx=PAD,
                                      _weight=torch.cat([core.weight.detach(),
                                                         _suite_rows(embed_dim)]))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "embedding.weight"
        weight = state_dict.get(key)
        if weight is not None and weight.ndim == 2 and weight.shape[0] == CORE_SIZE:
            state_dict[key] = torch.cat([weight, _suite_rows(weight.shape[1]).to(weight)])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, instruction: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` int64 token ids -> ``(B, embed_dim)``."""
        valid = (instruction != PAD).unsqueeze(-1).to(torch.float32)  # (B, L, 1)
        summed = (self.embedding(instruction) * valid).sum(dim=1)
        return summed / valid.sum(dim=1).clamp(min=1.0)


class SpatialSoftmax(nn.Module):
    """Feature map ``(B, C, H, W)`` -> ``(B, 2C)`` expected ``(x, y)`` in ``[-1, 1]`` per channel.

    Each channel's map is turned into a distribution over positions by a softmax (with one
    learned temperature), and the expected coordinates are the keypoint of that channel (Levine
    et al. 2016, "End-to-end training of deep visuomotor policies"). Unlike pooling it keeps the
    sub-cell position of what a channel detects, which is what reaching and pushing need.
    """

    def __init__(self) -> None:
        super().__init__()
        self.log_temperature = nn.Parameter(torch.zeros(()))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, 2C)``: all x coordinates, then all y coordinates."""
        _, _, height, width = features.shape
        weights = torch.softmax(
            features.flatten(2) / self.log_temperature.exp(), dim=-1
        ).view_as(features)  # (B, C, H, W), each channel sums to 1
        xs = torch.linspace(-1.0, 1.0, width, device=features.device, dtype=features.dtype)
        ys = torch.linspace(-1.0, 1.0, height, device=features.device, dtype=features.dtype)
        expected_x = (weights.sum(dim=2) * xs).sum(dim=-1)  # (B, C)
        expected_y = (weights.sum(dim=3) * ys).sum(dim=-1)  # (B, C)
        return torch.cat([expected_x, expected_y], dim=-1)


class InstructionKeypoints(nn.Module):
    """Keypoints chosen by the instruction: ``(B, 2C)`` keypoints + ``(B, E)`` -> ``(B, 2Q)``.

    Picking "the red cube" among keypoints of every colour is a product of the words and the
    image, which a concatenation fused by an MLP learns poorly from a few demos. Each of the
    ``Q`` queries is a softmax over the ``C`` channels computed from the instruction embedding,
    and its keypoint is the weighted average of the channels' keypoints (soft attention over
    keypoints).

    Args:
        embed_dim: Width ``E`` of the instruction embedding.
        channels: ``C``, keypoints of the spatial softmax.
        queries: ``Q``, keypoints to choose.
    """

    def __init__(self, embed_dim: int, channels: int, queries: int) -> None:
        super().__init__()
        self.queries, self.channels = queries, channels
        self.query = nn.Linear(embed_dim, queries * channels)

    def forward(self, keypoints: torch.Tensor, instruction: torch.Tensor) -> torch.Tensor:
        """``(B, 2C)`` keypoints (all x, then all y) and ``(B, E)`` instruction embedding ->
        ``(B, 2Q)``: each chosen keypoint's ``(x, y)``, in ``[-1, 1]`` as the inputs."""
        # No len(): an exported graph would keep the batch size it was traced with.
        xy = keypoints.view(-1, 2, self.channels)  # (B, 2, C)
        logits = self.query(instruction).view(-1, self.queries, self.channels)  # (B, Q, C)
        weights = torch.softmax(logits, dim=-1)  # each query sums to 1 over the channels
        return torch.einsum("bqc,bdc->bqd", weights, xy).flatten(1)
