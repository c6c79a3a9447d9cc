"""Stage 1, input: hard-wrapped text rejoined, each line split into its message and who printed it."""
