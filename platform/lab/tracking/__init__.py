"""Runs trained elsewhere (verl, slime, TRL, OpenRLHF, any MLflow client) as lab runs:
the MLflow tracking REST API, the frameworks' metric names mapped onto the lab's
keys, and TensorBoard event-file import (docs/integrations.md)."""
