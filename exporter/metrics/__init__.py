"""What /metrics says: metric families built from the snapshot and the journal, rendered once per change."""
