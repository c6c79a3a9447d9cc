"""Stage 3, findings: repeats collapsed, deaths settled, kernel XIDs judged, root cause first, shared ones folded."""
