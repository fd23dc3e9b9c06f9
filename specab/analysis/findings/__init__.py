"""Findings: the doctor's rules, from an experiment's evidence and measures to sentences a user can act on."""
