"""``stager bench``: stager against the loaders users would otherwise use.

``methods`` reads one workload each way, ``sweep`` runs the scenarios and
computes the bound, ``report`` draws the plots and writes the table.
"""
