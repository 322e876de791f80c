"""Running one run: the RL loop, its step, its files and guards, checkpoints,
the supervised warm start and held-out evaluation.

The run folder's files (``files``), its guards (``guard``) and the warm-start
progress (``warmstart_progress``) are torch-free: the platform imports them
(docs/design.md 1.1). Everything else here loads torch.
"""
