"""Benchmarks: each compares two ways or two sizes in one run and prints the ratios.

Output is a few aligned `print` lines, read once by a person and quoted in notes: a table
or progress-bar library (rich, tabulate, tqdm) would add nothing to that. The wait loops in
here poll a server the benchmark itself started until it answers; they are not retries.
"""
