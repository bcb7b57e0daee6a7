"""verl-recipe's SPIN under hybridflow (see ``main_spin.py``)."""
