"""Shared test settings: tests run on the CPU and are deterministic (fixed seeds)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
