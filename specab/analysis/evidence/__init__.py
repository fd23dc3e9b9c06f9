"""Evidence in: what the runs recorded, read into the analysis data model."""
