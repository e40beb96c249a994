"""The control plane's HTTP API (FastAPI): `control_plane.api.app.create_app` and one module per resource."""
