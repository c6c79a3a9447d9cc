"""Training-log diagnosis: many ranks' logs in, one ordered list of findings out (diagnose.py runs the stages)."""
