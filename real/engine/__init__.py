"""Pure-PyTorch real engine: device-side pieces of the speculative-decoding step."""
