"""verl's ``verl.experimental`` import paths (agent loops; one-step-off and fully async training)."""
