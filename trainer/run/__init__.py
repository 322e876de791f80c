"""Running one run: the RL loop, its step, checkpoints, the supervised warm
start, held-out evaluation, the device record and the export of a finished
run's checkpoint.

The run folder's files, guards and warm-start progress are the contract below
the loop (``trainer.run_folder``); everything here loads torch.
"""
