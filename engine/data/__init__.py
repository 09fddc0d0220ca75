"""Training data: codec codes, sequence layout, dataset."""
