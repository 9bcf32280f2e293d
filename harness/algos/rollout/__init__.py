"""The rollout core: attempts played from snapshots (:mod:`~harness.algos.rollout.core`), by
worker processes or Ray actors (:mod:`~harness.algos.rollout.workers`), each with a policy copy
(:mod:`~harness.algos.rollout.engine`, :mod:`~harness.algos.rollout.pools`) or driven by one
batched policy in the learner (:mod:`~harness.algos.rollout.batched`); what crosses a process
boundary is a named record (:mod:`~harness.algos.rollout.records`)."""
