"""Rollout: changing a pool's model or engine safely (the capacity-regression gate; the comparison of a candidate
with its baseline that the gate and canaries share)."""
