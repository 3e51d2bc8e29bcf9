"""Stubs generated from ``../protos/inference.proto`` by ``python -m service.grpc.codegen``; do not edit."""
