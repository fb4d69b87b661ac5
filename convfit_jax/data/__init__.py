"""Data for ConvFiT: intent sets and few-shot splits (`intent`), Stage 2 pairs
(`pairs`), conversational pairs and evaluation sets (`conversations`), fixed-shape
batching for jit (`batching`) and TFDS builders (`tfds_builders`, imported on demand).
"""
