"""The training-log rules (data/training_rules.yaml): their model, their regexes checked, loaded and checked."""
