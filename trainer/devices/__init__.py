"""What a device can do (capability, memory) and what a code path costs it (host syncs)."""
