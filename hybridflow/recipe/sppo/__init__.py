"""verl-recipe's SPPO under hybridflow (see ``main_sppo.py``)."""
