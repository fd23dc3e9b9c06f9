"""specab: controlled A/B experiments for speculative decoding on GPU inference servers."""

__version__ = "0.1.0"
