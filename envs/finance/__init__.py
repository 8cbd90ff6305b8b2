"""The `finance` family: PDF annual reports, FinQA-style programs (docs/finance.md)."""

from palaestra.envs.finance.family import FinanceFamily, FinanceSettings

__all__ = ["FinanceFamily", "FinanceSettings"]
