"""Configs the platform tests submit (a module, not conftest: test files import it)."""

# A config the real trainer finishes in seconds on a CPU.
TINY_OVERRIDES = {
    "run.steps": 3,
    "run.threads": 1,
    "run.checkpoint_every": 1,
    "warm_start.max_steps": 2,
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
}
