"""The vocabulary every diagnosis pipeline shares: actions, findings, PCI ids, log stamps, line scanning, data files."""
