"""Gradient compression (DESIGN.md §8): randomized Hadamard rotations, EDEN, DRIVE, TurboQuant, codec."""
