"""Data preparation where the data lives: the ``DataPreparation`` construct (a Processing job over several
instances, started by a state machine of its own), its job request and its IAM."""
