"""Hypothesis settings shared by the state-machine tests of a real mount."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings


def machine_settings(prefix: str, *, examples: int, steps: int) -> settings:
    """Each example mounts and unmounts. derandomize and no database: CI runs the same examples
    every time. To search harder, environment variables named by ``prefix``: PREFIX_EXAMPLES (more
    examples), PREFIX_STEPS (longer runs), PREFIX_RANDOM=1 (new examples each run),
    PREFIX_SHRINK=0 (report unshrunk)."""
    env = os.environ.get
    return settings(max_examples=int(env(f"{prefix}_EXAMPLES", examples)),
                    stateful_step_count=int(env(f"{prefix}_STEPS", steps)),
                    deadline=None, database=None,
                    derandomize=env(f"{prefix}_RANDOM") != "1",
                    phases=[p for p in Phase if p != Phase.shrink or env(f"{prefix}_SHRINK", "1") == "1"],
                    suppress_health_check=list(HealthCheck))
