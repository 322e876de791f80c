"""Pure-tensor RL formulas: advantages, policy/value losses, importance-sampling
corrections, load-balancing losses and gradient surgery. No model, no I/O."""
