"""The server, imported as textserve.service: engine, repository, servicers, config, metrics."""

# One copy of each module: this folder is textserve.service (the wheel's package-dir, the
# checkout's textserve/service symlink). Imported as top-level `service` (the repository root on
# sys.path) it would be a second copy whose classes are not textserve.service's.
if __name__ != "textserve.service":
    raise ImportError(
        f"import textserve.service, not {__name__}: the service/ folder is the package "
        "textserve.service (see docs/architecture.md)"
    )
