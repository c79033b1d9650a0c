"""The gRPC front ends: textserve.v1 Classifier and the Open Inference Protocol (inference)."""
