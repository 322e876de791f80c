"""Model-independent building blocks of the stabilizers.

* ``replay``: routing-replay warm-up mask, compact storage of recorded routing,
  router-anchoring KL buffer.
* ``temperature``: router temperature controller (the noisy top-k gating it
  interacts with is part of the router: ``trainer.model.noisy_gating``).
* ``expert_clip``: per-expert gradient clipping of stacked expert weights.
* ``surgery_step``: gradient surgery between the policy and routing losses in
  one backward step.

Each works on plain tensors or modules; the model and the RL loop call them.
"""
