"""Engines that run attention: a small protocol, numpy and ONNX implementations, and dispatch."""
