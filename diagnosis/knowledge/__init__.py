"""Every data file checked against the others at start-up, and the checked knowledge cached per data version."""
