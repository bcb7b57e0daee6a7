"""Entry points at the module paths of verl's recipes (the verl-recipe repository, ``recipe.<name>.*``), for the
recipes hybridflow implements: ``python -m hybridflow.recipe.<name>.<module>`` runs what ``python -m
recipe.<name>.<module>`` runs in verl (docs/migrating-from-verl.md lists them)."""
