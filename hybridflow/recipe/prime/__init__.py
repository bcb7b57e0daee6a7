"""verl-recipe's PRIME under hybridflow (see ``main_prime.py``)."""
