"""Encoders and heads. New encoders (a cross-attention reranker, a convolutional
encoder) are new files here that return [batch, dim] sentence vectors."""
