"""A held-out emulated server for benchmarks/guided_vs_grid.py (``--emulated held-out``): a cost model that no test
and no tuning of the guided plan used (tests/helpers/cost_model.py has the two the tests use). Keep it out of
tests/ and do not tune the planner on it: it exists to check that the plan's savings and choices are not an
artefact of the models it was developed on.

Step time, ms, of a verify step of b sequences at num_steps K is a roofline, not the tests' linear sum: the verify
pass takes ``max(compute, memory)`` with ``compute = 0.12 * b * (K + 1)`` (tokens verified) and
``memory = 7.0 + 0.03 * b`` (weights and KV read once), the draft ``K * (0.6 + 0.015 * b)``; every step is
multiplied by ``1 + 0.05 * N(0, 1)`` (seeded), a server whose step time scatters by 5%. Conditional acceptance of
draft position i: 0.75, 0.6, 0.5, 0.4, 0.35 (the last repeats). The choice moves from K=3 at concurrency 1 to K=2
near 16 and K=0 at 64.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

__all__ = ["HELD_OUT", "HELD_OUT_2", "HELD_OUT_3", "HELD_OUT_4", "HELD_OUT_5", "LaunchBoundModel", "PaddedModel",
           "QuadraticModel", "RooflineModel", "TiledModel"]


@dataclass(frozen=True)
class RooflineModel:
    """Duck-types tests/helpers/cost_model.py's ``CostModel`` for its ``EmulatedServers`` (``step_s``,
    ``accept_at``, ``acceptance_length``, ``name``)."""

    name: str = "held-out roofline"
    accept: tuple[float, ...] = (0.75, 0.6, 0.5, 0.4, 0.35)
    noise: float = 0.05
    rng: random.Random = field(default_factory=lambda: random.Random(11), compare=False)

    @property
    def step_noise(self) -> float:
        """Relative standard deviation of one step's time (tests/helpers/cost_model.py ``virtual_point`` averages
        it over a window's steps)."""
        return self.noise

    def expected_step_s(self, batch: int, steps: int) -> float:
        """Mean seconds of one verify step of ``batch`` sequences at num_steps ``steps`` (module docstring), without
        the step noise."""
        b, k = max(batch, 1), steps
        verify = max(0.12 * b * (k + 1), 7.0 + 0.03 * b)
        draft = k * (0.6 + 0.015 * b)
        return (verify + draft) / 1000.0

    def step_s(self, batch: int, steps: int) -> float:
        """Seconds of one verify step of ``batch`` sequences at num_steps ``steps``: the mean times ``1 + noise *
        N(0, 1)`` (module docstring), at least 0.1 ms."""
        return max(0.0001, self.expected_step_s(batch, steps) * (1 + self.noise * self.rng.gauss(0.0, 1.0)))

    def accept_at(self, i: int) -> float:
        return self.accept[min(i, len(self.accept) - 1)]

    def acceptance_length(self, steps: int) -> float:
        """Expected tokens per verify step at num_steps ``steps``."""
        total, run = 1.0, 1.0
        for i in range(steps):
            run *= self.accept_at(i)
            total += run
        return total


HELD_OUT = RooflineModel()


@dataclass(frozen=True)
class QuadraticModel(RooflineModel):
    """The second held-out model (``--emulated held-out-2``), like the first kept out of the tests: the step time of a
    verify step, ms, grows with the square of the batch (attention over every sequence's KV cache, ``0.0009 * b^2 * (K +
    1)``) on top of ``5.0 + 0.04 * b``, and each of the K draft steps costs ``0.9 + 0.02 * b``; every step scatters by
    3%; conditional acceptance 0.82, 0.66, 0.55, 0.45, 0.38 (the last repeats)."""

    name: str = "held-out quadratic"
    accept: tuple[float, ...] = (0.82, 0.66, 0.55, 0.45, 0.38)
    noise: float = 0.03
    rng: random.Random = field(default_factory=lambda: random.Random(23), compare=False)

    def expected_step_s(self, batch: int, steps: int) -> float:
        """Mean seconds of one verify step of ``batch`` sequences at num_steps ``steps`` (class docstring)."""
        b, k = max(batch, 1), steps
        return (5.0 + 0.04 * b + 0.0009 * b * b * (k + 1) + k * (0.9 + 0.02 * b)) / 1000.0


HELD_OUT_2 = QuadraticModel()


@dataclass(frozen=True)
class PaddedModel(RooflineModel):
    """The third held-out model (``--emulated held-out-3``), kept out of the tests: the verify pass runs a captured
    graph padded to the next power of two of the tokens it verifies, ``b * (K + 1)``, and costs ``5.0 + 0.06 * padded``
    ms; each of the K draft steps costs ``0.7 + 0.012 * b``; every step scatters by 4%; conditional acceptance 0.78,
    0.62, 0.5, 0.42, 0.36 (the last repeats)."""

    name: str = "held-out padded"
    accept: tuple[float, ...] = (0.78, 0.62, 0.5, 0.42, 0.36)
    noise: float = 0.04
    rng: random.Random = field(default_factory=lambda: random.Random(37), compare=False)

    def expected_step_s(self, batch: int, steps: int) -> float:
        """Mean seconds of one verify step of ``batch`` sequences at num_steps ``steps`` (class docstring)."""
        b, k = max(batch, 1), steps
        padded = 1 << max(b * (k + 1) - 1, 0).bit_length()
        return (5.0 + 0.06 * padded + k * (0.7 + 0.012 * b)) / 1000.0


HELD_OUT_3 = PaddedModel()


@dataclass(frozen=True)
class LaunchBoundModel(RooflineModel):
    """The fourth held-out model (``--emulated held-out-4``), kept out of the tests and of the tuning of the guided
    plan's early stop (docs/sweep.md, "Savings per grid shape", the launch-bound rows): each of the K draft steps is
    launch-bound at small batch, ``max(0.8, 0.025 * b)`` ms; the verify pass costs ``5.0 + 0.02 * b + 0.035 * b * (K +
    1)^1.5`` ms (tree attention over the drafted tokens growing faster than their count); a scheduler step adds ``0.4 *
    log2(1 + b)`` ms; every step scatters by 4%; conditional acceptance 0.8, 0.62, 0.5, 0.42, 0.38 (the last
    repeats)."""

    name: str = "held-out launch-bound"
    accept: tuple[float, ...] = (0.8, 0.62, 0.5, 0.42, 0.38)
    noise: float = 0.04
    rng: random.Random = field(default_factory=lambda: random.Random(53), compare=False)

    def expected_step_s(self, batch: int, steps: int) -> float:
        """Mean seconds of one verify step of ``batch`` sequences at num_steps ``steps`` (class docstring)."""
        b, k = max(batch, 1), steps
        verify = 5.0 + 0.02 * b + 0.035 * b * (k + 1) ** 1.5
        draft = k * max(0.8, 0.025 * b)
        return (verify + draft + 0.4 * math.log2(1 + b)) / 1000.0


HELD_OUT_4 = LaunchBoundModel()


@dataclass(frozen=True)
class TiledModel(RooflineModel):
    """The fifth held-out model (``--emulated held-out-5``), committed before it was first run and never used to change
    the guided plan (docs/sweep.md, "Savings per grid shape", the tiled rows): the verify pass runs its b (K + 1) tokens
    in tiles of 16, ``max(6.0 + 0.025 * b, 1.6 * ceil(b * (K + 1) / 16))`` ms (memory-bound below a tile count, then a
    step per tile: the choice falls from num_steps 3 at concurrency 16 to 1 at 32); each of the K draft steps costs
    ``0.5 + 0.02 * b``; a scheduler step adds ``0.3 + 0.01 * b`` ms; every step scatters by 5%; conditional acceptance
    0.88, 0.7, 0.48, 0.33, 0.25 (the last repeats: a draft good at its first tokens and poor past its third)."""

    name: str = "held-out tiled"
    accept: tuple[float, ...] = (0.88, 0.7, 0.48, 0.33, 0.25)
    noise: float = 0.05
    rng: random.Random = field(default_factory=lambda: random.Random(71), compare=False)

    def expected_step_s(self, batch: int, steps: int) -> float:
        """Mean seconds of one verify step of ``batch`` sequences at num_steps ``steps`` (class docstring)."""
        b, k = max(batch, 1), steps
        verify = max(6.0 + 0.025 * b, 1.6 * math.ceil(b * (k + 1) / 16))
        return (verify + k * (0.5 + 0.02 * b) + 0.3 + 0.01 * b) / 1000.0


HELD_OUT_5 = TiledModel()
