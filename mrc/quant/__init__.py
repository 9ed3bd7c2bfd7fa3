"""Gradient compression (docs/design.md §8, docs/quant.md): randomized Hadamard rotations, EDEN (biased and
unbiased, any bit budget), DRIVE, TurboQuant baselines, and the versioned wire codec.

    buf = encode(x, "eden-unbiased", 2)   # bytes; any shape, float16/32/64
    x_hat = decode(buf)                   # same shape and dtype; CodecError on a bad buffer
    x_hat = decode(buf, dtype=np.float32) # a float16 frame's reconstruction, unclipped

Never a non-finite output: float16 frames saturate at ±65504 with a QuantRangeWarning (docs/quant.md §6).
"""

from .codec import (
    SCHEMES,
    CodecError,
    CodecTypeError,
    CodecValueError,
    QuantRangeWarning,
    decode,
    encode,
    parse,
)

__all__ = ["SCHEMES", "CodecError", "CodecTypeError", "CodecValueError", "QuantRangeWarning", "decode",
           "encode", "parse"]
