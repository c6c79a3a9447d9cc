"""Stage 2, scan: which lines deserve a look (every signature over every line) and what each says."""
