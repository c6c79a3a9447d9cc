"""The XID path: the kernel log and the driver's events in, merged and journaled events out."""
