"""Stage 1: per-client CNN features, fixed-point encoded and randomized, written as HDF5.

Importing this package is light; TensorFlow loads only inside the functions that train or predict.
"""
