"""RSSM unroll ops: `observe` (filtering, prior + posterior) and `imagine` (prior rollout, open
loop or with a policy in the loop); signatures in `reference.py`, the fused op in `fused/`."""
