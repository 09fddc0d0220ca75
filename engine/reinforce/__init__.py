"""The reinforce stage (issue 33): GRPO after fine-tuning, rewarded by the clone's scores.

Above `quality` (its rewards are the evaluation's measures) and above `train | synth`
(its rollouts are renders by the engine's decoder, its update a step of the training
objective). `rollout`: renders sampled from the policy and laid out for scoring;
`stage`: one process's loop of GRPO iterations. The pieces of the objective itself
(log-probabilities, advantage, clipped loss) live in `engine.train.grpo`.
"""
