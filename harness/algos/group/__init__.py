"""The group-relative fine-tuner (GRPO, Dr. GRPO, RLOO, critic baseline, REINFORCE, vla_ppo):
the run (:mod:`~harness.algos.group.run`), its update rule (:mod:`~harness.algos.group.update`),
how an iteration's groups are drawn and scored (:mod:`~harness.algos.group.collect`,
:mod:`~harness.algos.group.start_states`), the summary of the start against the end
(:mod:`~harness.algos.group.summary`) and the checkpoint format
(:mod:`~harness.algos.group.checkpoints`)."""
