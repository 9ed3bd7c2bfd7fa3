"""Gradient compression (DESIGN.md §8, docs/quant.md): randomized Hadamard rotations, EDEN (biased and
unbiased, any bit budget), DRIVE, TurboQuant baselines, and the versioned wire codec.

    buf = encode(x, "eden-unbiased", 2)   # bytes; any shape, float16/32/64
    x_hat = decode(buf)                   # same shape and dtype; CodecError on a bad buffer
"""

from .codec import SCHEMES, CodecError, decode, encode, parse

__all__ = ["SCHEMES", "CodecError", "decode", "encode", "parse"]
