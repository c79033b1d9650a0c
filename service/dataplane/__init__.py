"""The data plane: what a request does, transport-neutral, under every front end.

    classify.py   the classify call as one typed value, THE prologue, the textserve.v1 answer
    oip.py        the Open Inference Protocol: infer, readiness, metadata, config, statistics
    prologue.py   resolve (model, version), truncation, threshold: the rules every call shares
    observe.py    request observation (metrics, trace, access log) with its final code
    codes.py      the error taxonomy -> neutral code names (each codec maps them to its own)
    oip_codec.py, oip_describe.py   OIP tensors <-> texts and scores; a model's self-description
    context.py    ServingContext: repository, metrics, telemetry

gRPC (servicers/) and HTTP (http/) are sibling codecs over it: decode, call, encode, each with
its own status map and authentication. It imports neither grpc nor an HTTP server
(.importlinter keeps it so).
"""
