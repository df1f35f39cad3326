"""Tables (the query layer), the results directory, findings and comparisons."""
