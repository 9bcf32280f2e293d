"""The base of every policy kind's config, and the fields the kinds share.

Each kind's config is a dataclass registered with the kind (:func:`harness.policies.
register_policy`): it is the ``policy`` node's schema in Hydra (so ``policy.hiden=64`` fails at
composition, naming the key) and what builds the policy, checked once in ``__post_init__`` with
the offending values in the message. Composing a config imports no torch: the checks that need a
head's class import it when the config is loaded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from harness.config.errors import ConfigError, check

FAMILIES: tuple[str, ...] = ("group", "sb3")
MAX_CHUNK = 256  # actions per decision
MAX_WIDTH = 8192  # a hidden layer, embedding or feature vector of these policies
MAX_ACTION_DIM = 64  # as harness.deploy
# Sizes that one option alone does not bound. A decision's logits or record are kept per sample
# in the rollout; no linear layer holds more than 1 GiB of float32 weights.
MAX_DECISION_VALUES = 65_536
MAX_LAYER = 2**28


def positive(key: str, value: Any, top: int) -> None:
    """Refuse, naming ``key``, anything but an int in ``[1, top]``.

    Raises:
        ConfigError: Naming the key, the value and the range.
    """
    check(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= top,
          f"{key}={value!r}; need an int in [1, {top}]")


def check_product(what: str, factors: Sequence[tuple[str, int]], top: int) -> None:
    """Refuse sizes whose product exceeds ``top``, naming each one (each already an int >= 1).

    Args:
        what: What the product counts (``"logits per decision"``).
        factors: ``(key, size)`` pairs, a key twice for a square.
        top: The largest product allowed.

    Raises:
        ConfigError: Naming every factor, the product and ``top``.
    """
    product = math.prod(size for _, size in factors)
    check(product <= top, " x ".join(f"{key}={size}" for key, size in factors)
          + f" = {product:,} {what}; need at most {top:,}")


@dataclass
class PolicyConfig:
    """Base of the ``policy`` group: a registered kind and the observations it reads.

    Subclasses set ``name``'s default to their kind, and the class attributes ``families``
    (which algorithm families train it: ``group``, ``sb3``) and ``reads`` (the observation key
    it needs).

    Attributes:
        name: The kind.
        use_instruction: Also read the instruction tokens.
    """

    families: ClassVar[tuple[str, ...]] = ("group",)
    reads: ClassVar[str] = "state"

    name: str = MISSING
    use_instruction: bool = False

    def __post_init__(self) -> None:
        from harness.policies.registry import policy_entry

        try:
            schema = policy_entry(self.name).config_class
        except ValueError as error:
            raise ConfigError(f"policy.name: {error}") from None
        # The base alone stands for "some policy" (a default before the group file is merged).
        check(type(self) is PolicyConfig or isinstance(self, schema),
              f"policy.name={self.name!r} with the {type(self).__name__} schema, which lacks "
              f"fields {self.name!r} reads; choose the network with policy={self.name}")

    def check_family(self, family: str, algo: str) -> None:
        """Refuse this policy under an algorithm of ``family``, or options that family would
        ignore, naming them.

        Raises:
            ConfigError: Naming the policy, the algorithm and what it cannot use.
        """
        trainable = [kind for kind in _kinds(family)]
        check(family in self.families,
              f"policy={self.name!r} cannot be trained by algo={algo!r}; {family} algorithms "
              f"take policy in {tuple(trainable)}")

    def check_device(self, device) -> None:
        """Refuse a device this policy cannot run on (``bfloat16`` where the device lacks it);
        every device suits most kinds."""

    @property
    def head_name(self) -> str | None:
        """The action head this config asks for (``policy/head``), or ``None`` for a kind whose
        head is its own (hf_vla's language-model head, smolvla's flow expert)."""
        return None

    def unfitted_warning(self) -> str | None:
        """What a fresh policy of this config misses without behaviour cloning (an input
        normalisation fitted on demos), or ``None``."""
        return None

    def to_saved(self) -> dict[str, Any]:
        """The config as plain values (what a saved policy holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def format1_values(cls, saved: dict[str, Any]) -> dict[str, Any]:
        """This kind's fields of a policy saved in format 1, when one config class held every
        kind's fields (``kind`` for the name; fields of other kinds dropped)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return {**{k: v for k, v in saved.items() if k in names}, "name": saved["kind"]}


def _kinds(family: str) -> tuple[str, ...]:
    from harness.policies.registry import policy_kinds

    return policy_kinds(family)


@dataclass
class ChunkFields:
    """Action chunks: one decision predicts ``chunk_size`` actions and plays ``execute_steps``.

    Attributes:
        chunk_size: ``H`` in ``[1, 256]``, actions one decision predicts (1: one per control
            step).
        execute_steps: ``k`` in ``[1, chunk_size]``, actions of each chunk played before the
            next decision; ``null`` plays the whole chunk (:mod:`harness.policies.chunks`).
        action_dim: ``A`` in ``[1, 64]``, dimensions of one action (the tasks' 4).
    """

    chunk_size: int = 1
    execute_steps: int | None = None
    action_dim: int = 4

    def check_chunk(self) -> None:
        """Raises: ConfigError: A chunk size out of range, or ``execute_steps`` outside
        ``[1, chunk_size]``, naming both."""
        positive("policy.chunk_size", self.chunk_size, MAX_CHUNK)
        positive("policy.action_dim", self.action_dim, MAX_ACTION_DIM)
        check(self.execute_steps is None or (
                  isinstance(self.execute_steps, int) and not isinstance(self.execute_steps, bool)
                  and 1 <= self.execute_steps <= self.chunk_size),
              f"policy.execute_steps={self.execute_steps!r} with chunk_size={self.chunk_size}; "
              "need an int in [1, chunk_size] (actions of each chunk played before the next "
              "decision), or null for the whole chunk")

    @property
    def steps_per_decision(self) -> int:
        """``k``: control steps each decision plays (``execute_steps``, else ``chunk_size``)."""
        return self.chunk_size if self.execute_steps is None else self.execute_steps


def tokens_head() -> dict[str, Any]:
    """The default ``policy.head``: the ``tokens`` head with its own defaults."""
    return {"name": "tokens"}


def check_head(head: Any) -> dict[str, Any]:
    """``policy.head`` checked against the registered head it names: every option known and
    valid (the head's ``Config``), the defaults filled in.

    Args:
        head: ``{"name": <head>, <option>: <value>, ...}``.

    Returns:
        ``{"name": <head>, **options}`` with every option of the head.

    Raises:
        ConfigError: No name, an unknown head or option, or a value the head refuses (naming
            it).
    """
    from harness.policies.registry import head_class

    head = dict(head or {})
    name = head.pop("name", None)
    check(isinstance(name, str), f"policy.head={head!r} names no head; set policy/head=<name> "
                                 "(tokens, gaussian, flow or a plugin's)")
    try:
        options = head_class(name).Config
    except ValueError as error:
        raise ConfigError(f"policy.head: {error}") from None
    known = [f.name for f in dataclasses.fields(options)]
    unknown = sorted(set(head) - set(known))
    check(not unknown, f"policy.head has options {unknown} that the {name!r} head does not "
                       f"take; its options are {known}")
    try:
        checked = options(**head)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"policy.head ({name}): {error}") from None
    return {"name": name, **dataclasses.asdict(checked)}


@dataclass
class HeadPolicyFields(ChunkFields):
    """The fields of the harness's own networks with an action head (``mlp``, ``tiny_vla``).

    Attributes:
        hidden: Width of the fused feature and the MLP layers, in ``[1, 8192]``.
        embed_dim: Width of the instruction embedding (and ``tiny_vla``'s proprio encoder), in
            ``[1, 8192]``.
        head: The action head and its options (``policy/head=tokens|gaussian|flow``, or a
            plugin's; ``harness.policies.heads``).
    """

    hidden: int = 128
    embed_dim: int = 32
    head: Any = field(default_factory=tokens_head)

    def check_head_fields(self) -> None:
        """Check the chunk, the widths and the head (filling in its defaults), and the sizes of
        the built-in heads that grow with the chunk: ``tokens``' logits (and the layer on the
        ``hidden`` feature that writes them), ``flow``'s record (its chain's steps)."""
        self.check_chunk()
        positive("policy.hidden", self.hidden, MAX_WIDTH)
        positive("policy.embed_dim", self.embed_dim, MAX_WIDTH)
        self.head = check_head(self.head)
        entries = [("policy.chunk_size", self.chunk_size), ("policy.action_dim", self.action_dim)]
        if self.head_name == "tokens":
            bins = ("policy.head.num_bins", self.head["num_bins"])
            check_product("logits per decision", [*entries, bins], MAX_DECISION_VALUES)
            check_product("weights in the tokens head's layer",
                          [("policy.hidden", self.hidden), *entries, bins], MAX_LAYER)
        elif self.head_name == "flow":
            check_product("denoising values in each decision's record",
                          [*entries, ("policy.head.steps", self.head["steps"])],
                          MAX_DECISION_VALUES)

    @classmethod
    def format1_values(cls, saved: dict[str, Any]) -> dict[str, Any]:
        """Format 1 kept the head's options beside the policy's (``action_head``,
        ``num_bins``, ``flow_steps``, ``flow_noise``, ``state_dependent_std``)."""
        values = super().format1_values(saved)
        head = saved.get("action_head", "tokens")
        options = {"tokens": {"num_bins": saved.get("num_bins", 11)},
                   "gaussian": {"state_dependent_std": saved.get("state_dependent_std", False)},
                   "flow": {"steps": saved.get("flow_steps", 4),
                            "noise": saved.get("flow_noise", "learned")}}.get(head, {})
        return {**values, "head": {"name": head, **options}}

    @property
    def head_name(self) -> str:
        """The action head's name."""
        return self.head["name"]

    def head_options(self) -> dict[str, Any]:
        """The head's keyword options."""
        return {k: v for k, v in self.head.items() if k != "name"}
