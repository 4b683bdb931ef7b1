"""The reference reader lives in tests/support/reference.py, shared by the fuzz tests and the
tests that read back what tfrfs wrote; this name stays so ``from reference import ...`` (the fuzz
tests, scripts/fuzz) keeps working."""

from support.reference import *  # noqa: F401,F403
