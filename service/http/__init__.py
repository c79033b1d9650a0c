"""The HTTP front end, on the serving process's event loop beside grpc.aio: KServe v2 REST (with
Triton's binary tensor extension), POST /v1/classify, the probes and /metrics (docs/http.md)."""
