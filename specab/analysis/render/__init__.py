"""Render: what a user reads (the report, the A/B round's table, the manifest diff)."""
